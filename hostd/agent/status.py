"""The agent's status file, ``RUN_DIR/status.json``: what ``hostd status`` reads.

``StatusFile.write`` replaces it atomically (a reader never sees half a file) after every full
pass and, when counters changed, at most once a second otherwise (the loop asks ``due``).
``document`` says what it holds: the agent's state, mode, policy, event source, per-layer
CPUs and thread counts, the last full pass, counters, journal size, knobs the kernel refused
for good, the watch's state, what the host allows, and the agent's own cost (CPU seconds and
resident memory, from psutil). The agent (``Agent.write_status``) hands it each of these, and
the documents its parts make of themselves (``doc()``), never itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from hostd import __version__
from hostd.reconcile import PassReport
from hostd.statedir import open_dir, write_atomic

if TYPE_CHECKING:
    from hostd.agent.incremental import Incremental
    from hostd.agent.sources import Sources
    from hostd.agent.state import AgentState
    from hostd.doctor import Capabilities
    from hostd.journal import Journal

STATUS_FILE = "status.json"
EVERY_S = 1.0  # at most this often between full passes


def read_status(run_dir: str | Path) -> dict | None:
    try:
        with open(Path(run_dir) / STATUS_FILE, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def document(
    report: PassReport,
    elapsed: float | None,
    state: str,
    agent: AgentState,
    inc: Incremental,
    sources: Sources,
    journal: Journal,
    caps: Capabilities,
    *,
    sidecar: bool,
    passes: int,
    counters: Counter[str],
    unchangeable: set[str],
    last: dict,
    preempt: dict,
    event_lag: dict,
    layer_stats: dict,
    attempts: dict,
    sizing: dict | None,
    metrics: str | None,
) -> dict:
    """The agent's status after ``report`` (``elapsed``: a full pass's seconds; ``last``: the
    document written before; the rest: the parts' own documents)."""
    layers = []
    if inc.plan is not None and state == "running":
        counts = inc.layer_counts
        layers = [
            {
                "name": lp.name,
                "kind": lp.kind,
                "threads": counts[lp.name],
                "cpus": sorted(lp.cpus),
                "notes": list(lp.notes),
            }
            for lp in inc.plan.layers
        ]
    status = {
        "version": __version__,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "state": state,
        "mode": agent.mode,
        "policy": {
            "source": agent.policy.source,
            "name": agent.policy.name,
            "sha256": agent.policy.sha256,
        },
        "source": {"kind": sources.kind, "detail": sources.detail},
        "sidecar": sidecar,
        "layers": layers,
        "last_pass": last.get("last_pass", {}),
        "passes": passes,
        "events": dict(counters),
        "journal": {"path": str(journal.path), "records": len(journal)},
        "unchangeable": sorted(unchangeable),
        "preempt": preempt,
        "self": own_cost(),
        "event_lag": event_lag,
        "layer_stats": layer_stats,
        "attempts": attempts,
        "sizing": sizing,
        "metrics": metrics,
        "capabilities": {
            "rt": caps.rt,
            "cpuset": caps.cpuset,
            "irqs": caps.irqs,
            "cpufreq": caps.cpufreq,
        },
    }
    if elapsed is not None:
        status["last_pass"] = {
            "time": time.time(),
            "seconds": round(elapsed, 4),
            "counts": report.counts,
        }
    return status


def own_cost() -> dict:
    """The agent's own CPU seconds (user + system, its threads together) and resident memory."""
    me = psutil.Process()
    with me.oneshot():
        cpu, mem = me.cpu_times(), me.memory_info()
    return {"cpu_seconds": round(cpu.user + cpu.system, 3), "rss_bytes": mem.rss}


class StatusFile:
    """``RUN_DIR/status.json``, and when it was last written."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.last: dict = {}
        self.written = 0.0  # monotonic time of the last write
        self.counters: Counter[str] = Counter()  # the agent's counters it said
        self.forced = False  # written when due even if no counter changed
        self._fd: int | None = None

    @property
    def due(self) -> float:
        """When the next write between full passes may happen (monotonic time)."""
        return self.written + EVERY_S

    def due_now(self) -> None:
        """Written at the loop's next quiet moment (not within an event pass: a rename can take
        milliseconds on a disk, and events wait meanwhile)."""
        self.written, self.forced = 0.0, True

    def write(self, status: dict, counters: Counter[str]) -> None:
        self.last, self.counters, self.forced = status, counters.copy(), False
        self.written = time.monotonic()
        if self._fd is None:
            self._fd = open_dir(self.run_dir)
        write_atomic(self._fd, STATUS_FILE, json.dumps(status, indent=1).encode())

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

"""The agent's record of job attempts (``STATE_DIR/attempts/*.json``), for ``hostd report``.

``LayerStats.sample`` hands every classified thread's change since the last sample to
``Attempts.add``; ``Attempts.close`` then adds, per live attempt (``hostd.model.attempts``), one
sample: per layer its threads' CPU seconds, run-queue wait seconds, timeslices and thread count,
its GPUs' utilisation (NVML) and the throughput the job reports (``HOSTD_THROUGHPUT_FILE``,
read only as ``Host.job_file`` allows: the job's user's own file, changed in the last minute).
Its file is rewritten whole after its first samples, then at most once a minute (a crash loses
at most that), and when it ends: an attempt seen in no sample is over, and its ``end`` is written.

An attempt is its user's: the environment that names it is the user's to write, so processes
of another uid with the same names make a record of their own (``uid`` in the record and the
metrics). A record says whether the attempt was **protected**: hostd enforced its policy and the
attempt's threads were in a layer that protects (real-time, a negative nice, a heavier session,
preemption). Bounded: at most ``MAX_SAMPLES`` samples per record (then neighbours are merged,
halving the resolution), at most ``PER_USER`` records of one user (when one more of theirs
begins, theirs written longest ago go: one user's many short jobs never evict another user's
history) and ``MAX_FILES`` in all (then the user with the most loses their oldest), at most
``LIVE_PER_USER`` live attempts of one user in memory (more are not recorded, and said so once),
at most ``MAX_LABELLED`` attempts labelled in the metrics (the rest are counted under
``training_job="other"``).
A thread is counted from its first sample (the kernel's counters run from its start); one that
lived between two samples is not seen. It reads through the host door and the agent's
``TaskCache``, with the policy, classifier and mode in force (``AgentState``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hostd.model.attempts import SCHEMA, Identity, attempt_of, halve, parse_throughput
from hostd.model.tasks import Task
from hostd.statedir import UnsafeDir, open_dir, write_atomic

if TYPE_CHECKING:
    from hostd.agent.state import AgentState
    from hostd.host import Host
    from hostd.tasks import TaskCache

log = logging.getLogger("hostd")
MAX_SAMPLES = 2048
MAX_FILES = 1024
PER_USER = 128
LIVE_PER_USER = 16
MAX_LABELLED = 8
STALE_S = 60.0  # a throughput file older than this says nothing
WRITE_EVERY_S = 60.0  # a live record's file is rewritten at most this often (and at its end)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_OWNER = re.compile(r"u(\d+)-")  # a record's file name starts with its user's uid


@dataclass
class Live:
    """One attempt being recorded."""

    ident: Identity
    name: str  # its file's name
    record: dict
    protected_seen: bool = False
    pids: set[int] = field(default_factory=set)
    # this sample: layer -> [cpu s, wait s, timeslices, threads]
    acc: dict[str, list] = field(default_factory=dict)
    minors: set[int] = field(default_factory=set)
    throughput: tuple[int, str] | None = None  # (pid, path) of a throughput file
    written: float = 0.0  # when its file was last written (time.time())
    cpu_total: float = 0.0  # seconds, over the record
    wait_total: float = 0.0


class Attempts:
    def __init__(self, host: Host, cache: TaskCache, state: AgentState, folder: Path) -> None:
        self.host, self.cache, self.state, self.folder = host, cache, state, folder
        # (uid, attempt) -> its record: the environment that names an attempt is the user's to
        # write, so one user's processes never join another user's attempt
        self.live: dict[tuple[int, str], Live] = {}
        self._full: set[int] = set()  # users told their live attempts are at LIVE_PER_USER
        self._fd: int | None = None
        self._who: dict[tuple[int, int], Identity | None] = {}  # process -> its attempt
        self.broken = ""  # why records cannot be written ("" while they can)
        self._seen: set[tuple[int, str]] = set()  # attempts seen in this sample

    def begin(self) -> None:
        for item in self.live.values():
            item.acc = {}
            item.pids = set()
        self._seen = set()

    def identity(self, task: Task) -> Identity | None:
        proc = task.process
        key = (proc.pid, proc.start_time)
        if key not in self._who:
            # the rank's command line names the job, the same for all that runs below it
            job = proc.job
            rank = self.cache.procs.get(job.rank_pid) if job and job.rank_pid else None
            self._who[key] = attempt_of(
                job, dict(proc.env), proc.cgroup, proc.cmdline,
                rank_cmdline=rank.cmdline if rank is not None else None,
            )  # fmt: skip
        return self._who[key]

    def add(self, task: Task, layer: str, d_run: int, d_wait: int, d_slices: int) -> None:
        """One thread's change over this sample (ns on a CPU, ns waiting, timeslices)."""
        ident = self.identity(task)
        if ident is None:
            return
        key = (task.uid, ident.attempt)
        item = self.live.get(key)
        if item is None:
            if sum(1 for uid, _ in self.live if uid == task.uid) >= LIVE_PER_USER:
                if task.uid not in self._full:
                    self._full.add(task.uid)
                    log.warning(
                        "attempts: uid %d has %d live attempts; more of theirs are not recorded",
                        task.uid, LIVE_PER_USER,
                    )  # fmt: skip
                return
            item = self._open(key, ident, task)
        self._seen.add(key)
        acc = item.acc.setdefault(layer, [0.0, 0.0, 0, 0])
        acc[0] += d_run / 1e9
        acc[1] += d_wait / 1e9
        acc[2] += d_slices
        acc[3] += 1
        proc = task.process
        if proc.pid not in item.pids:
            item.pids.add(proc.pid)
            item.minors.update(proc.nvidia_minors)
            path = dict(proc.env).get("HOSTD_THROUGHPUT_FILE")
            if path and item.throughput is None:
                item.throughput = (proc.pid, path)
        if layer in self.state.classifier.protects and self.state.mode == "enforce":
            item.protected_seen = True

    def close(self, seconds: float) -> None:
        """The end of a sample that covered ``seconds``: one sample more in every live record,
        and the end of those not seen."""
        now = time.time()
        util: dict[int, float] | None = None  # asked once, the first time a GPU is found
        for key, item in list(self.live.items()):
            rec = item.record
            if key not in self._seen:
                rec["end"] = rec["samples"][-1]["t"] if rec["samples"] else now
                self._write(item)
                del self.live[key]
                log.info("attempt over job=%r attempt=%r", rec["job"], rec["attempt"])
                continue
            rec["protected"] = rec["protected"] or item.protected_seen
            if item.protected_seen:
                rec["why"] = "hostd enforced its policy; its threads were in protecting layers"
            rec["gpus"] = self._gpus(item)
            if rec["gpus"] and util is None:
                util = self._gpu_utilization()
            used = [util[g["index"]] for g in rec["gpus"] if util and g["index"] in util]
            sample = {
                "t": round(now, 3),
                "seconds": round(seconds, 3),
                "layers": {
                    layer: {
                        "cpu_seconds": round(a[0], 6),
                        "wait_seconds": round(a[1], 6),
                        "timeslices": a[2],
                        "threads": a[3],
                    }
                    for layer, a in sorted(item.acc.items())
                },
                "gpu_utilization": round(sum(used) / len(used), 4) if used else None,
                "throughput": self._throughput(item, now),
            }
            item.cpu_total += sum(a[0] for a in item.acc.values())
            item.wait_total += sum(a[1] for a in item.acc.values())
            rec["samples"].append(sample)
            if len(rec["samples"]) > MAX_SAMPLES:
                rec["samples"] = halve(rec["samples"])
            if len(rec["samples"]) <= 2 or now - item.written >= WRITE_EVERY_S:
                self._write(item)
        alive = {(p.pid, p.start_time) for p in self.cache.procs.values()}
        self._who = {k: v for k, v in self._who.items() if k in alive}

    def _open(self, key: tuple[int, str], ident: Identity, task: Task) -> Live:
        state = self.state
        why = state.classifier.unwanted(task) or (
            "hostd only observed (mode = observe)" if state.mode != "enforce" else
            "its threads were in no protecting layer"
        )  # fmt: skip
        pol = state.policy
        record = {
            "schema": SCHEMA,
            "job": ident.job,
            "attempt": ident.attempt,
            "source": ident.source,
            "uid": key[0],
            "host": socket.gethostname(),
            "protected": False,
            "why": why,
            "policy": {"name": pol.name, "sha256": pol.sha256},
            "mode": state.mode,
            "start": round(time.time(), 3),
            "end": None,
            "ranks": 0,
            "gpus": [],
            "throughput_unit": None,
            "samples": [],
        }
        stem = _SAFE.sub("_", ident.job)[:48] or "job"
        digest = hashlib.sha256(f"{key}\0{record['start']}".encode()).hexdigest()[:12]
        item = Live(ident, f"u{key[0]}-{stem}-{digest}.json", record)
        self.live[key] = item
        log.info("attempt job=%r attempt=%r source=%s", ident.job, ident.attempt, ident.source)
        return item

    def _gpus(self, item: Live) -> list[dict]:
        """The attempt's GPUs (the /dev/nvidiaN its processes hold, and NVML's list of GPU
        processes), labelled as NVIDIA's DCGM exporter labels them."""
        nvml, _ = self.host.nvml()
        by_minor = {g.minor: g for g in (nvml.gpus if nvml else ())}
        if nvml:
            by_index = {g.index: g.minor for g in nvml.gpus}
            item.minors.update(
                m for pid, index in nvml.processes
                if pid in item.pids and (m := by_index.get(index)) is not None
            )  # fmt: skip
        minors = item.minors
        out = []
        for minor in sorted(minors):
            g = by_minor.get(minor)
            out.append({
                "index": g.index if g else minor,
                "gpu": str(g.index if g else minor),
                "UUID": g.uuid if g else "",
                "device": f"nvidia{minor}",
                "modelName": g.name if g else "",
            })  # fmt: skip
        return out

    def _gpu_utilization(self) -> dict[int, float]:
        try:
            return self.host.gpu_utilization()
        except Exception:  # NVML's failures are many; a missing value is no fault
            return {}

    def _throughput(self, item: Live, now: float) -> float | None:
        if item.throughput is None:
            return None
        pid, path = item.throughput
        got = self.host.job_file(pid, path)
        if got is None or now - got[1] > STALE_S:
            return None
        parsed = parse_throughput(got[0])
        if parsed is None:
            return None
        if parsed[1]:
            item.record["throughput_unit"] = parsed[1]
        return parsed[0]

    def _write(self, item: Live) -> None:
        first, item.written = not item.written, time.time()
        item.record["ranks"] = max(item.record["ranks"], self._ranks(item))
        if self.broken:
            return
        try:
            if self._fd is None:
                self._fd = open_dir(self.folder, 0o700)
            if first:
                self._prune(item.record["uid"])  # one record more: room for it
            write_atomic(self._fd, item.name, json.dumps(item.record).encode(), 0o600)
        except (OSError, UnsafeDir) as exc:
            self.broken = str(exc)
            log.warning("attempts: cannot record in %s: %s", self.folder, exc)

    def _ranks(self, item: Live) -> int:
        procs = self.cache.procs
        return sum(
            1 for pid in item.pids
            if (p := procs.get(pid)) is not None and p.job is not None and p.job.role == "rank"
        )  # fmt: skip

    def _prune(self, uid: int) -> None:
        """Room for one more record of user ``uid``: theirs written longest ago go beyond
        ``PER_USER - 1``; beyond ``MAX_FILES - 1`` in all, the oldest of whoever has most."""
        assert self._fd is not None
        by_user: dict[int, list[tuple[float, str]]] = {}
        for name in os.listdir(self._fd):
            if not name.endswith(".json"):
                continue
            m = _OWNER.match(name)
            with contextlib.suppress(OSError):
                when = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mtime
                by_user.setdefault(int(m[1]) if m else -1, []).append((when, name))
        for files in by_user.values():
            files.sort()
        doomed = by_user.get(uid, [])[: max(0, len(by_user.get(uid, [])) - PER_USER + 1)]
        del by_user.get(uid, [])[: len(doomed)]
        while sum(map(len, by_user.values())) >= MAX_FILES:
            most = max(by_user.values(), key=len)
            doomed.append(most.pop(0))
        for _, name in doomed:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._fd)

    def doc(self) -> dict:
        """The live attempts, for the status document and the metrics: at most
        ``MAX_LABELLED`` by name, the CPU and wait of the others together under ``other``."""
        items = list(self.live.values())
        shown, rest = items[:MAX_LABELLED], items[MAX_LABELLED:]
        live = []
        for item in shown:
            rec = item.record
            last = rec["samples"][-1] if rec["samples"] else {}
            live.append({
                "job": rec["job"],
                "attempt": rec["attempt"],
                "uid": rec["uid"],
                "source": rec["source"],
                "protected": rec["protected"],
                "start": rec["start"],
                "gpus": [{k: g[k] for k in ("gpu", "UUID", "device", "modelName")}
                         for g in rec["gpus"]],
                "throughput": last.get("throughput"),
                "throughput_unit": rec["throughput_unit"],
                "gpu_utilization": last.get("gpu_utilization"),
                "cpu_seconds": round(item.cpu_total, 6),
                "wait_seconds": round(item.wait_total, 6),
            })  # fmt: skip
        return {
            "live": live,
            "other": {
                "attempts": len(rest),
                "cpu_seconds": round(sum(i.cpu_total for i in rest), 6),
                "wait_seconds": round(sum(i.wait_total for i in rest), 6),
            },
            "folder": str(self.folder),
            "problem": self.broken or None,
        }

    def stop(self) -> None:
        """The agent stops: write what the live records have (their ``end`` stays unknown)."""
        for item in self.live.values():
            self._write(item)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

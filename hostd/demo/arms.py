"""The demo itself (``demo``): the four arms (``ARMS``), each one run of the stand-in job
(``run_job``) with its contention and agent around it (``_Arm``), and their rows; the per-layer
summary of a sample (``layer_summary``, shared with the benchmarks)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from hostd.demo.agentproc import HOSTD, AgentProc
from hostd.demo.job import calibrate
from hostd.demo.processes import Contention, kill_session


def layer_summary(stats) -> dict[str, dict[str, float]]:
    """Per layer of a ``hostd.stats.Stats``: threads, CPU/s, wait share, involuntary switches/s."""
    return {
        ls.layer: {
            "threads": ls.threads,
            "cpu": round(ls.rates.cpu, 3),
            "wait_share": round(ls.rates.wait_share, 3),
            "wait_ms_per_s": round(ls.rates.wait * 1000, 1),
            "invol_per_s": round(ls.rates.involuntary_per_s, 1),
        }
        for ls in stats.layers
    }


# -- the demo ----------------------------------------------------------------------------------
ARMS = ("alone", "contended", "contended + hostd, share only", "contended + hostd")


def share_only(policy: bytes) -> bytes:
    """The default policy with preemption off (``[preempt] enabled = false``)."""
    table = b"\n[preempt]\n"
    if table in policy:
        return policy.replace(table, table + b"enabled = false\n", 1)
    return policy + table + b"enabled = false\n"


def run_job(
    ranks: int, warmup: float, seconds: float, step: int, batch: int, on_start=None
) -> dict:
    """Run the stand-in job once. ``on_start(launcher_pid)`` runs first, while the job runs
    uncounted (it sets the arm up); the job then warms up for ``warmup`` s and counts steps for
    ``seconds`` s."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    proc = subprocess.Popen(
        [*HOSTD[:2], "hostd.demo", "launcher", str(ranks), str(warmup), str(seconds),
         str(step), str(batch), str(w), str(go_r)],
        pass_fds=(w, go_r), start_new_session=True,
    )  # fmt: skip
    os.close(w)
    os.close(go_r)
    try:
        if on_start is not None:
            on_start(proc.pid)
        with contextlib.suppress(OSError):  # BrokenPipe: the job already failed; read why
            os.write(go_w, b"g")
        with os.fdopen(r) as fh:
            line = fh.readline()
        proc.wait(timeout=30)
        return json.loads(line) if line else {"error": "the job printed nothing"}
    finally:
        os.close(go_w)
        kill_session(proc)


class _Arm:
    """One arm of the demo: contention and the agent around one run of the job."""

    def __init__(self, name: str, workdir: Path, hogs: int, sample_at: float, window: float):
        self.name, self.workdir = name, workdir
        self.contention = Contention(hogs) if name != "alone" else None
        self.agent: AgentProc | None = None
        self.sample_at, self.window = sample_at, window
        self.stats: list = []
        self.sampler: threading.Thread | None = None

    def started(self, launcher: int) -> None:
        """The job is up: start the agent (scoped to the job and the contention) and wait for
        its first pass; then start the statistics sampler (the job counts from here, after its
        warm-up)."""
        if "hostd" in self.name:
            policy = None
            if self.name.endswith("share only"):
                from hostd.policy import default_policy_bytes

                policy = self.workdir / "share-only.toml"
                policy.write_bytes(share_only(default_policy_bytes()))
                policy.chmod(0o600)
            scope = [launcher] + ([self.contention.proc.pid] if self.contention else [])
            self.agent = AgentProc(
                self.workdir / "agent", policy=policy and str(policy), scope=scope
            )
            self.agent.wait_passes(1)
        self.sampler = threading.Thread(target=self._sample, args=(launcher,), daemon=True)
        self.sampler.start()

    def _sample(self, launcher: int) -> None:
        from hostd.host import Host
        from hostd.policy import load_default
        from hostd.stats import measure

        time.sleep(self.sample_at)
        try:
            self.stats.append(measure(Host(), load_default(), self.window, scope=[launcher]))
        except Exception as exc:  # reported in the row, never a crash of the demo
            self.stats.append(exc)

    def layers(self) -> tuple[dict, str | None]:
        """The sampled per-layer summary, or {} and why there is none."""
        if self.sampler is not None:
            self.sampler.join(timeout=self.window + 30)
        if not self.stats:
            return {}, "no sample was taken"
        if isinstance(self.stats[0], Exception):
            return {}, f"sampling failed: {self.stats[0]}"
        return layer_summary(self.stats[0]), None

    def demoted(self) -> int:
        """How many sessions the agent demoted in this arm."""
        if self.agent is None:
            return 0
        return (self.agent.status().get("preempt") or {}).get("counts", {}).get("demotions", 0)

    def stop(self) -> str:
        log = self.agent.stop() if self.agent is not None else ""
        if self.contention is not None:
            self.contention.stop()
        return log


def demo(seconds: float, ranks: int, say) -> list[dict]:
    """Run the four arms; ``say(text)`` reports progress. Returns one row per arm."""
    step, batch = calibrate(20), calibrate(4)
    warmup = 2.0
    hogs = 2 * len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="hostd-demo-") as tmp:
        for name in ARMS:
            say(f"{name}: {seconds:g} s ...")
            arm = _Arm(name, Path(tmp), hogs, warmup + seconds / 4, seconds / 2)
            try:
                result = run_job(ranks, warmup, seconds, step, batch, on_start=arm.started)
                layers, sample_error = arm.layers()
                demoted = arm.demoted()
            finally:
                log = arm.stop()
            if " ERROR " in log:
                say(log)
            time.sleep(0.2)
            rows.append(
                {
                    "arm": name,
                    "steps_per_s": result.get("steps_per_s"),
                    "error": result.get("error"),
                    "contention": f"{hogs} x {arm.contention.tool}" if arm.contention else "",
                    "layers": layers,
                    "sample_error": sample_error,
                    "demoted_sessions": demoted,
                }
            )
    return rows

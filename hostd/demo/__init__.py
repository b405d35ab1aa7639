"""``hostd demo``: a one-minute version of the trainer benchmark, with nothing to install.

It runs a stand-in training job four times: alone, under CPU contention, under the same
contention with ``hostd run`` on the embedded default policy with preemption switched off
(``[preempt] enabled = false``: the ranks' session weight and weighted comm threads only), and
with the default policy as shipped (the contention's session is demoted: SCHED_IDLE, session
nice 19); the agent is scoped to the job and the contention. Then it prints steps/s relative to
the job alone and, per arm, which layers of the job waited for a CPU (``hostd.stats``).
Everything it starts is killed and the agent restores what it changed when the demo ends, on an
error and on Ctrl-C (the agent's own SIGTERM path).

The stand-in job is a process tree shaped and named like ``torchrun`` running PyTorch DDP
(FACTS.md): a launcher renamed ``pt_elastic`` with a (here idle) ``pt_tcpstore_uv`` thread;
ranks started each in a session of its own (as torchrun does), whose main thread computes a
"step" (pure-Python arithmetic) on a "batch" from its ``pt_data_worker`` process and then waits
for the other ranks through a ``gloo_tcp_loop`` thread; the ranks talk to each other directly,
as gloo's do, and rank 0 counts the steps.
The real benchmark, ``bench/trainer/run.py``, runs PyTorch itself and imports the helpers
below (``Contention``, ``AgentProc``, ``layer_summary``).

Roles run as ``python -m hostd.demo ROLE ...`` child processes and use the standard library
only, so they start in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from hostd.host import Host, paths

HOSTD = [sys.executable, "-m", "hostd"]
JOB_LAYERS = ("trainer", "comms", "data")


def rename(name: str) -> None:
    """Set the calling thread's comm (what ``ps -L`` and hostd's comm predicates see)."""
    Host().write(paths.task("self", threading.get_native_id(), "comm"), name)


def busy(iterations: int) -> int:
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    return acc


def calibrate(ms: float) -> int:
    """Iterations of ``busy`` that take about ``ms`` milliseconds on this CPU, now."""
    n = 20_000
    while True:
        t = time.perf_counter()
        busy(n)
        took = time.perf_counter() - t
        if took > 0.02:
            return max(1, int(n * ms / 1000 / took))
        n *= 2


# -- the stand-in job's roles ----------------------------------------------------------------
def _launcher(
    ranks: int, warmup: float, seconds: float, step: int, batch: int, out: int, go: int
) -> None:
    """Start the ranks, connected as gloo connects them (to each other, not through the
    launcher), and wait for them. Rank 0 starts counting ``warmup`` s after a byte arrives on
    ``go`` (the arm is ready) and writes the result to ``out``."""
    rename("pt_elastic")
    threading.Thread(
        target=lambda: (rename("pt_tcpstore_uv"), time.sleep(1e9)), daemon=True
    ).start()
    pairs = [socket.socketpair() for _ in range(ranks - 1)]
    procs = []
    for r in range(ranks):
        fds = [a.fileno() for a, _ in pairs] if r == 0 else [pairs[r - 1][1].fileno()]
        extra = [str(warmup), str(seconds), str(out), str(go)] if r == 0 else []
        procs.append(
            subprocess.Popen(
                [
                    *HOSTD[:2],
                    "hostd.demo",
                    "rank",
                    str(step),
                    str(batch),
                    ",".join(map(str, fds)),
                    *extra,
                ],
                pass_fds=(*fds, out, go) if r == 0 else tuple(fds),
                start_new_session=True,  # torchrun starts each rank in a session of its own
                # and gives it its rank (torch.distributed.elastic): hostd knows a rank by it
                env={
                    **os.environ,
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(ranks),
                    "TORCHELASTIC_RUN_ID": "hostd-demo",
                },
            )
        )
    for a, b in pairs:
        a.close()
        b.close()
    for p in procs:
        p.wait()


def _rank(step: int, batch: int, fds: str, timing: list[str]) -> None:
    """A rank: a step of CPU work on each batch from its DataLoader worker, then an all-reduce
    through its comm thread (rank 0 gathers the others and decides when to stop)."""
    peers = [socket.socket(fileno=int(fd)) for fd in fds.split(",") if fd]
    req_r, req_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the DataLoader worker: one batch of CPU work per request
        rename("pt_data_worker")
        os.close(req_w)
        os.close(got_r)
        while os.read(req_r, 1):
            busy(batch)
            os.write(got_w, b"b")
        os._exit(0)
    os.close(req_r)
    os.close(got_w)
    os.write(req_w, b"rr")  # two batches in flight, as DataLoader's prefetch
    ask: queue.SimpleQueue = queue.SimpleQueue()
    answer: queue.SimpleQueue = queue.SimpleQueue()
    result: dict = {}

    def gather() -> bytes:  # rank 0: every peer's step, then the verdict for all
        for s in peers:
            if not s.recv(1):
                result["error"] = "a rank exited"
                return b""
        now = time.monotonic()
        ready = result.get("go")
        if result.get("counted_at") is None and ready is not None and now >= ready + warmup:
            result.update(counted_at=now, steps=0)
        elif result.get("counted_at") is not None:
            result["steps"] += 1
        stop = result.get("counted_at") is not None and now >= result["counted_at"] + seconds
        result["now"] = now
        verdict = b"x" if stop else b"c"
        for s in peers:
            s.sendall(verdict)
        return verdict

    def comm() -> None:  # the all-reduce: one exchange with the peers per step
        rename("gloo_tcp_loop")
        try:
            while ask.get():
                if leader:
                    answer.put(gather())
                else:
                    peers[0].sendall(b"s")
                    answer.put(peers[0].recv(1))
        except OSError:  # a peer is gone: stop the rank
            answer.put(b"")

    leader = bool(timing)
    if leader:
        warmup, seconds, out, go = float(timing[0]), float(timing[1]), int(timing[2]), timing[3]

        def ready() -> None:  # the demo says the arm is set up (agent applied): warm up, count
            os.read(int(go), 1)
            result["go"] = time.monotonic()

        threading.Thread(target=ready, daemon=True).start()
    threading.Thread(target=comm, daemon=True).start()
    while True:
        os.read(got_r, 1)
        os.write(req_w, b"r")
        busy(step)
        ask.put(True)
        if answer.get() != b"c":
            break
    os.close(req_w)
    os.waitpid(pid, 0)
    if leader:
        line = {"error": result.get("error", "stopped early")}
        if "error" not in result and result.get("counted_at") is not None:
            took = result["now"] - result["counted_at"]
            line = {"steps": result["steps"], "seconds": round(took, 3)}
            line["steps_per_s"] = result["steps"] / took
        os.write(out, (json.dumps(line) + "\n").encode())


# -- helpers shared with bench/trainer/run.py --------------------------------------------------
class Contention:
    """``n`` CPU hogs in a session of their own (another tenant): ``stress-ng --cpu n`` where
    it is installed, else Python busy loops."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tool = "stress-ng" if shutil.which("stress-ng") else "python busy loops"
        if self.tool == "stress-ng":
            argv = ["stress-ng", "--cpu", str(n), "--cpu-method", "int64", "--quiet"]
        else:
            code = (
                "import os\nfor _ in range(%d - 1):\n    if os.fork() == 0: break\nwhile True: pass"
            )
            argv = [sys.executable, "-c", code % n]
        self.proc = subprocess.Popen(
            argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid)

    def stop(self) -> None:
        kill_session(self.proc)


def _processes() -> dict:
    """{pid: its parsed /proc/PID/stat} of every process now (read through ``Host``)."""
    from hostd.host import Host

    return Host().processes()


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` now."""
    return sorted(pid for pid, st in _processes().items() if st.session == sid)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL what ``proc`` started: its session (it was started with start_new_session) and
    every descendant, also those in sessions of their own (the ranks); then reap it."""
    table = _processes()
    doomed = {pid for pid, st in table.items() if st.session == proc.pid} | {proc.pid}
    grew = True
    while grew:
        more = {pid for pid, st in table.items() if st.ppid in doomed} - doomed
        doomed |= more
        grew = bool(more)
    for pid in sorted(doomed):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class AgentProc:
    """``hostd run`` as a child process with its own state and run folders (also the tests'
    agent, ``tests/agentproc.py``): its status, a wait for passes, and ``stop()``, which sends
    SIGTERM, on which the agent puts back everything it changed."""

    def __init__(
        self,
        workdir: Path,
        *,
        policy: str | None = None,
        scope: Sequence[int] = (),
        extra: Sequence[str] = (),
        env: dict | None = None,
        new_session: bool = False,
    ) -> None:
        self.state, self.run = workdir / "state", workdir / "run"
        self.log = workdir / "agent.log"
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [*HOSTD, "run", "--state-dir", str(self.state), "--run-dir", str(self.run)]
        if policy:
            argv += ["--policy", policy]
        for pid in scope:
            argv += ["--scope-pid", str(pid)]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [*argv, *extra],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, **(env or {})},
                start_new_session=new_session,  # as a service runs: leading its own session
            )

    def status(self) -> dict:
        """The agent's status.json, or {} before it wrote one."""
        try:
            return json.loads((self.run / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_passes(self, n: int = 1, timeout: float = 60) -> dict:
        """Wait until the agent has made ``n`` passes; its status then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st.get("passes", 0) >= n:
                return st
            if self.proc.poll() is not None:
                raise RuntimeError(f"hostd run exited:\n{self.log.read_text()}")
            time.sleep(0.05)
        raise RuntimeError(
            f"hostd run made no pass {n} within {timeout} s:\n{self.log.read_text()}"
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> str:
        """Signal the agent, wait for it (SIGKILL after ``timeout`` s) and return its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


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
SHARE_ONLY = b"\n[preempt]\nenabled = false\n"  # appended to the default policy


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
                policy.write_bytes(default_policy_bytes() + SHARE_ONLY)
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


def main(argv: list[str]) -> None:
    role = argv[0]
    if role == "launcher":
        ranks, warmup, seconds, step, batch, out, go = argv[1:8]
        _launcher(
            int(ranks), float(warmup), float(seconds), int(step), int(batch), int(out), int(go)
        )
    elif role == "rank":
        _rank(int(argv[1]), int(argv[2]), argv[3], argv[4:])
    else:
        raise SystemExit(f"hostd.demo: unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

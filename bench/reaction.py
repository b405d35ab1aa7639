#!/usr/bin/env python3
"""Benchmark of reaction time: how soon a new or renamed thread gets its layer's policy.

Run as root from the repository root::

    python3 bench/reaction.py [--threads 1000,10000,100000] [--arms hostd,tuned,floor]
    python3 bench/reaction.py --quick                        # a smoke run: 1k threads, 2 s storm
    python3 bench/reaction.py --write BENCHMARKS.md          # replace "## Reaction time ..."

It measures hostd from the outside only, through /proc and its status file (it never imports
hostd): the agent runs as ``hostd run --policy bench/reaction_policy.toml`` (a snapshot of the
working tree's hostd, or of ``--hostd-rev``) with temporary state and run folders, scoped to this
benchmark's own process tree unless ``--agent-scope host``. The policy puts threads named
``bench_hot*`` on one CPU of their own with SCHED_BATCH and nice -5; "applied" means a thread's
own affinity is exactly that layer's CPU set (read from the agent's status.json), its policy
SCHED_BATCH and its nice -5.

For each background size (idle threads started by bench/scan.py's helper tree, named like a
PyTorch job, none of them ``bench_hot``) and each arm (hostd, tuned's scheduler plugin for
comparison, and on request ``floor``: bench/floor_reactor.py, the least a Python agent does per
thread, which shows the machine's own tail), with the arm started first:

* **new**: a workload process (started as ``bench_hot``, comm ``bench_hot``) creates one thread at
  a time. New threads inherit affinity, policy and nice from their creator, and the creator
  matches the policy too, so before each creation the creator puts itself back to the state it
  started with (all CPUs, SCHED_OTHER, nice 0; out of hostd's v1 cpuset if hostd moved it
  there): every new thread is born with the wrong settings and only the agent can fix them. If
  the creator was changed by the agent between that reset and the thread's birth (its state is
  checked after ``start()``), the sample is discarded and retried (counted as "retried"). t0 is
  ``time.monotonic_ns()`` in the creator just before ``Thread.start()``; the new thread polls its
  OWN state (``sched_getaffinity(0)``, ``sched_getscheduler(0)``, ``getpriority(PRIO_PROCESS,
  0)``: with 0 these act on the calling thread) every ``--poll-us`` microseconds until all of it
  matches (t1). A thread not applied within ``--timeout`` seconds is a miss.
* **rename**: a workload process started as ``bench_cold`` holds idle threads; one at a time, a
  thread writes ``bench_hot_r`` to /proc/self/task/TID/comm (t0 just before the write) and polls
  its own state the same way.
* **first**: a layer's first member (hostd only, at the end, after the steady state): the
  workloads above have ended, so the hot layer has no thread; once the agent's status shows it
  without CPUs (the bench policy gives them back after ``[sizing] shrink_after = 1`` s), a
  ``bench_cold`` process starts a thread that writes ``bench_hot_first`` to its own comm (t0 just
  before the write) and polls its own state as above, then ends, emptying the layer again.
  ``--first-samples`` samples.
* **storm**: ``--storm-workers`` processes named ``bench_hot`` together create ``--storm-rate``
  threads per second for ``--storm-seconds`` (paced by the clock; the rate actually reached is
  reported). Creators reset themselves as above (a thread born while its creator was applied is
  counted as "inherited", not as applied). Each thread sleeps ``--storm-life`` seconds, then checks
  its own state once: applied, or missed. The agent's CPU time (utime + stime of its process)
  over the storm is reported.
* **steady state**: once the storm has settled (``--settle`` seconds, then until the agent
  uses under 5 % of a core over a second, at most ``--settle-max`` seconds), the agent's CPU
  time over ``--steady`` seconds (as % of one core), and its VmRSS and VmHWM.

The tuned arm runs ``tuned --profile hostd-bench --no-dbus --no-socket`` in the foreground with
bench/tuned/hostd-bench/tuned.conf (copied to /etc/tuned/hostd-bench/ for the run with the hot
CPU filled in, removed afterwards; /etc/tuned/active_profile and friends are put back). tuned's
scheduler plugin matches the PROCESS's command line (so workload processes are started with
argv[0] ``bench_hot``), cannot set nice (tuned is judged on affinity + policy) and never looks at
a thread's own name: renames are run with ``--tuned-rename-samples`` samples only, to show it.
Install it with ``apt-get install tuned linux-perf`` (linux-perf holds the ``perf`` Python module
its event-driven mode needs; without it the plugin does not load).

``--reps N`` runs every arm N times per background size (the arms in a rotated order in each
repetition, the helper threads started once per size): the goals are judged on every run, the
worst one included. ``--logs DIR`` keeps each run's agent log there
(``hostd-<threads>-<rep>.log``, the agent run with ``-v``: a line per event pass, its events,
threads and seconds; its ``relayer`` and ``pass`` lines give the re-layers' and full passes' own
times), so that an outlier can be explained.

Everything the benchmark changes is undone in a ``finally`` (SIGINT, SIGTERM and SIGHUP are
caught so that it runs): kernel limits (bench/scan.py's ``Limits``), helper and workload
processes, the agent (SIGTERM, which restores; on any failure also ``hostd restore``), tuned
(SIGTERM) and its files. Never part of the test suite (see bench/README.md).
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import json
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import scan as scanbench  # noqa: E402  (bench/scan.py: helper threads, limits, report helpers)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = BENCH.parent
SECTION = "## Reaction time (bench/reaction.py)"
POLICY = BENCH / "reaction_policy.toml"
TUNED_PROFILE = BENCH / "tuned" / "hostd-bench"
FLOOR = BENCH / "floor_reactor.py"
TUNED_ETC = Path("/etc/tuned")  # tuned 2.20 loads profiles only from /usr/lib/tuned, /etc/tuned
TUNED_STATE_FILES = ("active_profile", "profile_mode", "post_loaded_profile")
TUNED_STORAGE = Path("/run/tuned/save.pickle")
HOT_LAYER = "hot"
HOT_NAME = "bench_hot"  # comm and argv[0] of the creating workloads
COLD_NAME = "bench_cold"  # comm and argv[0] of the renaming workload
STORM_LEAD_S = 2.5  # creators wait this long before a storm: hostd has placed and joined them
RENAMED = "bench_hot_r"
FIRST = "bench_hot_first"  # the name a first member gives itself
GOAL_P99_MS = 5.0
GOAL_STORM_RATE = 10_000
GOAL_STORM_SECONDS = 10.0
GOAL_THREADS = 100_000
GOAL_CPU_PCT = 1.0
GOAL_RSS_MB = 200.0
STACK_SIZE = 64 * 1024
POLICIES = {
    "other": os.SCHED_OTHER,
    "batch": os.SCHED_BATCH,
    "idle": os.SCHED_IDLE,
    "fifo": os.SCHED_FIFO,
    "rr": os.SCHED_RR,
}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}
AGENT_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from hostd.cli import main; sys.exit(main())"
)
# HOSTD_BENCH_PROFILE=FILE: the agent runs under cProfile, its stats written to FILE at its exit
# (the profiler's own cost makes that run's numbers worthless: for finding where time goes).
PROFILED_BOOT = (
    "import cProfile, os, sys; sys.path.insert(0, sys.argv.pop(1)); from hostd.cli import main\n"
    "prof = cProfile.Profile()\n"
    "try:\n    prof.runcall(main)\n"
    "finally:\n    prof.dump_stats(os.environ['HOSTD_BENCH_PROFILE'])\n"
)


# -- what a thread sees of itself --------------------------------------------------------------
# A "want" is (affinity, policy, nice or None); None: the arm cannot set nice, do not compare it.
Want = tuple[frozenset, int, int | None]


def _own_state() -> tuple[frozenset, int, int]:
    """The calling thread's affinity, policy and nice (pid 0 means the calling thread)."""
    return (
        frozenset(os.sched_getaffinity(0)),
        os.sched_getscheduler(0),
        os.getpriority(os.PRIO_PROCESS, 0),
    )


def _applied(want: Want) -> bool:
    cpus, policy, nice = want
    if os.sched_getaffinity(0) != cpus or os.sched_getscheduler(0) != policy:
        return False
    return nice is None or os.getpriority(os.PRIO_PROCESS, 0) == nice


def _wait_applied(want: Want, deadline_ns: int, poll_s: float) -> int | None:
    """Poll until the calling thread's state matches: monotonic ns then, or None at the deadline."""
    while True:
        if _applied(want):
            return time.monotonic_ns()
        if time.monotonic_ns() > deadline_ns:
            return None
        time.sleep(poll_s)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)  # unbuffered: a refusal surfaces here
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _cpuset_mount() -> str | None:
    """Where the v1 cpuset hierarchy is mounted (proc_pid_mountinfo(5)), or None."""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _, opts = [*right.split(), "", "", ""][:3]
            if fstype == "cgroup" and "cpuset" in opts.split(","):
                return left.split()[4]
    return None


def _own_cpuset() -> str | None:
    """The v1 cpuset path of the calling thread (``/`` for the root), or None without v1."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "cpuset" in ctrls.split(","):
                return path
    return None


class Creator:
    """The creating thread of a workload: puts itself back to its starting state on demand."""

    def __init__(self, baseline: frozenset) -> None:
        self.baseline = (baseline, os.SCHED_OTHER, 0)
        mount, path = _cpuset_mount(), _own_cpuset()
        self.cpuset_tasks = None
        if mount and path is not None:
            self.cpuset_tasks = os.path.join(mount, path.lstrip("/"), "tasks")
        self.resets = 0

    def clean(self) -> bool:
        return _own_state() == self.baseline

    def reset(self) -> None:
        """Back to all CPUs, SCHED_OTHER, nice 0 (the agent applied the policy to us too)."""
        self.resets += 1
        cpus = self.baseline[0]
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
        if os.sched_getaffinity(0) != cpus and self.cpuset_tasks:
            # hostd moved us into its v1 cpuset /hostd/<layer>, which bounds our affinity: go
            # back to the cpuset we started in (joining it resets the affinity; set it anyway).
            _write(self.cpuset_tasks, str(threading.get_native_id()))
            os.sched_setaffinity(0, cpus)
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if os.getpriority(os.PRIO_PROCESS, 0) != 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)

    def ensure_clean(self) -> None:
        # The agent may be applying the policy to us (affinity, then policy, then nice) while we
        # reset: try again until a reset sticks.
        for _ in range(1000):
            if self.clean():
                return
            self.reset()
            if self.clean():
                return
            time.sleep(0.001)
        raise RuntimeError(f"cannot reset the creator: {_own_state()}")


# -- workload processes: `bench/reaction.py --_worker ROLE CONFIG`, JSON lines on stdin/stdout --
def _want_of(msg: dict) -> Want:
    w = msg["want"]
    return frozenset(w["cpus"]), w["policy"], w["nice"]


def _spin(want: Want, t0: list[int], timeout_ns: int, poll: float, box: list) -> None:
    box.append(_wait_applied(want, t0[0] + timeout_ns, poll))


def _cmd_new(creator: Creator, msg: dict) -> dict:
    """Sequential new threads: the reaction time of each (ns), None for a miss."""
    want, poll = _want_of(msg), msg["poll"]
    timeout_ns = int(msg["timeout"] * 1e9)
    samples: list[int | None] = []
    retried = 0
    while len(samples) < msg["n"]:
        time.sleep(random.uniform(0, msg["gap"]))
        creator.ensure_clean()
        t0 = [0]
        box: list[int | None] = []
        thread = threading.Thread(target=_spin, args=(want, t0, timeout_ns, poll, box), daemon=True)
        t0[0] = time.monotonic_ns()
        thread.start()
        born_clean = creator.clean()  # else the agent changed us around the clone: inherited
        thread.join()
        if not born_clean:
            retried += 1
            if retried > 10 * msg["n"]:
                raise RuntimeError("the creator keeps being changed around each thread's birth")
            continue
        t1 = box[0]
        samples.append(None if t1 is None else t1 - t0[0])
    return {"ns": samples, "retried": retried, "resets": creator.resets}


def _cmd_storm(creator: Creator, msg: dict) -> dict:
    """Create ``rate`` threads/s from ``start_ns`` for ``duration`` s; each checks itself once."""
    want, rate, life = _want_of(msg), msg["rate"], msg["life"]
    start, end = msg["start_ns"], msg["start_ns"] + int(msg["duration"] * 1e9)
    applied: list[int] = []
    missed: list[int] = []
    inherited: list[int] = []  # list.append is atomic: no lock in 3k short-lived threads

    def live(slot: list[bool]) -> None:
        time.sleep(life)
        if slot[0]:
            inherited.append(1)
        elif _applied(want):
            applied.append(1)
        else:
            missed.append(1)

    while time.monotonic_ns() < start:
        time.sleep(min(0.01, max(0.0, (start - time.monotonic_ns()) / 1e9)))
    cpu0 = os.times()
    created = errors = backlog = 0
    creator.ensure_clean()
    clean = True
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        due = int((now - start) * rate / 1e9) + 1 - created - errors
        if due <= 0:
            time.sleep(0.0005)
            continue
        backlog = max(backlog, due)
        for _ in range(min(due, 64)):
            if not clean:
                creator.ensure_clean()
            slot = [False]
            try:
                _thread.start_new_thread(live, (slot,))
            except RuntimeError:  # can't start new thread: a limit
                errors += 1
                continue
            created += 1
            clean = creator.clean()
            if not clean:
                slot[0] = True
    finished = time.monotonic_ns()
    cpu1 = os.times()
    deadline = time.monotonic() + life + 60
    while len(applied) + len(missed) + len(inherited) < created and time.monotonic() < deadline:
        time.sleep(0.05)
    return {
        "created": created,
        "errors": errors,
        "applied": len(applied),
        "missed": len(missed),
        "inherited": len(inherited),
        "unreported": created - len(applied) - len(missed) - len(inherited),
        "seconds": (finished - start) / 1e9,
        "backlog_max": backlog,
        "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        "resets": creator.resets,
    }


def _cmd_first(msg: dict) -> dict:
    """One new thread names itself into the (empty) hot layer and times it, then ends."""
    want, poll = _want_of(msg), msg["poll"]
    timeout_ns = int(msg["timeout"] * 1e9)
    box: list[int | None] = []
    at: list[float] = []  # the wall clock at t0: the agent's log lines up with it

    def member() -> None:
        fd = os.open(f"/proc/self/task/{threading.get_native_id()}/comm", os.O_WRONLY)
        try:
            at.append(time.time())
            t0 = time.monotonic_ns()
            os.write(fd, msg["name"].encode())
            t1 = _wait_applied(want, t0 + timeout_ns, poll)
            box.append(None if t1 is None else t1 - t0)
        finally:
            os.close(fd)

    thread = threading.Thread(target=member)
    thread.start()
    thread.join()
    return {"ns": box, "at": at}


def _renamer(n: int) -> tuple[list[threading.Event], list, dict]:
    """``n`` idle threads; thread i renames itself and times it when ``go[i]`` is set."""
    go = [threading.Event() for _ in range(n)]
    done = [threading.Event() for _ in range(n)]
    results: list = [None] * n
    job: dict = {}
    stop = threading.Event()

    def idle(i: int) -> None:
        tid = threading.get_native_id()
        fd = os.open(f"/proc/self/task/{tid}/comm", os.O_WRONLY)
        try:
            go[i].wait()
            want, name = job["want"], job["name"].encode()
            pre = _applied(want)
            t0 = time.monotonic_ns()
            os.write(fd, name)
            t1 = _wait_applied(want, t0 + job["timeout_ns"], job["poll"])
            results[i] = (None if t1 is None else t1 - t0, pre)
        except BaseException as exc:
            results[i] = (None, repr(exc))
        finally:
            os.close(fd)
            done[i].set()
        stop.wait()  # stay alive (and in the layer) until the workload ends

    for i in range(n):
        threading.Thread(target=idle, args=(i,), daemon=True).start()
    return go, done, {"results": results, "job": job}


def worker_main(role: str, config: dict) -> None:
    _write("/proc/self/comm", config["comm"])
    threading.stack_size(STACK_SIZE)
    creator = Creator(frozenset(config["baseline"]))
    renamer = _renamer(config["threads"]) if role == "renamer" else None
    out = sys.stdout

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reply({"ready": True, "pid": os.getpid()})
    next_idle = 0
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        try:
            if cmd == "exit":
                break
            if cmd == "new":
                reply(_cmd_new(creator, msg))
            elif cmd == "storm":
                reply(_cmd_storm(creator, msg))
            elif cmd == "first":
                reply(_cmd_first(msg))
            elif cmd == "rename" and renamer is not None:
                go, done, shared = renamer
                shared["job"].update(
                    want=_want_of(msg),
                    name=msg["name"],
                    timeout_ns=int(msg["timeout"] * 1e9),
                    poll=msg["poll"],
                )
                samples, pre_applied = [], 0
                for _ in range(msg["n"]):
                    time.sleep(random.uniform(0, msg["gap"]))
                    if next_idle >= len(go):
                        raise RuntimeError("out of idle threads to rename")
                    i, next_idle = next_idle, next_idle + 1
                    go[i].set()
                    done[i].wait()
                    ns, pre = shared["results"][i]
                    if isinstance(pre, str):
                        raise RuntimeError(f"renaming thread failed: {pre}")
                    pre_applied += bool(pre)
                    samples.append(ns)
                reply({"ns": samples, "pre_applied": pre_applied})
            else:
                reply({"error": f"unknown command {cmd!r} for {role}"})
        except Exception as exc:
            reply({"error": repr(exc)})


class Worker:
    """A workload process (its own session), spoken to in JSON lines."""

    def __init__(self, role: str, argv0: str, config: dict, timeout: float = 120) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            [argv0, str(Path(__file__).resolve()), "--_worker", role, json.dumps(config)],
            executable=sys.executable,  # argv[0] is what tuned's regex sees in the cmdline
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            self.pid = self.read(timeout)["pid"]
        except BaseException:
            self.stop()
            raise

    def read(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"{self.role} workload: no answer after {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.role} workload exited ({self.proc.wait()})")
        obj = json.loads(line)
        if "error" in obj:
            raise RuntimeError(f"{self.role} workload: {obj['error']}")
        return obj

    def send(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def ask(self, msg: dict, timeout: float) -> dict:
        self.send(msg)
        return self.read(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.send({"cmd": "exit"})
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


# -- the process under test: CPU time and memory from /proc --------------------------------------
def proc_cpu_s(pid: int) -> float:
    """utime + stime of the whole process (all its threads), seconds (proc_pid_stat(5))."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        text = fh.read()
    fields = text[text.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mem_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    got = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(rest.split()[0]) / 1024
    return got.get("VmRSS", 0.0), got.get("VmHWM", 0.0)


def _stop_process(proc: subprocess.Popen, timeout: float) -> int | None:
    """SIGTERM, wait; SIGKILL after ``timeout``. The exit code, or None when it had to be killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


class HostdArm:
    """``hostd run`` on the bench policy, with its own state and run folders."""

    name = "hostd"

    def __init__(
        self,
        scratch: Path,
        src: Path,
        scope: int | None,
        timeout: float,
        nice: int | None = None,
        keep_log: Path | None = None,
        rcvbuf: int | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hostd-", dir=scratch))
        self.rcvbuf = rcvbuf  # --rcvbuf: the agent's event buffer, to make overflows happen
        self.keep_log = keep_log  # --logs: where this run's agent log is kept
        self.state, self.run_dir = self.dir / "state", self.dir / "run"
        self.policy = self.dir / "policy.toml"  # a root-owned copy: the agent refuses others
        text = POLICY.read_text()
        if nice is not None:  # --agent-nice: the agent's own nice (and its session's)
            text = text.replace("[agent]\n", f"[agent]\nnice = {nice}\n", 1)
        self.policy.write_text(text)
        self.policy.chmod(0o644)
        self.src, self.scope, self.timeout = src, scope, timeout
        self.log = self.dir / "agent.log"
        self.proc: subprocess.Popen | None = None
        self.want: Want | None = None
        layers = tomllib.loads(POLICY.read_text())["layer"]
        layer = next(x for x in layers if x["name"] == HOT_LAYER)
        self.policy_name = POLICIES[layer.get("sched", {}).get("policy", "other")]
        self.nice = layer.get("sched", {}).get("nice", 0)
        self.criterion = "affinity + policy + nice"

    def _hostd(self, *args: str) -> list[str]:
        boot = PROFILED_BOOT if os.environ.get("HOSTD_BENCH_PROFILE") else AGENT_BOOT
        return [sys.executable, "-c", boot, str(self.src), *args]

    def status(self) -> dict | None:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((self.run_dir / "status.json").read_text())
        return None

    def start(self) -> None:
        cmd = self._hostd(
            "run", "--policy", str(self.policy), "--state-dir", str(self.state),
            "--run-dir", str(self.run_dir),
        )  # fmt: skip
        if self.keep_log is not None:
            cmd.append("-v")
        if self.scope is not None:
            cmd += ["--scope-pid", str(self.scope)]
        env = dict(os.environ)
        if self.rcvbuf is not None:
            env["HOSTD_CONNECTOR_RCVBUF"] = str(self.rcvbuf)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env=env,
            )  # fmt: skip
        self.wait(lambda st: st.get("passes", 0) >= 1, "its first pass")

    def wait(self, ok, what: str) -> dict:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"hostd exited ({self.proc.returncode}) before {what}:\n{_tail(self.log)}"
                )
            st = self.status()
            if st and st.get("pid") == self.proc.pid and ok(st):
                return st
            time.sleep(0.05)
        raise RuntimeError(f"hostd: no {what} after {self.timeout:.0f} s:\n{_tail(self.log)}")

    @staticmethod
    def hot_cpus(st: dict) -> list:
        layer = next((x for x in st.get("layers", []) if x.get("name") == HOT_LAYER), None)
        return layer.get("cpus") if layer else []

    def settle_want(self, _hint: frozenset, anchor: int, baseline: frozenset) -> Want:
        """Once a hot thread exists (the anchor workload): the CPUs the hot layer got.

        From status.json's layer list; if the agent does not write it after the anchor appears
        (an event-driven agent may write it only after full passes), from the anchor's own
        state once its policy and nice are the layer's and its affinity is narrower.
        """

        def from_anchor() -> frozenset | None:
            with contextlib.suppress(OSError):
                cpus = frozenset(os.sched_getaffinity(anchor))
                if (
                    os.sched_getscheduler(anchor) == self.policy_name
                    and os.getpriority(os.PRIO_PROCESS, anchor) == self.nice
                    and cpus < baseline
                ):
                    return cpus
            return None

        got: list[frozenset] = []

        def ok(st: dict) -> bool:
            cpus = frozenset(self.hot_cpus(st)) or from_anchor()
            if cpus:
                got.append(cpus)
            return bool(cpus)

        self.wait(ok, f"CPUs for the {HOT_LAYER} layer")
        self.want = (got[-1], self.policy_name, self.nice)
        return self.want

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def notes(self) -> dict:
        st = self.status() or {}
        return {
            "passes": st.get("passes"),
            "last_pass_s": (st.get("last_pass") or {}).get("seconds"),
            "mode": st.get("mode"),
            "source": (st.get("source") or {}).get("kind"),  # agents with events say which
            "events": st.get("events"),
        }

    def stop(self, failed: bool) -> list[str]:
        problems = []
        if self.proc is not None:
            rc = _stop_process(self.proc, self.timeout)
            if rc != 0:
                problems.append(
                    f"hostd run exited with {rc if rc is not None else 'SIGKILL (no exit)'}:\n"
                    f"{_tail(self.log)}"
                )
            self.proc = None
        if self.keep_log is not None and self.log.exists():  # --logs: kept for a look
            shutil.copyfile(self.log, self.keep_log)
        if failed or problems:
            out = subprocess.run(
                self._hostd(
                    "restore", "--state-dir", str(self.state), "--run-dir", str(self.run_dir)
                ),
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                problems.append(f"hostd restore failed ({out.returncode}): {out.stdout[-2000:]}")
        return problems


class _FixedArm:
    """An arm whose wanted state is fixed at its start (no layer that moves), run as a process
    (``proc``) of its own."""

    proc: subprocess.Popen | None
    want: Want | None

    def settle_want(self, hot: frozenset, anchor: int, baseline: frozenset) -> Want:
        assert self.want is not None
        return self.want

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class TunedArm(_FixedArm):
    """tuned in the foreground with the hostd-bench profile (its scheduler plugin)."""

    name = "tuned"

    def __init__(self, scratch: Path, timeout: float) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tuned-", dir=scratch))
        self.log = self.dir / "tuned.log"
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.want: Want | None = None
        self.saved: dict[str, bytes | None] = {}
        self.profile_dir: Path | None = None
        self.storage_existed = TUNED_STORAGE.exists()
        self.criterion = "affinity + policy (tuned cannot set nice)"
        self.perf_fds = 0

    @staticmethod
    def available() -> str | None:
        """Why tuned cannot run here, or None."""
        if shutil.which("tuned") is None:
            return "tuned is not installed (apt-get install tuned linux-perf)"
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{entry}/comm").read_text().strip() == "tuned":
                        return f"another tuned is running (pid {entry})"
        if (TUNED_ETC / TUNED_PROFILE.name).exists():
            return (
                f"{TUNED_ETC / TUNED_PROFILE.name} exists (left by a killed run?): remove it first"
            )
        return None

    def start(self, hot: frozenset) -> None:
        for name in TUNED_STATE_FILES:
            path = TUNED_ETC / name
            self.saved[name] = path.read_bytes() if path.exists() else None
        self.profile_dir = TUNED_ETC / TUNED_PROFILE.name
        shutil.copytree(TUNED_PROFILE, self.profile_dir)
        conf = self.profile_dir / "tuned.conf"
        cpulist = ",".join(str(c) for c in sorted(hot))
        lines = [
            f"hot_cpus={cpulist}" if ln.startswith("hot_cpus=") else ln
            for ln in conf.read_text().splitlines()
        ]
        conf.write_text("\n".join(lines) + "\n")
        self.want = (hot, os.SCHED_BATCH, None)
        cmd = [
            "tuned", "--profile", TUNED_PROFILE.name, "--no-dbus", "--no-socket",
            "--pid", str(self.dir / "tuned.pid"), "--log", str(self.log),
        ]  # fmt: skip
        with open(self.dir / "tuned.out", "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + self.timeout
        while "static tuning from profile" not in (_tail(self.log, 200) or ""):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tuned exited ({self.proc.returncode}):\n{_tail(self.log)}\n"
                    f"{_tail(self.dir / 'tuned.out')}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"tuned: profile not applied after {self.timeout:.0f} s")
            time.sleep(0.1)
        # Event-driven mode holds perf event fds (one per CPU); without python3 perf it cannot.
        with contextlib.suppress(OSError):
            fd_dir = f"/proc/{self.proc.pid}/fd"
            self.perf_fds = sum(
                1 for fd in os.listdir(fd_dir) if "perf_event" in os.readlink(f"{fd_dir}/{fd}")
            )

    def notes(self) -> dict:
        mode = f"perf events ({self.perf_fds} fds)" if self.perf_fds else "static only (no perf)"
        return {"mode": mode}

    def stop(self, failed: bool) -> list[str]:
        problems = []
        if self.proc is not None:
            rc = _stop_process(self.proc, self.timeout)
            if rc is None:
                problems.append("tuned did not exit on SIGTERM: killed")
            elif rc != 0:
                problems.append(f"tuned exited with {rc}:\n{_tail(self.log)}")
            self.proc = None
        for name, data in self.saved.items():
            path = TUNED_ETC / name
            try:
                if data is None:
                    path.unlink(missing_ok=True)
                elif not path.exists() or path.read_bytes() != data:
                    path.write_bytes(data)
            except OSError as exc:
                problems.append(f"could not restore {path}: {exc}")
        self.saved = {}
        if self.profile_dir is not None:
            shutil.rmtree(self.profile_dir, ignore_errors=True)
            self.profile_dir = None
        if not self.storage_existed:
            with contextlib.suppress(OSError):
                TUNED_STORAGE.unlink()
        return problems


class FloorArm(_FixedArm):
    """bench/floor_reactor.py: the least a Python agent does per thread (its docstring)."""

    name = "floor"

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.want: Want | None = None
        self.criterion = "affinity + policy + nice"

    def start(self, hot: frozenset) -> None:
        self.want = (frozenset({min(hot)}), os.SCHED_BATCH, -5)
        env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}  # hostd.host.connector
        self.proc = subprocess.Popen(
            [sys.executable, str(FLOOR), str(min(hot))], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, env=env, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], self.timeout)[0]:
            raise RuntimeError(f"floor reactor: not ready after {self.timeout:.0f} s")
        if self.proc.stdout.readline() != b"ready\n":
            raise RuntimeError(f"floor reactor exited ({self.proc.wait()})")

    def notes(self) -> dict:
        return {"mode": "floor reactor"}

    def stop(self, failed: bool) -> list[str]:
        if self.proc is None:
            return []
        rc = _stop_process(self.proc, self.timeout)
        self.proc = None
        return [] if rc == 0 else [f"floor reactor exited with {rc}"]


# -- one arm at one background size ------------------------------------------------------------
def _want_msg(want: Want) -> dict:
    return {"cpus": sorted(want[0]), "policy": want[1], "nice": want[2]}


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; misses are +inf so they count against p99 and max."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Case:
    samples_ms: list[float | None]
    extra: dict = field(default_factory=dict)

    @property
    def misses(self) -> int:
        return sum(1 for s in self.samples_ms if s is None)

    def stat(self, q: float) -> float:
        vals = [math.inf if s is None else s for s in self.samples_ms]
        return _percentile(vals, q) if vals else math.nan


@dataclass
class ArmResult:
    threads: int
    arm: str
    rep: int | None = None  # the run, where there are several (--reps)
    criterion: str = ""
    want: str = ""
    new: Case | None = None
    rename: Case | None = None
    first: Case | None = None
    rename_note: str = ""
    storm: dict | None = None
    steady: dict | None = None
    notes: dict = field(default_factory=dict)
    error: str | None = None


def _case(reply: dict) -> Case:
    ns = reply.pop("ns")
    return Case([None if v is None else v / 1e6 for v in ns], reply)


def _cpu_busy() -> float:
    return scanbench._cpu_seconds()[0]


def _cpu_steal() -> float:
    """CPU seconds the hypervisor gave others since boot (/proc/stat's steal, proc(5)): on a
    VM, the machine's own pace, which swings a storm's result from one run to the next."""
    with open("/proc/stat") as fh:
        return int(fh.readline().split()[8]) / os.sysconf("SC_CLK_TCK")


def run_arm(arm, threads: int, args: argparse.Namespace, ctx: dict, stack) -> ArmResult:
    """Start the arm, run new / rename / storm / steady against it, stop it."""
    res = ArmResult(threads, arm.name, arm.criterion)
    poll = args.poll_us / 1e6
    base = {"baseline": sorted(ctx["baseline"])}
    if isinstance(arm, (TunedArm, FloorArm)):
        arm.start(ctx["hot_hint"])
    else:
        arm.start()
    anchor = stack.enter_context(_worker("creator", HOT_NAME, {**base, "comm": HOT_NAME}))
    renamer = stack.enter_context(
        _worker("renamer", COLD_NAME, {**base, "comm": COLD_NAME, "threads": args.rename_samples})
    )
    want = arm.settle_want(ctx["hot_hint"], anchor.pid, ctx["baseline"])
    res.want = f"CPUs {sorted(want[0])}, {POLICY_NAMES.get(want[1], want[1])}" + (
        f", nice {want[2]}" if want[2] is not None else ""
    )
    if isinstance(arm, HostdArm):
        ctx["hot_hint"] = want[0]
    # The arm works at all: the anchor's main thread gets the policy.
    deadline = time.monotonic() + args.ready_timeout
    while not _pid_applied(anchor.pid, want):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{arm.name} never applied the policy to the bench_hot workload")
        time.sleep(0.05)
    msg = {"want": _want_msg(want), "timeout": args.timeout, "poll": poll, "gap": args.gap_ms / 1e3}
    print(f"  {arm.name}: applied = {res.want}; new threads x{args.samples}", flush=True)
    patience = args.samples * (args.timeout + 1) + 60
    res.new = _case(anchor.ask({"cmd": "new", "n": args.samples, **msg}, patience))
    _print_case("new", res.new)
    n_rename = args.tuned_rename_samples if isinstance(arm, TunedArm) else args.samples
    n_rename = min(n_rename, args.rename_samples)
    if n_rename:
        res.rename = _case(
            renamer.ask({"cmd": "rename", "n": n_rename, "name": RENAMED, **msg}, patience)
        )
        _print_case("rename", res.rename)
    if isinstance(arm, TunedArm):
        res.rename_note = "unsupported: tuned matches the process command line, not thread names"
    if args.storm_seconds > 0:
        res.storm = run_storm(arm, want, args, base)
        s = res.storm
        print(
            f"    storm: {s['created']:,} threads in {s['seconds']:.1f} s = {s['rate']:,.0f}/s "
            f"(asked {args.storm_rate:,}/s); missed {s['missed']:,}, applied {s['applied']:,}, "
            f"inherited {s['inherited']:,}; {arm.name} CPU {s['agent_cpu_s']:.2f} s; creators' "
            f"CPU {s['cpu_s']:.2f} s; host CPUs stolen {s['host_steal_cpus']:.2f}",
            flush=True,
        )
    settled = settle(arm, args.settle, args.settle_max)
    res.steady = steady(arm, args.steady)
    res.notes = {**arm.notes(), "settled": settled}
    print(
        f"    steady: {res.steady['cpu_pct']:.2f} % of one core over {args.steady:g} s, "
        f"RSS {res.steady['rss_mb']:.0f} MB (peak {res.steady['hwm_mb']:.0f} MB) {res.notes}",
        flush=True,
    )
    if isinstance(arm, HostdArm) and args.first_samples:
        anchor.stop()  # the hot layer's threads end: it is empty from now on
        renamer.stop()
        res.first = run_first(arm, msg, args, base)
        _print_case("first", res.first)
    return res


def run_first(arm: HostdArm, msg: dict, args: argparse.Namespace, base: dict) -> Case:
    """A layer's first member, ``--first-samples`` times, each once the layer has no CPU."""
    samples: list[float | None] = []
    at: list[str] = []  # each sample's start, as the agent's log writes the time
    with contextlib.ExitStack() as inner:
        worker = inner.enter_context(_worker("first", COLD_NAME, {**base, "comm": COLD_NAME}))
        for _ in range(args.first_samples):
            arm.wait(lambda st: not arm.hot_cpus(st), f"the {HOT_LAYER} layer without CPUs")
            time.sleep(random.uniform(0.2, 0.6))
            reply = worker.ask({"cmd": "first", "name": FIRST, **msg}, args.timeout + 30)
            if "error" in reply:
                raise RuntimeError(f"first member: {reply['error']}")
            samples += [None if v is None else v / 1e6 for v in reply["ns"]]
            at += [
                time.strftime("%H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d}"
                for t in reply["at"]
            ]
    return Case(samples, {"at": at})


def _pid_applied(tid: int, want: Want) -> bool:
    try:
        ok = os.sched_getaffinity(tid) == want[0] and os.sched_getscheduler(tid) == want[1]
        return ok and (want[2] is None or os.getpriority(os.PRIO_PROCESS, tid) == want[2])
    except OSError:
        return False


@contextlib.contextmanager
def _worker(role: str, argv0: str, config: dict):
    worker = Worker(role, argv0, config)
    try:
        yield worker
    finally:
        worker.stop()


def run_storm(arm, want: Want, args: argparse.Namespace, base: dict) -> dict:
    with contextlib.ExitStack() as inner:
        workers = [
            inner.enter_context(_worker("creator", HOT_NAME, {**base, "comm": HOT_NAME}))
            for _ in range(args.storm_workers)
        ]
        # The creators match the hot layer: hostd places them as they start, and joins them
        # to its cpuset a second later (JOIN_AFTER_S). Start the storm after that, so that each
        # creator puts itself back once, before it, not in the middle of it (a creator moved
        # mid-storm made the storm's rate swing between 3k and 10k/s from one run to the next).
        start_ns = time.monotonic_ns() + int(STORM_LEAD_S * 1e9)
        msg = {
            "cmd": "storm",
            "want": _want_msg(want),
            "rate": args.storm_rate / len(workers),
            "duration": args.storm_seconds,
            "life": args.storm_life,
            "start_ns": start_ns,
        }
        cpu0, busy0, wall0 = proc_cpu_s(arm.pid), _cpu_busy(), time.monotonic()
        steal0 = _cpu_steal()
        for w in workers:
            w.send(msg)
        replies = [w.read(args.storm_seconds + args.storm_life + 120) for w in workers]
        cpu1, busy1, wall1 = proc_cpu_s(arm.pid), _cpu_busy(), time.monotonic()
        steal1 = _cpu_steal()
    total = {k: sum(r[k] for r in replies) for k in replies[0] if k not in ("seconds",)}
    seconds = max(r["seconds"] for r in replies)
    total.update(
        seconds=seconds,
        rate=total["created"] / seconds if seconds > 0 else 0.0,
        agent_cpu_s=cpu1 - cpu0,
        window_s=wall1 - wall0,
        host_busy_cpus=(busy1 - busy0) / max(wall1 - wall0, 1e-9),
        host_steal_cpus=(steal1 - steal0) / max(wall1 - wall0, 1e-9),
        workers=len(workers),
    )
    return total


def settle(arm, at_least: float, at_most: float) -> str:
    """Wait ``at_least`` s, then until the arm uses under 5 % of a core over a second."""
    t0 = time.monotonic()
    time.sleep(at_least)
    while True:
        cpu0 = proc_cpu_s(arm.pid)
        time.sleep(1.0)
        busy = proc_cpu_s(arm.pid) - cpu0
        waited = time.monotonic() - t0
        if busy < 0.05:
            return f"quiet {waited:.0f} s after the storm"
        if waited >= at_most:
            return f"still busy ({100 * busy:.0f} % of a core) {waited:.0f} s after the storm"


def steady(arm, seconds: float) -> dict:
    cpu0, busy0, t0 = proc_cpu_s(arm.pid), _cpu_busy(), time.monotonic()
    n0 = arm.notes().get("passes")
    time.sleep(seconds)
    cpu1, busy1, t1 = proc_cpu_s(arm.pid), _cpu_busy(), time.monotonic()
    n1 = arm.notes().get("passes")
    rss, hwm = proc_mem_mb(arm.pid)
    out = {
        "cpu_s": cpu1 - cpu0,
        "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "seconds": t1 - t0,
        "rss_mb": rss,
        "hwm_mb": hwm,
        "host_busy_cpus": (busy1 - busy0) / (t1 - t0),
    }
    if n0 is not None and n1 is not None:
        out["passes_per_s"] = (n1 - n0) / (t1 - t0)
    return out


def _print_case(name: str, case: Case) -> None:
    extra = " ".join(f"{k}={v}" for k, v in case.extra.items() if k != "at")  # (JSON only)
    print(
        f"    {name}: p50 {_ms(case.stat(0.5))} p99 {_ms(case.stat(0.99))} "
        f"max {_ms(case.stat(1.0))} ms, misses {case.misses}/{len(case.samples_ms)} {extra}",
        flush=True,
    )


def _ms_text(v: float, args: argparse.Namespace) -> str:
    return f"not applied within {args.timeout:g} s" if math.isinf(v) else f"{_ms(v)} ms"


def _ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "miss"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}"


# -- report ------------------------------------------------------------------------------------
def _tuned_version() -> str:
    with contextlib.suppress(OSError):
        out = subprocess.run(["tuned", "--version"], capture_output=True, text=True)
        return (out.stdout or out.stderr).strip()
    return "not installed"


def _verdicts(rows: list[ArmResult], args: argparse.Namespace) -> list[str]:
    hostd = [r for r in rows if r.arm == "hostd" and r.error is None]
    if not hostd:
        return []
    lines = []
    if any(r.new for r in hostd):
        worst = [max(c.stat(0.99) for c in (r.new, r.rename, r.first) if c) for r in hostd if r.new]
        p99, met = max(worst), sum(w <= GOAL_P99_MS for w in worst)
        runs = f"in {met} of {len(worst)} runs; " if len(worst) > 1 else ""
        lines.append(
            f"- p99 at most {GOAL_P99_MS:g} ms: **{'met' if p99 <= GOAL_P99_MS else 'missed'}** "
            f"({runs}worst p99 of new, rename and first member over all sizes and runs: "
            f"{_ms_text(p99, args)})"
        )
    storms = [r.storm for r in hostd if r.storm]
    if storms:
        missed = sum(s["missed"] + s["unreported"] + s["errors"] for s in storms)
        rate = min(s["rate"] for s in storms)
        full = args.storm_rate >= GOAL_STORM_RATE and args.storm_seconds >= GOAL_STORM_SECONDS
        lines.append(
            f"- zero misses in the storm: **{'met' if missed == 0 else 'missed'}** ({missed:,} "
            f"missed; the workload reached {rate:,.0f} threads/s of the {args.storm_rate:,} "
            f"asked{'' if full else ', not the full storm of the goal'})"
        )
    big = [r.steady for r in hostd if r.threads >= GOAL_THREADS and r.steady]
    if big:
        met = sum(s["cpu_pct"] <= GOAL_CPU_PCT and s["hwm_mb"] <= GOAL_RSS_MB for s in big)
        runs = f"in {met} of {len(big)} runs; the worst: " if len(big) > 1 else ""
        lines.append(
            f"- at {GOAL_THREADS:,} threads, steady CPU at most {GOAL_CPU_PCT:g} % of one core "
            f"and RSS at most {GOAL_RSS_MB:g} MB, its peak included: "
            f"**{'met' if met == len(big) else 'missed'}** ({runs}"
            f"{max(s['cpu_pct'] for s in big):.2f} %, RSS {max(s['rss_mb'] for s in big):.0f} "
            f"MB, peak {max(s['hwm_mb'] for s in big):.0f} MB)"
        )
    else:
        lines.append(
            f"- steady state at {GOAL_THREADS:,} threads: not measured in this run "
            f"(largest size {max(r.threads for r in hostd):,})"
        )
    return lines


def _bounds(rows: list[ArmResult], args: argparse.Namespace) -> list[str]:
    """What the numbers say bounds each result (derived from the measurements)."""
    lines = []
    for r in rows:
        if r.error is not None:
            lines.append(f"- {_arm(r)} at {r.threads:,} threads failed: {r.error.splitlines()[0]}")
            continue
        if r.arm == "hostd" and r.steady and r.steady.get("passes_per_s") and r.new:
            passes = r.steady["passes_per_s"]
            last = r.notes.get("last_pass_s")
            if r.new.stat(0.5) > 20:
                lines.append(
                    f"- hostd at {r.threads:,} threads: a thread waits for the next full pass "
                    f"({passes:.2f} passes/s in steady state, the last one took "
                    f"{'?' if last is None else f'{last:.2f}'} s): reaction p50 "
                    f"{_ms_text(r.new.stat(0.5), args)}; the passes set the reaction time and "
                    f"the CPU use ({r.steady['cpu_pct']:.1f} % of one core)."
                )
    for r in rows:
        s = r.storm
        if not s or r.error is not None:
            continue
        per_thread_us = 1e6 * s["cpu_s"] / max(s["created"], 1)
        if s["rate"] < 0.95 * args.storm_rate:
            lines.append(
                f"- storm ({r.arm}, {r.threads:,} threads): the workload reached "
                f"{s['rate']:,.0f}/s, not {args.storm_rate:,}/s: {s['workers']} CPython creator "
                f"processes spent {s['cpu_s']:.1f} CPU s ({per_thread_us:.0f} us per thread "
                f"created, its start and its exit) while {s['host_busy_cpus']:.2f} of "
                f"{os.cpu_count()} CPUs were busy; the agent used {s['agent_cpu_s']:.1f} s."
            )
        busy = s["host_busy_cpus"]
        if busy > 0.8 * (os.cpu_count() or 1):
            lines.append(
                f"- storm ({r.arm}, {r.threads:,} threads): the storm kept {busy:.2f} of "
                f"{os.cpu_count()} CPUs busy; the {r.arm} process competed with it for CPU and "
                f"got {s['agent_cpu_s']:.2f} CPU s in the {s['window_s']:.1f} s window."
            )
        if s["inherited"]:
            lines.append(
                f"- storm ({r.arm}, {r.threads:,} threads): {s['inherited']:,} threads were born "
                "while their creator had just been given the policy (inherited it): not counted."
            )
    if any(r.arm == "tuned" and r.error is None for r in rows):
        lines.append(
            "- tuned: its scheduler plugin matches a regex against the process's command line "
            "(`ps -eo cmd`), for all threads of a process, and reacts to perf COMM (exec, "
            "rename) and, with `perf_process_fork`, FORK events; a thread renamed to a matching "
            "name keeps its process's command line, so renames are never applied; it has no "
            "nice (judged on affinity and policy only)."
        )
    return lines


def render(rows: list[ArmResult], args: argparse.Namespace, code: dict, limits_log) -> str:
    lines = [
        SECTION,
        "",
        f"Goals (the reaction issue): from a thread's birth or rename in a process the policy "
        f"matches to its policy being visible in /proc, p99 at most {GOAL_P99_MS:g} ms; no "
        f"misses in a storm of {GOAL_STORM_RATE:,} new threads/s for {GOAL_STORM_SECONDS:g} s; "
        f"at {GOAL_THREADS:,} idle threads, steady-state CPU at most {GOAL_CPU_PCT:g} % of one "
        f"core and RSS at most {GOAL_RSS_MB:g} MB.",
        "",
    ]
    verdicts = _verdicts(rows, args)
    if verdicts:
        lines += ["**hostd's result:**", "", *verdicts, ""]
    lines += [
        "Method: `bench/reaction.py` (see its docstring). For each background size it starts "
        "bench/scan.py's helper tree of idle threads (named like a PyTorch job, none matching), "
        "then per arm: the agent (`hostd run` on `bench/reaction_policy.toml`, "
        + (
            "`--scope-pid` of the benchmark's own process tree, background threads included"
            if args.agent_scope == "bench"
            else "on the whole host"
        )
        + ") or tuned (foreground, "
        "`bench/tuned/hostd-bench`), then workload processes. A thread named `bench_hot*` must "
        "get the hot layer's one CPU, SCHED_BATCH and nice -5 (tuned: CPU and policy). **new**: "
        "a `bench_hot` process creates one thread at a time, resetting itself first so that the "
        "thread is born with the wrong settings; t0 just before `Thread.start()`, t1 when the "
        "new thread, polling its own affinity/policy/nice every "
        f"{args.poll_us:g} us, sees all of them right. **rename**: an idle thread of a "
        "`bench_cold` process writes `bench_hot_r` to its /proc comm (t0 just before the "
        f"write). {args.samples} samples each (tuned renames: {args.tuned_rename_samples}); a "
        f"thread not applied within {args.timeout:g} s is a miss (and counts as infinite in p99 "
        f"and max). **storm**: {args.storm_workers} `bench_hot` processes create "
        f"{args.storm_rate:,} threads/s for {args.storm_seconds:g} s, paced by the clock; each "
        f"thread lives {args.storm_life:g} s, then checks its own state once (missed = not "
        "applied by then). **steady**: once the storm has settled (at least "
        f"{args.settle:g} s, then until the arm uses under 5 % of a core over a second, at most "
        f"{args.settle_max:g} s: see notes), the arm's utime + stime over {args.steady:g} s, and "
        "its VmRSS / VmHWM.",
        "",
        "Machine:",
        "",
        *[ln for ln in scanbench._machine(code) if not ln.startswith("- hostd:")],
        f"- hostd: {code['what']} at `{code['rev']}`, copied when the run started (source "
        f"fingerprint `{code['fingerprint']}`, sha256 of hostd's .py/.toml files); measured "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC",
        f"- tuned: {_tuned_version()} (scheduler plugin; perf Python module from linux-perf)",
        "",
        "### Reaction, one thread at a time",
        "",
        "| background threads | arm | applied means | new: p50 / p99 / max ms | new misses "
        "| rename: p50 / p99 / max ms | rename misses | first member: p50 / p99 / max ms "
        "| first misses |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.error is not None:
            lines.append(f"| {r.threads:,} | {_arm(r)} | failed: {r.error.splitlines()[0]} |||||||")
            continue
        new = _triple(r.new)
        ren = _triple(r.rename) if r.rename else "-"
        if r.rename_note:
            ren = f"{ren} ({r.rename_note})"
        lines.append(
            f"| {r.threads:,} | {_arm(r)} | {r.want} | {new} | {_misses(r.new)} | {ren} "
            f"| {_misses(r.rename)} | {_triple(r.first) if r.first else '-'} "
            f"| {_misses(r.first) if r.first else '-'} |"
        )
    lines += [
        "",
        "### Storm and steady state",
        "",
        "| background threads | arm | storm reached, threads/s | storm missed / checked "
        "| inherited | arm CPU s in the storm | host CPUs busy in the storm "
        "| steady CPU, % of one core | RSS / peak MB | notes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.error is not None:
            continue
        s, st = r.storm, r.steady
        storm = (
            f"{s['rate']:,.0f} | {s['missed'] + s['unreported']:,} / "
            f"{s['applied'] + s['missed'] + s['unreported']:,} | {s['inherited']:,} "
            f"| {s['agent_cpu_s']:.2f} | {s['host_busy_cpus']:.2f} of {os.cpu_count()}"
            if s
            else "- | - | - | - | -"
        )
        notes = _notes(r)
        lines.append(
            f"| {r.threads:,} | {_arm(r)} | {storm} | {st['cpu_pct']:.2f} "
            f"| {st['rss_mb']:.0f} / {st['hwm_mb']:.0f} | {notes} |"
        )
    bounds = _bounds(rows, args)
    if bounds:
        lines += ["", "What bounds the results:", "", *bounds]
    changed = [line for line in limits_log if "restored" not in line]
    if changed:
        lines += [
            "",
            "Kernel limits for the run: " + "; ".join(changed) + " (restored at the end).",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _notes(r: ArmResult) -> str:
    n, parts = r.notes, []
    if n.get("mode"):
        parts.append(f"mode {n['mode']}")
    if n.get("source"):
        parts.append(f"source {n['source']}")
    events = n.get("events") or {}
    if events.get("overflows"):
        parts.append(f"{events['overflows']} event overflows (rescans)")
    if r.steady and "passes_per_s" in r.steady:
        parts.append(f"{r.steady['passes_per_s']:.2f} passes/s in steady state")
    if n.get("last_pass_s") is not None:
        parts.append(f"last pass {n['last_pass_s']:.3f} s")
    if n.get("settled"):
        parts.append(n["settled"])
    return "; ".join(parts)


def _arm(r: ArmResult) -> str:
    """The arm, and its run where there are several (``--reps``)."""
    return r.arm if r.rep is None else f"{r.arm}, run {r.rep}"


def _triple(case: Case | None) -> str:
    if case is None or not case.samples_ms:
        return "-"
    return " / ".join(_ms(case.stat(q)) for q in (0.5, 0.99, 1.0))


def _misses(case: Case | None) -> str:
    return "-" if case is None else f"{case.misses} / {len(case.samples_ms)}"


def _jsonable(rows: list[ArmResult]) -> list[dict]:
    out = []
    for r in rows:
        d = {k: v for k, v in r.__dict__.items() if k not in ("new", "rename", "first")}
        for name in ("new", "rename", "first"):
            case = getattr(r, name)
            if case is not None:
                d[name] = {
                    "samples_ms": case.samples_ms,
                    **case.extra,
                    **{
                        f"p{int(q * 100)}": (
                            None if math.isinf(case.stat(q)) else round(case.stat(q), 3)
                        )
                        for q in (0.5, 0.99, 1.0)
                    },
                    "misses": case.misses,
                }
        out.append(d)
    return out


# -- main --------------------------------------------------------------------------------------
def _snapshot(scratch: Path, rev: str | None) -> dict:
    """A copy of hostd (the working tree's, or ``rev``'s) that every arm runs."""
    scratch.mkdir(parents=True)
    if rev is None:
        fp = scanbench.snapshot_hostd(scratch)
        rev = scanbench._git_rev()
        what = "the working tree" + (" (uncommitted changes)" if rev.endswith("-dirty") else "")
        return {"fingerprint": fp, "rev": rev, "src": scratch, "what": what}
    archive = subprocess.run(
        ["git", "archive", rev, "hostd"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    full = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    fp = scanbench.fingerprint(scratch / "hostd")
    return {"fingerprint": fp, "rev": full, "src": scratch, "what": f"git revision {rev}"}


def measure_arm(name: str, count: int, args: argparse.Namespace, ctx: dict, rep: int = 0):
    """One arm at one background size (its ``rep``-th run): its row, and the problems of
    stopping it."""
    run = rep if args.reps > 1 else None
    busy = scanbench.wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else None
    why = TunedArm.available() if name == "tuned" else None
    if why:
        print(f"  tuned: skipped: {why}", flush=True)
        return ArmResult(count, name, run, error=f"not run: {why}"), []
    if name == "tuned":
        arm = TunedArm(ctx["scratch"], args.ready_timeout)
    elif name == "floor":
        arm = FloorArm(args.ready_timeout)
    else:
        keep = args.logs / f"hostd-{count}-{rep}.log" if args.logs else None
        arm = HostdArm(
            ctx["scratch"], ctx["src"], ctx["scope"], args.ready_timeout, args.agent_nice, keep,
            args.rcvbuf,
        )  # fmt: skip
    failed = True
    with contextlib.ExitStack() as stack:
        try:
            print(f"  {name} run {rep} (CPUs busy before: {busy or 0:.0%})", flush=True)
            row = run_arm(arm, count, args, ctx, stack)
            row.rep = run
            failed = False
        except scanbench.Interrupted:
            raise
        except Exception as exc:  # the next arm or size may still work
            print(f"  {name} FAILED: {exc}", file=sys.stderr, flush=True)
            row = ArmResult(count, name, run, error=str(exc))
        finally:  # also on Interrupted: the workloads first, then the arm
            signal.pthread_sigmask(signal.SIG_BLOCK, scanbench.CAUGHT_SIGNALS)
            try:
                stack.close()
            finally:
                problems = arm.stop(failed)
                for line in problems:
                    print(f"ERROR: {line}", file=sys.stderr, flush=True)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, scanbench.CAUGHT_SIGNALS)
    return row, problems


def bench(args: argparse.Namespace) -> int:
    for signum in scanbench.CAUGHT_SIGNALS:
        signal.signal(signum, scanbench._on_signal)
    scanbench._subreaper()
    rows: list[ArmResult] = []
    problems: list[str] = []
    limits = scanbench.Limits()
    scratch = Path(tempfile.mkdtemp(prefix="hostd-reaction-"))
    failed = False
    try:
        code = _snapshot(scratch / "src", args.hostd_rev)
        print(f"measuring hostd at {code['rev']} (source {code['fingerprint']})", flush=True)
        check = subprocess.run(
            [sys.executable, "-c", AGENT_BOOT, str(code["src"]), "policy", "check", str(POLICY)],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise RuntimeError(f"hostd policy check failed: {check.stdout}{check.stderr}")
        baseline = frozenset(os.sched_getaffinity(0))
        ctx = {
            "baseline": baseline,
            "hot_hint": frozenset({max(baseline)}),  # tuned's CPU until hostd's arm says
            "scratch": scratch,
            "src": code["src"],
            "scope": os.getpid() if args.agent_scope == "bench" else None,
        }
        extra = int(args.storm_rate * (args.storm_life + 1)) + args.rename_samples + 1000
        for count in args.threads:
            limits.ensure(count + extra)
            helpers = scanbench.Helpers(count, args.spawn_timeout)
            print(f"{count:,} background threads: starting {helpers.processes} helpers", flush=True)
            try:
                print(f"  ready after {helpers.start():.1f} s", flush=True)
                for rep in range(args.reps):
                    turn = rep % len(args.arms)  # each repetition in a rotated order
                    for name in args.arms[turn:] + args.arms[:turn]:
                        row, got = measure_arm(name, count, args, ctx, rep)
                        rows.append(row)
                        problems += got
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, scanbench.CAUGHT_SIGNALS)
                helpers.stop()
                signal.pthread_sigmask(signal.SIG_UNBLOCK, scanbench.CAUGHT_SIGNALS)
    except scanbench.Interrupted as exc:
        print(f"interrupted by {exc}: cleaning up", file=sys.stderr)
        failed = True
    except Exception as exc:
        print(f"FAILED: {exc!r}", file=sys.stderr)
        failed = True
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, scanbench.CAUGHT_SIGNALS)
        try:
            problems += limits.restore()
            for line in limits.log:
                print(f"limits: {line}", file=sys.stderr)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, scanbench.CAUGHT_SIGNALS)
    if failed or not rows:
        return 1
    section = render(rows, args, code, limits.log)
    print()
    print(section)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(_jsonable(rows), indent=1, default=str) + "\n")
    if args.write:
        scanbench.write_section(Path(args.write), section, heading=SECTION)
        print(f"wrote the section to {args.write}")
    errors = [r for r in rows if r.error is not None and not r.error.startswith("not run")]
    return 1 if problems or errors else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:  # internal: a workload process
        worker_main(argv[1], json.loads(argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads", type=scanbench._parse_counts, default=[1000, 10000, 100000],
        help="comma-separated background thread counts (default 1000,10000,100000; 10k works)",
    )  # fmt: skip
    parser.add_argument(
        "--arms",
        default="hostd,tuned",
        help="comma-separated: hostd, tuned, floor (bench/floor_reactor.py) (default hostd,tuned)",
    )
    parser.add_argument("--samples", type=int, default=200, help="samples per case (200)")
    parser.add_argument(
        "--first-samples", type=int, default=20,
        help="first-member samples (20; each waits for the layer to give its CPU back)",
    )  # fmt: skip
    parser.add_argument(
        "--tuned-rename-samples", type=int, default=5,
        help="rename samples against tuned, which cannot apply them: each is a miss (5)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds before a miss (2)")
    parser.add_argument("--poll-us", type=float, default=100, help="self-check period (100)")
    parser.add_argument(
        "--gap-ms", type=float, default=10,
        help="random pause before each sample, 0 to this many ms (10)",
    )  # fmt: skip
    parser.add_argument("--storm-rate", type=int, default=10_000, help="threads/s asked (10000)")
    parser.add_argument("--storm-seconds", type=float, default=10, help="storm s (10; 0: none)")
    parser.add_argument("--storm-life", type=float, default=0.3, help="storm thread life (0.3 s)")
    parser.add_argument("--storm-workers", type=int, default=4, help="creating processes (4)")
    parser.add_argument("--settle", type=float, default=10, help="seconds after the storm (10)")
    parser.add_argument(
        "--settle-max", type=float, default=60,
        help="then wait up to this long for the arm to go quiet (60 s)",
    )  # fmt: skip
    parser.add_argument("--steady", type=float, default=60, help="steady-state window (60 s)")
    parser.add_argument(
        "--agent-scope", choices=("bench", "host"), default="bench",
        help="bench: hostd run --scope-pid (this benchmark's process tree, the default: the "
        "catch-all layer would otherwise pin every process of a shared machine); host: all",
    )  # fmt: skip
    parser.add_argument("--hostd-rev", help="measure hostd/ of this git revision (default: tree)")
    parser.add_argument(
        "--agent-nice", type=int, help="the agent's [agent] nice (default: the policy's, -10)"
    )
    parser.add_argument(
        "--rcvbuf", type=int, metavar="BYTES",
        help="the agent's event buffer (HOSTD_CONNECTOR_RCVBUF; default the agent's): a small "
        "one makes a storm that this machine cannot make fast enough overflow it, so that the "
        "runs include overflow rescans",
    )  # fmt: skip
    parser.add_argument(
        "--ready-timeout", type=float, default=600,
        help="seconds to wait for the arm's first pass, its exit and the like (600)",
    )  # fmt: skip
    parser.add_argument(
        "--quiet-wait", type=float, default=30,
        help="before each arm wait up to this many seconds for the CPUs to go idle (30)",
    )  # fmt: skip
    parser.add_argument("--spawn-timeout", type=float, default=900, help="helpers' start (900 s)")
    parser.add_argument(
        "--reps", type=int, default=1, help="runs of every arm per size, interleaved (1)"
    )
    parser.add_argument(
        "--logs", type=Path, metavar="DIR",
        help="keep each run's agent log (run with -v) in DIR as hostd-<threads>-<rep>.log",
    )  # fmt: skip
    parser.add_argument("--write", metavar="FILE", help="replace the section in FILE")
    parser.add_argument("--json-out", metavar="FILE", help="also write the raw results as JSON")
    parser.add_argument(
        "--quick", action="store_true",
        help="smoke run: 1k threads, 20 samples, 2 s storm, 3 s settle, 10 s steady",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.threads, args.samples, args.storm_seconds = [1000], 20, 2.0
        args.settle, args.settle_max, args.steady, args.tuned_rename_samples = 3.0, 15.0, 10.0, 3
    args.arms = [a for a in args.arms.split(",") if a]
    if not args.arms or set(args.arms) - {"hostd", "tuned", "floor"}:
        parser.error("--arms: hostd and/or tuned")
    if args.samples < 1 or args.storm_workers < 1 or args.timeout <= 0 or args.reps < 1:
        parser.error("--samples, --storm-workers, --timeout and --reps must be positive")
    if args.logs:
        args.logs = args.logs.resolve()
        args.logs.mkdir(parents=True, exist_ok=True)
    args.rename_samples = max(args.samples, args.tuned_rename_samples)
    if os.geteuid() != 0:
        print("bench/reaction.py needs root (it runs the agent and tuned)", file=sys.stderr)
        return 2
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())

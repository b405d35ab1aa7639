#!/usr/bin/env python3
"""Benchmark of one full observe pass (topology, scan, classify, plan) over many real threads.

Run as root from the repository root::

    python3 bench/scan.py [--threads 1000,10000,100000] [--repeat 3] [--write BENCHMARKS.md]

For each thread count it starts a tree of helper processes (in a session of their own) whose idle
threads (64 KiB stacks, blocked on an Event) add up to exactly that many threads, shaped like a
real PyTorch job (see FACTS.md): a launcher ``pt_elastic`` with a ``pt_tcpstore_uv`` thread, two
ranks exec'd with torchrun's environment (``python3`` threads plus ``gloo_tcp_loop``,
``pt_gloo_runloop``, ``pt_autograd_0``), a ``pt_data_worker`` process below each rank, and the
bulk as unrelated ``python3`` processes. Once every helper reports ready (and /proc/PID/task
counts agree), each repetition runs in a FRESH measuring subprocess: ``read_topology(Host())``,
``scan(Host(), read_fds=policy.needs_fds)``, ``Classifier(policy).classify_all(tasks)``,
``plan(topo, classified, policy)`` with the default policy, each stage timed with
``time.perf_counter``, plus its peak RSS (VmHWM; ``ru_maxrss`` as well); and the agent's own
full pass (``Agent.pass_once``, observe mode) a second time in one process, as its rescans
are. The baselines are timed the same way in fresh subprocesses: psutil's ``process_iter`` +
``threads()`` (the obvious peer, which yields only tid/utime/stime), psutil asked for the same
per-thread facts hostd collects (``psutil-full``), and the floors: a Python and a C loop that
read each thread's ``stat`` and nothing else.

100k threads need more pids than kernel.pid_max = 32768 allows: the script raises
kernel.pid_max (and kernel.threads-max, vm.max_map_count, RLIMIT_NPROC when they are too low),
restores every value it changed in a ``finally`` (SIGINT, SIGTERM and SIGHUP are turned into
exceptions so that it runs; SIGKILL cannot be caught) and kills the whole helper session at the
end of each thread count. Never part of the test suite (see bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import platform
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC_ENV = "HOSTD_BENCH_SRC"  # where the measuring process imports hostd from
SECTION = "## Scan pass (bench/scan.py)"
GOAL_THREADS = 100_000
GOAL_SECONDS = 3.0
GOAL_RSS_MB = 200.0
GOAL_OF_WALK = 0.85  # issue 48: a full pass in at most this share of psutil's walk
STACK_SIZE = 64 * 1024
MAX_THREADS_PER_PROCESS = 5000  # 2 VMAs per thread stack: far below vm.max_map_count
PID_MAX_LIMIT = 4 * 1024 * 1024  # PID_MAX_LIMIT on 64-bit kernels
PR_SET_CHILD_SUBREAPER = 36
CAUGHT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KINDS = {
    "hostd": "hostd full pass",
    "hostd-again": "hostd agent's full pass, again",
    "psutil": "psutil process_iter + threads()",
    "psutil-full": "psutil, same facts per thread",
    "py-floor": "Python floor: each thread's stat read",
    "c-floor": "C floor: each thread's stat read",
}
# The floors: the least a walk does, one read of each thread's stat and nothing else.
PY_FLOOR = r"""
import os, time
t0 = time.perf_counter()
n = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        continue
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                fh.read()
            n += 1
        except OSError:
            pass
print(n, time.perf_counter() - t0)
"""
C_FLOOR = r"""
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(void) {
    struct timespec a, b; char path[96], buf[1024]; long n = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    DIR *proc = opendir("/proc"); struct dirent *p;
    while ((p = readdir(proc))) {
        if (p->d_name[0] < '0' || p->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/task", p->d_name);
        DIR *task = opendir(path); struct dirent *t;
        if (!task) continue;
        while ((t = readdir(task))) {
            if (t->d_name[0] < '0' || t->d_name[0] > '9') continue;
            snprintf(path, sizeof path, "/proc/%s/task/%s/stat", p->d_name, t->d_name);
            int fd = open(path, O_RDONLY);
            if (fd < 0) continue;
            if (read(fd, buf, sizeof buf) > 0) n++;
            close(fd);
        }
        closedir(task);
    }
    closedir(proc);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%ld %f\n", n, (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
"""


# -- the helper tree ---------------------------------------------------------------------------
# A process spec: {"comm": str, "threads": [[name, count], ...], "children": [spec, ...]}; the
# first name is the main thread's (the process comm), and the counts include the main thread.


def _proc(
    comm: str, threads: list[list], children: list[dict] | None = None, env: dict | None = None
) -> dict:
    """``env``: the process execs itself with these variables added (a rank's environment
    shows in /proc/PID/environ only from an exec, as torchrun starts its ranks)."""
    return {"comm": comm, "threads": threads, "children": children or [], "env": env or {}}


def torchrun_env(rank: int, world: int) -> dict[str, str]:
    """What torchrun (torch.distributed.run) gives each rank it starts."""
    return {
        "LOCAL_RANK": str(rank), "RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(world), "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCHELASTIC_ERROR_FILE": f"/tmp/torchelastic_bench/none/attempt_0/{rank}/error.json",
        "OMP_NUM_THREADS": "1",
    }  # fmt: skip


def workload(total: int) -> dict:
    """A helper tree whose processes hold exactly ``total`` threads (``total`` >= 20)."""
    if total < 20:
        raise ValueError("at least 20 threads")
    rank_threads = max(6, total // 20)  # two ranks: 10 %
    data_threads = max(2, total // 40)  # two DataLoader-worker processes: 5 %
    # Each rank with torchrun's environment and its DataLoader worker below it (forked by the
    # rank, sharing its environment), as a job's tree is on a node.
    ranks = [
        _proc(
            "python3",
            [
                ["python3", rank_threads - 4],
                ["gloo_tcp_loop", 2],
                ["pt_gloo_runloop", 1],
                ["pt_autograd_0", 1],
            ],
            [_proc("pt_data_worker", [["pt_data_worker", data_threads]])],
            env=torchrun_env(rank, 2),
        )
        for rank in range(2)
    ]
    launcher = _proc("pt_elastic", [["pt_elastic", 1], ["pt_tcpstore_uv", 1]], ranks)
    rest = total - 1 - 2 - 2 * rank_threads - 2 * data_threads  # root, launcher, job
    nproc = max(1, -(-rest // MAX_THREADS_PER_PROCESS))
    idle = []
    for i in range(nproc):
        n = rest // nproc + (1 if i < rest % nproc else 0)
        extra = min(n - 1, 3)  # a few non-python names in each, as in real services
        names = [["python3", n - extra]]
        names += [[name, 1] for name in ("ThreadPoolExecu", "grpc_global_tim", "jemalloc_bg_thd")]
        idle.append(_proc("python3", names[: 1 + extra]))
    return _proc("scan_helpers", [["scan_helpers", 1]], [launcher, *idle])


def _count(spec: dict, what: str) -> int:
    own = sum(n for _, n in spec["threads"]) if what == "threads" else 1
    return own + sum(_count(c, what) for c in spec["children"])


def _set_comm(tid: int | str, name: str) -> None:
    fd = os.open(f"/proc/self/task/{tid}/comm", os.O_WRONLY)
    try:
        os.write(fd, name.encode()[:15])
    finally:
        os.close(fd)


def _run_helper(spec: dict, ready_fd: int) -> None:
    """Become the process ``spec`` describes (forking its children first), then block."""
    import threading

    _set_comm(threading.get_native_id(), spec["comm"])
    kids = []
    for child in spec["children"]:
        pid = os.fork()  # still single-threaded here: forking is safe
        if pid == 0:
            code = 0
            try:
                if child.get("env"):  # exec'd with it, as a launcher starts a rank
                    os.set_inheritable(ready_fd, True)
                    argv = [sys.executable, __file__, "--_helpers"]
                    again = {**child, "env": {}}
                    os.execve(sys.executable, [*argv, json.dumps(again), str(ready_fd)],
                              {**os.environ, **child["env"]})  # fmt: skip
                _run_helper(child, ready_fd)
            except BaseException as exc:
                print(f"helper {child['comm']}: {exc!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        kids.append(pid)
    threading.stack_size(STACK_SIZE)
    stop = threading.Event()
    names = [name for name, n in spec["threads"] for _ in range(n)][1:]
    for name in names:
        thread = threading.Thread(target=stop.wait, daemon=True)
        thread.start()
        _set_comm(thread.native_id, name)
    os.write(ready_fd, b".")
    for _ in kids:  # a helper that fails takes its parents down, so the benchmark notices
        _, status = os.wait()
        if status != 0:
            os._exit(1)
    while True:
        signal.pause()


def _session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (field 6 of /proc/PID/stat)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                text = fh.read()
        except OSError:
            continue
        fields = text[text.rindex(b")") + 2 :].split()
        if int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def _thread_count(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += sum(1 for e in os.listdir(f"/proc/{pid}/task") if e.isdigit())
    return total


class Helpers:
    """A running helper tree (one session, one process group); ``stop`` kills and reaps it."""

    def __init__(self, threads: int, timeout: float) -> None:
        self.spec = workload(threads)
        self.threads = _count(self.spec, "threads")
        self.processes = _count(self.spec, "processes")
        self.timeout = timeout
        self.root: subprocess.Popen | None = None

    def start(self) -> float:
        """Start the tree and wait until every thread exists; the seconds that took."""
        t0 = time.perf_counter()
        read_fd, write_fd = os.pipe()
        try:
            self.root = subprocess.Popen(
                [sys.executable, __file__, "--_helpers", json.dumps(self.spec), str(write_fd)],
                pass_fds=(write_fd,),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
            os.close(write_fd)
            write_fd = -1
            ready = 0
            while ready < self.processes:
                if time.perf_counter() - t0 > self.timeout:
                    raise RuntimeError(f"helpers not ready after {self.timeout:.0f} s")
                if self.root.poll() is not None:
                    raise RuntimeError(f"helper tree exited ({self.root.returncode})")
                if select.select([read_fd], [], [], 1.0)[0]:
                    chunk = os.read(read_fd, 4096)
                    if not chunk:
                        raise RuntimeError("helper tree closed its ready pipe")
                    ready += len(chunk)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        seen = _thread_count(_session_pids(self.root.pid))
        if seen != self.threads:
            raise RuntimeError(f"helpers hold {seen} threads, expected {self.threads}")
        return time.perf_counter() - t0

    def stop(self) -> None:
        """SIGKILL the whole session and reap it (this process is their subreaper)."""
        if self.root is None:
            return
        sid = self.root.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGKILL)
        self.root.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            left = _session_pids(sid)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        else:
            print(f"WARNING: helper processes still alive: {_session_pids(sid)}", file=sys.stderr)
        self.root = None


# -- kernel limits -----------------------------------------------------------------------------
class Interrupted(Exception):
    """A caught signal, raised so that every ``finally`` runs."""


def _on_signal(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _read_int(path: str) -> int:
    with open(path) as fh:
        return int(fh.read().split()[0])


def _write_sysctl(path: str, value: int) -> None:
    fd = os.open(path, os.O_WRONLY)  # unbuffered: the kernel's refusal surfaces here
    try:
        os.write(fd, f"{value}\n".encode())
    finally:
        os.close(fd)
    if _read_int(path) != value:
        raise OSError(f"{path} did not take {value}")


def _host_threads() -> int:
    return _thread_count([int(e) for e in os.listdir("/proc") if e.isdigit()])


def _pids_cgroup_max() -> int | None:
    """pids.max of this process's v1 pids cgroup, or None when unlimited or not found."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "pids" in ctrls.split(","):
                text = Path(f"/sys/fs/cgroup/pids{path}/pids.max").read_text().strip()
                return None if text == "max" else int(text)
    return None


def _in_initial_user_ns() -> bool:
    try:
        with open("/proc/self/uid_map") as fh:
            return fh.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


@dataclass
class Limits:
    """Raises kernel limits as needed and remembers the originals; ``restore`` undoes it."""

    sysctls: dict[str, int] = field(default_factory=dict)  # path -> original
    nproc: tuple[int, int] | None = None
    log: list[str] = field(default_factory=list)

    def _raise(self, path: str, needed: int, value: int) -> None:
        current = _read_int(path)
        if current >= needed:
            return
        self.sysctls.setdefault(path, current)
        _write_sysctl(path, value)
        self.log.append(f"{path}: {current} -> {value}")

    def ensure(self, threads: int) -> None:
        busy = _host_threads()
        needed = busy + threads + 4096  # the measuring process and some slack
        cap = _pids_cgroup_max()
        if cap is not None and cap < needed:
            raise RuntimeError(f"the pids cgroup allows {cap} tasks, {needed} needed")
        # pids are handed out cyclically up to pid_max: leave plenty of room.
        pid_max = min(PID_MAX_LIMIT, max(2 * needed, 65536))
        self._raise("/proc/sys/kernel/pid_max", needed, pid_max)
        self._raise("/proc/sys/kernel/threads-max", needed, 2 * needed)
        per_process = 2 * MAX_THREADS_PER_PROCESS + 4096
        self._raise("/proc/sys/vm/max_map_count", per_process, 2 * per_process)
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft == resource.RLIM_INFINITY or soft >= needed:
            return
        if self.nproc is None:
            self.nproc = (soft, hard)
        new_hard = hard if hard == resource.RLIM_INFINITY else max(hard, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (needed, new_hard))
            self.log.append(f"RLIMIT_NPROC: {soft} -> {needed}")
            return
        except (OSError, ValueError):
            pass  # raising the hard limit needs CAP_SYS_RESOURCE
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
            self.log.append(f"RLIMIT_NPROC: {soft} -> {hard} (its hard limit)")
        # fork(2) ignores RLIMIT_NPROC for uid 0 of the initial user namespace (and with
        # CAP_SYS_ADMIN): copy_process() in kernel/fork.c.
        if os.getuid() == 0 and _in_initial_user_ns():
            self.log.append(f"RLIMIT_NPROC {soft} left as it is: not enforced for root")
            return
        raise RuntimeError(f"RLIMIT_NPROC is {soft} (hard {hard}), {needed} threads needed")

    def restore(self) -> list[str]:
        """Put every changed value back; the problems (empty when all went well)."""
        problems = []
        for path, original in reversed(list(self.sysctls.items())):
            try:
                _write_sysctl(path, original)
                self.log.append(f"{path}: restored {original}")
            except OSError as exc:
                problems.append(f"{path}: could not restore {original}: {exc}")
        self.sysctls.clear()
        if self.nproc is not None:
            try:
                resource.setrlimit(resource.RLIMIT_NPROC, self.nproc)
                self.log.append(f"RLIMIT_NPROC: restored {self.nproc[0]}")
            except (OSError, ValueError) as exc:
                problems.append(f"RLIMIT_NPROC: could not restore {self.nproc}: {exc}")
            self.nproc = None
        return problems


# -- one measured pass, in a fresh process -----------------------------------------------------
def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _profiled(profiler) -> dict[str, str]:
    """A stopped profile's top 15 functions, by cumulative and by own time."""
    import io
    import pstats

    profiler.disable()
    out = {}
    for order in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(order).print_stats(15)
        out[f"profile_{order}"] = buf.getvalue()
    return out


def _measure_hostd(profile: bool) -> dict:
    # The snapshot of hostd taken when the benchmark started (see snapshot_hostd), else the
    # working tree's; never whatever happens to be installed.
    sys.path.insert(0, os.environ.get(SRC_ENV) or str(REPO))
    from hostd.classify import Classifier
    from hostd.host import Host
    from hostd.plan import plan
    from hostd.policy import load_default
    from hostd.tasks import scan
    from hostd.topology import read_topology

    policy = load_default()
    rss_start = _status_kb("VmRSS")
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    clock = time.perf_counter
    c0 = time.process_time()
    t0 = clock()
    topo = read_topology(Host())
    t1 = clock()
    tasks = scan(Host(), read_fds=policy.needs_fds)
    t2 = clock()
    classified = Classifier(policy).classify_all(tasks)
    t3 = clock()
    result = plan(topo, classified, policy)
    t4 = clock()
    cpu = time.process_time() - c0
    out = {
        "topology": t1 - t0,
        "scan": t2 - t1,
        "classify": t3 - t2,
        "plan": t4 - t3,
        "total": t4 - t0,
        "cpu": cpu,
        "tasks": len(tasks),
        "processes": len({t.pid for t in tasks}),
        "planned": len(result.tasks),
        "rss_start_kb": rss_start,
        "hostd_src": str(Path(sys.modules["hostd"].__file__).parent.parent),
    }
    if profiler is not None:
        out.update(_profiled(profiler))
    return out


def _measure_agent(profile: bool) -> dict:
    """The agent's full pass as its loop runs it (``hostd.agent.loop.full``: ``Agent.pass_once``
    in observe mode, nothing written, then the collection and freeze of what it keeps, under the
    agent's collector thresholds) a second time in one process, as every overflow and drift
    rescan is: what a pass need not repeat (what an unnamed thread was seen doing) is not
    repeated. Its stages timed by wrapping them."""
    sys.path.insert(0, os.environ.get(SRC_ENV) or str(REPO))
    import gc

    import hostd.agent.core as core
    import hostd.agent.loop as loop
    from hostd.agent.core import Agent
    from hostd.host import Host

    clock = time.perf_counter
    spent: dict[str, float] = {}

    def timed(name: str, fn):
        def run(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + clock() - t0

        return run

    core.read_topology = timed("topology", core.read_topology)
    core.plan = timed("plan", core.plan)
    loop.parts.freeze = timed("gc", loop.parts.freeze)
    gc.set_threshold(*loop.GC_THRESHOLD)  # as ``hostd.agent.loop.run`` sets them
    with tempfile.TemporaryDirectory(prefix="hostd-bench-agent-") as tmp:
        agent = Agent(Host(), None, state_dir=f"{tmp}/state", run_dir=f"{tmp}/run",
                      mode="observe")  # fmt: skip
        agent.cache.rescan = timed("scan", agent.cache.rescan)
        agent.classifier.classify_all = timed("classify", agent.classifier.classify_all)
        agent.reconcile = timed("reconcile", agent.reconcile)
        rss_start = _status_kb("VmRSS")
        t0 = clock()
        loop.full(agent, "start")
        first = clock() - t0
        spent.clear()
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        c0 = time.process_time()
        t0 = clock()
        loop.full(agent, "drift")
        total = clock() - t0
        cpu = time.process_time() - c0
        tasks = len(agent.cache.tasks)
        processes = len(agent.cache.procs)
        agent.journal.close()
        agent.status.close()
    out = {**spent, "total": total, "first": first, "cpu": cpu, "tasks": tasks,
           "processes": processes, "rss_start_kb": rss_start}  # fmt: skip
    out["other"] = total - sum(spent.values())
    if profiler is not None:
        out.update(_profiled(profiler))
    return out


def _measure_psutil(full: bool) -> dict:
    import psutil

    attrs = [
        "name", "status", "uids", "gids", "nice", "cpu_affinity", "num_ctx_switches",
        "cpu_times", "cpu_num",
    ]  # fmt: skip
    rss_start = _status_kb("VmRSS")
    clock = time.perf_counter
    c0 = time.process_time()
    t0 = clock()
    seen = 0
    facts = []
    for proc in psutil.process_iter(["name", "ppid", "cmdline"]):
        try:
            threads = proc.threads()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        seen += len(threads)
        if not full:
            continue
        for thread in threads:  # psutil treats a tid as a pid on Linux
            try:
                facts.append(psutil.Process(thread.id).as_dict(attrs))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    t1 = clock()
    cpu = time.process_time() - c0
    return {"total": t1 - t0, "cpu": cpu, "tasks": seen, "rss_start_kb": rss_start}


def _measure_floor(kind: str) -> dict:
    """A floor, run as its own program (Python, or C built with the system's cc)."""
    rss_start = _status_kb("VmRSS")
    with tempfile.TemporaryDirectory(prefix="hostd-bench-floor-") as tmp:
        if kind == "py-floor":
            cmd = [sys.executable, "-c", PY_FLOOR]
        else:
            src, exe = Path(tmp) / "floor.c", Path(tmp) / "floor"
            src.write_text(C_FLOOR)
            subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
            cmd = [str(exe)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    return {"total": float(out[1]), "cpu": float(out[1]), "tasks": int(out[0]),
            "rss_start_kb": rss_start}  # fmt: skip


def measure(kind: str, profile: bool) -> dict:
    if kind == "hostd":
        out = _measure_hostd(profile)
    elif kind == "hostd-again":
        out = _measure_agent(profile)
    elif kind.endswith("-floor"):
        out = _measure_floor(kind)
    else:
        out = _measure_psutil(full=kind == "psutil-full")
    out["hwm_kb"] = _status_kb("VmHWM")
    out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


def _cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host since boot, from /proc/stat (proc(5))."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / hz, sum(fields) / hz


def wait_quiet(max_wait: float, threshold: float = 0.15) -> float:
    """Wait (at most ``max_wait`` s) until the host's CPUs are below ``threshold`` busy over
    half a second; the last busy fraction seen. The machines are shared: other work skews a pass.
    """
    deadline = time.monotonic() + max_wait
    while True:
        b0, t0 = _cpu_seconds()
        time.sleep(0.5)
        b1, t1 = _cpu_seconds()
        busy = (b1 - b0) / max(t1 - t0, 1e-9)
        if busy < threshold or time.monotonic() >= deadline:
            return busy


def fingerprint(package: Path) -> str:
    """A short hash of every .py and .toml file below ``package`` (which code was measured)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def snapshot_hostd(dest: Path) -> str:
    """Copy the working tree's hostd package below ``dest``; its fingerprint.

    Every run of one benchmark then measures the same code, even while someone edits hostd/.
    """
    shutil.copytree(
        REPO / "hostd", dest / "hostd", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    return fingerprint(dest / "hostd")


def run_measure(
    kind: str, profile: bool = False, timeout: float = 1800, quiet_wait: float = 0
) -> dict:
    cmd = [sys.executable, __file__, "--_measure", kind]
    if profile:
        cmd.append("--_profile")
    busy_before = wait_quiet(quiet_wait) if quiet_wait > 0 else None
    busy0, _ = _cpu_seconds()
    child0 = os.times()
    wall0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    wall = time.monotonic() - wall0
    busy1, _ = _cpu_seconds()
    child1 = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {kind} failed ({proc.returncode}):\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    src = os.environ.get(SRC_ENV)
    if kind == "hostd" and src and out["hostd_src"] != src:
        raise RuntimeError(f"measured hostd from {out['hostd_src']}, not the snapshot {src}")
    own = (child1.children_user + child1.children_system) - (
        child0.children_user + child0.children_system
    )
    # CPUs that other work kept busy while the measuring process ran (noise indicator).
    out["other_cpus"] = max(0.0, (busy1 - busy0) - own) / max(wall, 1e-9)
    out["busy_before"] = busy_before
    return out


# -- report ------------------------------------------------------------------------------------
@dataclass
class Row:
    threads: int
    kind: str
    runs: list[dict]
    spawn_s: float

    def med(self, key: str) -> float:
        return statistics.median(r[key] for r in self.runs)

    def max(self, key: str) -> float:
        return max(r[key] for r in self.runs)

    @property
    def tasks(self) -> int:
        return max(r["tasks"] for r in self.runs)

    @property
    def per_thread_us(self) -> float:
        return self.med("total") / self.tasks * 1e6

    @property
    def peak_mb(self) -> float:
        return self.max("hwm_kb") / 1024


def _git_rev() -> str:
    """``git describe --always --dirty`` of the working tree ("?" outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
        )
    except OSError:
        return "?"
    return out.stdout.strip() or "?"


def _machine(code: dict) -> list[str]:
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        import psutil

        psutil_version = psutil.__version__
    except ImportError:
        psutil_version = "not installed"
    return [
        f"- CPU: {model}, {os.cpu_count()} CPUs online",
        f"- memory: {mem_gib:.1f} GiB",
        f"- kernel: {platform.release()}",
        f"- Python {platform.python_version()}, psutil {psutil_version}",
        f"- hostd: the working tree at `{code['rev']}` (a `-dirty` tree has uncommitted "
        f"changes), copied when the run started (source fingerprint `{code['fingerprint']}`, "
        "sha256 of hostd's .py/.toml files) so that every pass measured the same code; "
        f"measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]


def _fmt(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def render(
    rows: list[Row],
    repeat: int,
    full_repeat: int,
    limits_log: list[str],
    profile: dict | None,
    code: dict,
) -> str:
    hostd_rows = [r for r in rows if r.kind == "hostd"]
    lines = [
        SECTION,
        "",
        f"Goal (the scan issue): at {GOAL_THREADS:,} threads a full pass in at most "
        f"{GOAL_SECONDS:g} s and at most {GOAL_RSS_MB:g} MB RSS.",
        "",
    ]
    walk = {r.threads: r for r in rows if r.kind == "psutil"}
    for r in (r for r in rows if r.kind in ("hostd", "hostd-again") and r.threads in walk):
        ratio = r.med("total") / walk[r.threads].med("total")
        lines += [
            f"**{KINDS[r.kind]} at {r.threads:,} threads: {ratio:.2f} of psutil's walk** "
            f"({r.med('total'):.2f} s against {walk[r.threads].med('total'):.2f} s, medians; "
            f"issue 48's goal: at most {GOAL_OF_WALK:g} at {GOAL_THREADS:,}: "
            + ("met" if ratio <= GOAL_OF_WALK else "not met")
            + ").",
            "",
        ]
    goal_row = next((r for r in hostd_rows if r.threads == GOAL_THREADS), None)
    if goal_row is not None:
        t_ok = goal_row.med("total") <= GOAL_SECONDS
        m_ok = goal_row.peak_mb <= GOAL_RSS_MB
        verdict = "MET" if t_ok and m_ok else "MISSED"
        lines += [
            f"**Result at {GOAL_THREADS:,} threads: {verdict}**: "
            f"{goal_row.med('total'):.2f} s median ({'ok' if t_ok else 'over'}), "
            f"{goal_row.peak_mb:.0f} MB peak RSS ({'ok' if m_ok else 'over'}).",
            "",
        ]
    lines += [
        "Method: for each thread count `bench/scan.py` starts a tree of helper processes "
        "(their own session; idle threads with 64 KiB stacks blocked on an Event) holding "
        "exactly that many threads, shaped like a PyTorch job: launcher `pt_elastic` (+ "
        "`pt_tcpstore_uv`), two ranks exec'd with torchrun's environment (`RANK`, "
        "`LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `TORCHELASTIC_RUN_ID`, ...; 10 % of the "
        "threads: `python3` (unnamed), `gloo_tcp_loop`, `pt_gloo_runloop`, `pt_autograd_0`), "
        "each with a `pt_data_worker` process below it (5 % in all), the rest "
        f"unrelated `python3` processes of at most {MAX_THREADS_PER_PROCESS} threads. When "
        "every helper is ready (and the /proc/PID/task counts agree), each repetition runs in"
        " a fresh measuring subprocess: `read_topology(Host())`, `scan(Host(), "
        "read_fds=policy.needs_fds)`, `Classifier(policy).classify_all(tasks)`, `plan(topo, "
        "classified, policy)` with the default policy, each stage timed with "
        "`time.perf_counter` (imports and policy loading not counted); `CPU s` is the pass's "
        "`time.process_time`. Peak RSS is the measuring process's VmHWM (the whole process: "
        "interpreter, imports and the pass). `tasks` is every thread the pass saw (the "
        "helpers plus the rest of the host); `planned tasks` is how many threads the plan "
        f"lists (those with something to change). Times are the median of {repeat} runs "
        f"(psutil-full: {full_repeat}), the total also with its max; per-thread us = median "
        "total / tasks. The machine is shared: before each run the script waits (up to "
        "`--quiet-wait` s) for the CPUs to go idle, and `other load` is the median number of "
        "CPUs other work kept busy during the runs (host busy time from /proc/stat minus the "
        "measuring process's own CPU time, over its wall time); a run with other load near a "
        "whole CPU is slower than the code is.",
        "",
        "Machine:",
        "",
        *_machine(code),
        "",
        "| threads | tasks | topology s | scan s | classify s | plan s | total s (median / max) "
        "| CPU s | peak RSS MB | per-thread us | planned tasks | other load, CPUs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in hostd_rows:
        lines.append(
            f"| {r.threads:,} | {r.tasks:,} | {_fmt(r.med('topology'))} | {_fmt(r.med('scan'))} "
            f"| {_fmt(r.med('classify'))} | {_fmt(r.med('plan'))} "
            f"| {_fmt(r.med('total'))} / {_fmt(r.max('total'))} | {_fmt(r.med('cpu'))} "
            f"| {r.peak_mb:.0f} | {r.per_thread_us:.1f} | {r.runs[0]['planned']:,} "
            f"| {r.med('other_cpus'):.2f} |"
        )
    again = [r for r in rows if r.kind == "hostd-again"]
    if again:
        lines += [
            "",
            "The agent's full pass as its loop runs it (`hostd.agent.loop.full`: "
            "`Agent.pass_once` in observe mode, nothing written: the topology, "
            "`TaskCache.rescan`, classify, plan, the desired state and reconcile's reads; then "
            "the collection and freeze of what the agent keeps, `gc`; the agent's collector "
            "thresholds), a second time in the same fresh process, as every event overflow and "
            "drift rescan is; `first` is the same process's first pass (what a start costs). "
            "Stages timed by wrapping them; `other` is the rest of the pass (the task planner, "
            "the desired state, the status).",
            "",
            "| threads | tasks | first s | topology s | scan s | classify s | plan s | "
            "reconcile s | gc s | other s | total s (median / max) | CPU s | peak RSS MB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in again:
            lines.append(
                f"| {r.threads:,} | {r.tasks:,} | {_fmt(r.med('first'))} "
                + " ".join(f"| {_fmt(r.med(k))}" for k in
                           ("topology", "scan", "classify", "plan", "reconcile", "gc", "other"))
                + f" | {_fmt(r.med('total'))} / {_fmt(r.max('total'))} | {_fmt(r.med('cpu'))} "
                f"| {r.peak_mb:.0f} |"
            )  # fmt: skip
    base_rows = [r for r in rows if r.kind != "hostd"]
    if base_rows:
        lines += [
            "",
            "Every pass side by side, against psutil's walk in the same run. The floors read "
            "each thread's `stat` once and nothing else (Python: `os.listdir` and `open`; C: "
            "`readdir`, `open`, `read`, built with the system's `cc -O2`), timed inside their "
            "own program (their peak RSS is the wrapper's). "
            "Baseline, timed the same way (fresh subprocess, same helper threads): "
            "`psutil.process_iter(['name', 'ppid', 'cmdline'])` + `Process.threads()` (the "
            "obvious peer: it yields only tid, utime and stime per thread), and psutil asked for "
            "the facts hostd collects per thread (`psutil.Process(tid).as_dict(['name', "
            "'status', 'uids', 'gids', 'nice', 'cpu_affinity', 'num_ctx_switches', 'cpu_times', "
            "'cpu_num'])`, no classification or plan).",
            "",
            "| threads | tool | tasks | total s (median / max) | peak RSS MB | per-thread us "
            "| vs psutil's walk | other load, CPUs |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        order = list(KINDS)
        for r in sorted(rows, key=lambda r: (r.threads, order.index(r.kind))):
            ref = walk.get(r.threads)
            ratio = f"{r.med('total') / ref.med('total'):.2f}" if ref else "-"
            lines.append(
                f"| {r.threads:,} | {KINDS[r.kind]} | {r.tasks:,} "
                f"| {_fmt(r.med('total'))} / {_fmt(r.max('total'))} | {r.peak_mb:.0f} "
                f"| {r.per_thread_us:.1f} | {ratio} | {r.med('other_cpus'):.2f} |"
            )
    spawn = sorted({(r.threads, r.spawn_s) for r in rows})
    lines += [
        "",
        "Starting the helper threads took "
        + ", ".join(f"{s:.1f} s for {n:,}" for n, s in spawn)
        + " (not part of any timing).",
    ]
    changed = [line for line in limits_log if "restored" not in line]
    if changed:
        lines += [
            "Kernel limits for the run: " + "; ".join(changed) + " (every changed value was "
            "restored at the end)."
        ]
    if profile:
        lines += [
            "",
            f"### cProfile of the agent's second full pass at {profile['threads']:,} threads",
            "",
            f"Under the profiler the pass took {profile['total']:.1f} s "
            f"(scan {profile['scan']:.1f} s, classify {profile['classify']:.1f} s, "
            f"plan {profile['plan']:.1f} s, reconcile {profile['reconcile']:.1f} s); profiling "
            "inflates per-call costs.",
            "",
        ]
        for order in ("tottime", "cumulative"):
            text = profile[f"profile_{order}"].strip("\n")
            body = text[text.find("ncalls") :] if "ncalls" in text else text
            lines += [f"Top 15 by {order}:", "", "```", body.rstrip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_section(path: Path, section: str, heading: str = SECTION) -> None:
    """Replace the section ``heading`` (up to the next "## " heading) in ``path``, or append it.

    bench/reaction.py writes its own section through this too.
    """
    text = path.read_text() if path.exists() else "# Benchmarks\n\nResults of `bench/`.\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    path.write_text(new)


# -- main --------------------------------------------------------------------------------------
def _parse_counts(text: str) -> list[int]:
    counts = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if part.endswith("k"):
            counts.append(int(float(part[:-1]) * 1000))
        elif part:
            counts.append(int(part))
    if not counts or min(counts) < 20:
        raise argparse.ArgumentTypeError("thread counts of at least 20")
    return counts


def _print_row(row: Row) -> None:
    r = row.runs[-1]
    stages = " ".join(
        f"{k}={r[k]:.3f}s" for k in ("topology", "scan", "classify", "plan") if k in r
    )
    print(
        f"  {row.kind:12s} run {len(row.runs)}: total={r['total']:.3f}s {stages} "
        f"tasks={r['tasks']} hwm={r['hwm_kb'] / 1024:.0f}MB other={r['other_cpus']:.2f}CPU",
        flush=True,
    )


def _subreaper() -> None:
    """Make orphaned helpers our children, so that we can reap every one of them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("warning: PR_SET_CHILD_SUBREAPER failed", file=sys.stderr)


def bench(args: argparse.Namespace) -> int:
    baselines = [k for k in args.baselines.split(",") if k and k != "none"]
    kinds = ["hostd", "hostd-again", *baselines]
    for kind in baselines:
        if kind not in KINDS or kind.startswith("hostd"):
            raise SystemExit(
                f"unknown baseline {kind!r} (psutil, psutil-full, py-floor, c-floor or none)"
            )
    rows: list[Row] = []
    profile: dict | None = None
    limits = Limits()
    helpers: Helpers | None = None
    for signum in CAUGHT_SIGNALS:
        signal.signal(signum, _on_signal)
    _subreaper()
    failed = False
    problems: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix="hostd-bench-"))
    code = {"fingerprint": snapshot_hostd(scratch), "rev": _git_rev()}
    os.environ[SRC_ENV] = str(scratch)
    print(f"measuring hostd at {code['rev']} (source {code['fingerprint']})", flush=True)
    try:
        for count in args.threads:
            limits.ensure(count)
            helpers = Helpers(count, args.spawn_timeout)
            print(f"{count:,} threads: starting {helpers.processes} helper processes", flush=True)
            spawn_s = helpers.start()
            print(f"  ready after {spawn_s:.1f} s", flush=True)
            for kind in kinds:
                row = Row(count, kind, [], spawn_s)
                rows.append(row)
                repeat = args.full_repeat if kind == "psutil-full" else args.repeat
                for _ in range(repeat):
                    row.runs.append(run_measure(kind, quiet_wait=args.quiet_wait))
                    _print_row(row)
            if args.profile and count == max(args.threads):
                profile = run_measure("hostd-again", profile=True, quiet_wait=args.quiet_wait)
                profile["threads"] = count
                print(profile["profile_tottime"], flush=True)
            helpers.stop()
            helpers = None
    except Interrupted as exc:
        print(f"interrupted by {exc}: cleaning up", file=sys.stderr)
        failed = True
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT_SIGNALS)  # clean up undisturbed
        try:
            if helpers is not None:
                helpers.stop()
        finally:
            problems = limits.restore()
            for line in limits.log:
                print(f"limits: {line}", file=sys.stderr)
            for line in problems:
                print(f"ERROR: {line}", file=sys.stderr)
            shutil.rmtree(scratch, ignore_errors=True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, CAUGHT_SIGNALS)
    if failed or not rows:
        return 1
    section = render(rows, args.repeat, args.full_repeat, limits.log, profile, code)
    print()
    print(section)
    if args.write:
        write_section(Path(args.write), section)
        print(f"wrote the section to {args.write}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_helpers"]:  # internal: the helper tree's root
        _run_helper(json.loads(argv[1]), int(argv[2]))
        return 0
    if argv[:1] == ["--_measure"]:  # internal: one measured pass
        print(json.dumps(measure(argv[1], "--_profile" in argv)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads", type=_parse_counts, default=[1000, 10000, 100000],
        help="comma-separated helper thread counts (default 1000,10000,100000; 10k works too)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="passes per count (default 3)")
    parser.add_argument(
        "--full-repeat", type=int, default=1,
        help="passes of the slow psutil-full baseline per count (default 1)",
    )  # fmt: skip
    parser.add_argument("--write", metavar="FILE", help="replace the section in FILE")
    parser.add_argument(
        "--baselines", default="psutil,py-floor,c-floor",
        help="comma-separated: psutil, psutil-full, py-floor, c-floor, or none "
        "(default psutil,py-floor,c-floor)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true",
        help="also cProfile the agent's second full pass at the largest count",
    )  # fmt: skip
    parser.add_argument(
        "--quiet-wait", type=float, default=30,
        help="before each pass wait up to this many seconds for the CPUs to go idle (default 30)",
    )  # fmt: skip
    parser.add_argument(
        "--spawn-timeout", type=float, default=900, help="seconds to wait for the helpers"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.full_repeat < 1:
        parser.error("--repeat and --full-repeat must be at least 1")
    if os.geteuid() != 0:
        print(
            "bench/scan.py needs root (it raises kernel.pid_max for 100k threads)", file=sys.stderr
        )
        return 2
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())

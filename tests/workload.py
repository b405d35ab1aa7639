"""A realistic, idle stand-in for a torchrun training job, for tests on the live kernel.

``TrainingJob()`` starts the process tree a PyTorch job has (names from FACTS.md): a launcher
renamed ``pt_elastic`` with a ``pt_tcpstore_uv`` thread; ``ranks`` children, each leading a
session of its own as torchrun starts them, with torchrun's ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE`` and ``TORCHELASTIC_RUN_ID`` in their environment, that keep the name
``python3`` with threads ``gloo_tcp_loop``, ``pt_gloo_runloop``, ``pt_nccl_watchdg`` and
OpenMP-like ``python3`` threads;
and ``pt_data_worker`` processes under each rank. Everything sleeps; leaving the context kills
the whole tree and reaps it. SIGUSR1 to a rank renames its ``gloo_tcp_loop`` thread to
``python3``, SIGUSR2 renames it back; ``job.new_thread(rank)`` makes it start a
``pt_nccl_heartbt`` thread and ``job.new_worker(rank)`` fork one more ``pt_data_worker`` (things
a job does after start, for the event-driven tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

_CHILD = textwrap.dedent(
    r"""
    import json, os, sys, threading, time

    def rename(name, tid=None):
        path = f"/proc/self/task/{tid or threading.get_native_id()}/comm"
        with open(path, "w") as fh:
            fh.write(name)

    def spawn_threads(names):
        ready = []
        for name in names:
            ev = threading.Event()
            def run(name=name, ev=ev):
                rename(name)
                ready.append(threading.get_native_id())
                ev.set()
                while True:
                    time.sleep(3600)
            threading.Thread(target=run, daemon=True).start()
            ev.wait()
        return ready

    role, ranks, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = os.fdopen(int(sys.argv[4]), "w") if len(sys.argv) > 4 else None
    if role == "launcher":
        rename("pt_elastic")
        spawn_threads(["pt_tcpstore_uv"])
        tree = {"launcher": os.getpid(), "ranks": [], "workers": []}
        procs = []
        for index in range(ranks):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.setsid()  # torchrun starts each rank in a session of its own
                os.close(r)
                os.set_inheritable(w, True)
                # what torchrun gives each worker (torch.distributed.elastic)
                env = {**os.environ, "RANK": str(index), "LOCAL_RANK": str(index),
                       "WORLD_SIZE": str(ranks), "TORCHELASTIC_RUN_ID": "standin"}
                os.execve(sys.executable, [sys.executable, "-c", CODE, "rank", "0",
                                           str(workers), str(w)], env)
            os.close(w)
            with os.fdopen(r) as fh:
                info = json.loads(fh.readline())
            tree["ranks"].append(info["rank"])
            tree["workers"] += info["workers"]
            procs.append(pid)
        out.write(json.dumps(tree) + "\n")
        out.flush()
        while True:
            time.sleep(3600)
    else:  # rank
        import signal
        named = spawn_threads(["gloo_tcp_loop", "pt_gloo_runloop", "pt_nccl_watchdg", "python3"])
        # SIGUSR1/SIGUSR2: the comm thread renames itself away and back (only threads of the
        # same process may rename each other), as PyTorch threads do after start.
        signal.signal(signal.SIGUSR1, lambda *_: rename("python3", named[0]))
        signal.signal(signal.SIGUSR2, lambda *_: rename("gloo_tcp_loop", named[0]))
        worker_pids = []

        def new_worker():
            pid = os.fork()
            if pid == 0:
                # Its thread first, then the name the rank waits for: once renamed, the worker
                # is whole (a thread born later would be missing from a test's "before").
                spawn_threads(["pt_data_worker"])
                rename("pt_data_worker")
                while True:
                    time.sleep(3600)
            worker_pids.append(pid)

        for _ in range(workers):
            new_worker()
        signal.signal(signal.SIGRTMIN, lambda *_: spawn_threads(["pt_nccl_heartbt"]))
        signal.signal(signal.SIGRTMIN + 1, lambda *_: new_worker())
        # Wait until the workers have renamed themselves.
        for pid in worker_pids:
            for _ in range(500):
                with open(f"/proc/{pid}/comm") as fh:
                    if fh.read().strip() == "pt_data_worker":
                        break
                time.sleep(0.01)
        out.write(json.dumps({"rank": os.getpid(), "workers": worker_pids}) + "\n")
        out.flush()
        while True:
            time.sleep(3600)
    """
)


class TrainingJob:
    """Context manager: ``with TrainingJob(ranks=2, workers=1) as job: job.ranks ...``."""

    def __init__(self, ranks: int = 2, workers: int = 1) -> None:
        self.n_ranks, self.n_workers = ranks, workers
        self.launcher = 0
        self.ranks: list[int] = []
        self.workers: list[int] = []
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> TrainingJob:
        r, w = os.pipe()
        code = "CODE = " + repr(_CHILD) + "\n" + _CHILD
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                "launcher",
                str(self.n_ranks),
                str(self.n_workers),
                str(w),
            ],
            pass_fds=(w,),
            start_new_session=True,
        )
        os.close(w)
        with os.fdopen(r) as fh:
            line = fh.readline()
        if not line:
            self.__exit__(None, None, None)
            raise RuntimeError("the training job stand-in failed to start")
        tree = json.loads(line)
        self.launcher, self.ranks, self.workers = tree["launcher"], tree["ranks"], tree["workers"]
        return self

    @property
    def pids(self) -> list[int]:
        return [self.launcher, *self.ranks, *self.workers]

    def tids(self, pid: int) -> list[int]:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))

    def new_thread(self, rank: int) -> None:
        """The rank starts a ``pt_nccl_heartbt`` thread (find it with ``tids``)."""
        os.kill(rank, signal.SIGRTMIN)

    def new_worker(self, rank: int) -> None:
        """The rank forks one more ``pt_data_worker`` process (a child: find it in /proc)."""
        os.kill(rank, signal.SIGRTMIN + 1)

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        # The launcher's process group, then each rank's (a session and group of its own, with
        # its workers, also those forked later).
        for group in (self._proc.pid, *self.ranks):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        self._proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in self.pids):
            time.sleep(0.01)
        self._proc = None


# A process whose one unnamed thread first waits on a lock, then, after a line on its stdin, sits
# in poll(2) as NCCL's proxy service thread does once started (tests of ``activity``). It says
# "ready" when the thread exists.
SETTLES_INTO_POLL = r"""
import select, socket, sys, threading, time
a, b = socket.socketpair()
go = threading.Event()
def service():
    go.wait()
    p = select.poll()
    p.register(a, select.POLLIN)
    while True:
        p.poll(500)
threading.Thread(target=service, daemon=True).start()
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
go.set()
time.sleep(120)
"""

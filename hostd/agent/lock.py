"""The agent's pid lock: one agent per host, and the way ``hostd status`` finds it.

``AgentLock.take(run_dir)`` holds the host-wide lock (``hostd.statedir.lock_host``: one agent or
one restore per host, whatever their folders) and ``RUN_DIR/agent.pid``, locked and holding the
agent's pid, until ``close()``. ``agent_pid(run_dir)`` is the other side: the pid of the agent
that holds the file, or None when nobody does (a file left by a crash is not an agent).
``wait_for_host(run_dir, wait)`` is ``hostd restore``'s side: the host lock once no agent holds it
or the pid file, waiting up to ``wait`` seconds for one that is still stopping (in Kubernetes, a
new pod's init container while the node's previous hostd pod restores: deploy/k8s).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from hostd.statedir import HOST_LOCK, Locked, UnsafeDir, lock_host, open_dir, open_file

PID_FILE = "agent.pid"
POLL_S = 0.5  # how often ``wait_for_host`` tries again


class AgentError(RuntimeError):
    """The agent cannot start (another one runs, the policy is refused)."""


class AgentLock:
    """The host lock and the locked pid file, held until ``close``."""

    def __init__(self, host_fd: int, pid_fd: int) -> None:
        self.host_fd: int | None = host_fd
        self.pid_fd: int | None = pid_fd

    @classmethod
    def take(cls, run_dir: Path) -> AgentLock:
        """Take both locks or raise ``AgentError`` saying who holds them."""
        try:
            host_fd = lock_host()
        except Locked as exc:
            raise AgentError(
                f"another hostd agent is running (pid {exc.pid or '?'}; one per host: {HOST_LOCK})"
            ) from None
        except PermissionError:
            raise AgentError(f"hostd run needs root (it could not take {HOST_LOCK})") from None
        try:
            try:
                run_fd = open_dir(run_dir)
            except UnsafeDir as exc:
                raise AgentError(str(exc)) from None
            try:
                fd = open_file(run_fd, PID_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise AgentError(str(exc)) from None
            finally:
                os.close(run_fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise AgentError(f"another hostd agent is running ({run_dir}/{PID_FILE})") from None
        except AgentError:
            os.close(host_fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(host_fd, fd)

    def close(self) -> None:
        """Let go of both (an agent may run inside a longer process: the tests)."""
        for name in ("pid_fd", "host_fd"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)


def agent_pid(run_dir: str | Path) -> int | None:
    """The pid of the running agent, or None (the pid file is locked while it runs)."""
    path = Path(run_dir) / PID_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it: a stale file
        except OSError:
            return int(os.read(fd, 32).decode().strip() or 0) or None
    finally:
        os.close(fd)


def wait_for_host(
    run_dir: str | Path,
    wait: float,
    *,
    poll: float = POLL_S,
    path: str = HOST_LOCK,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """The host lock (``lock_host(path)``), held until the returned fd is closed, once neither
    an agent holds it nor ``run_dir``'s pid file is locked; tried again every ``poll`` seconds
    for up to ``wait`` seconds (0: once). Raises ``Locked`` with the holder's pid when the wait
    ends with either still held. Both are asked: an agent in another container may hold a lock
    this one cannot see (a container's own /run) but shares the run dir (a hostPath)."""
    deadline = clock() + wait
    while True:
        try:
            fd = lock_host(path)
            pid = agent_pid(run_dir)
            if pid:
                os.close(fd)
                raise Locked(pid)
            return fd
        except Locked:
            left = deadline - clock()
            if left <= 0:
                raise
            sleep(min(poll, left))

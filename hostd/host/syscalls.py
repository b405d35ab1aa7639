"""Per-thread system calls: affinity, scheduling policy, nice, and NUMA page migration.

Python's ``os`` module covers affinity, policies (with ``SCHED_RESET_ON_FORK``) and nice for a
thread id; ``move_pages(2)`` and ``migrate_pages(2)`` go through ctypes. Every call turns errno
into the domain errors of ``hostd.host.errors`` (ESRCH: the thread is gone). Called only through
``hostd.host.Host``, which refuses them on fixture trees unless it was given other calls:
``ThreadCalls`` is what this module offers, for a fake to offer too (tests/fakes.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from typing import Protocol

from hostd.host.errors import HostError, from_oserror

POLICY_NUMBERS = {
    "other": os.SCHED_OTHER,
    "batch": os.SCHED_BATCH,
    "idle": os.SCHED_IDLE,
    "fifo": os.SCHED_FIFO,
    "rr": os.SCHED_RR,
}
POLICY_NAMES = {v: k for k, v in POLICY_NUMBERS.items()}
RESET_ON_FORK = os.SCHED_RESET_ON_FORK
RT = (os.SCHED_FIFO, os.SCHED_RR)


class ThreadCalls(Protocol):
    """The per-thread calls (this module's functions, or a fake's methods)."""

    def get_affinity(self, tid: int) -> frozenset[int]: ...
    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None: ...
    def get_sched(self, tid: int) -> tuple[str, int, bool]: ...
    def set_sched(self, tid: int, policy: str, priority: int, reset_on_fork: bool) -> None: ...
    def get_nice(self, tid: int) -> int: ...
    def set_nice(self, tid: int, nice: int) -> None: ...
    def move_pages(self, pid: int, pages: list[int], node: int | None) -> list[int]: ...
    def migrate_pages(self, pid: int, old: frozenset[int], new: frozenset[int]) -> int: ...


# include/uapi/asm-generic/unistd.h and arch/x86/entry/syscalls/syscall_64.tbl
_SYSCALLS = {
    "x86_64": {"move_pages": 279, "migrate_pages": 256},
    "aarch64": {"move_pages": 239, "migrate_pages": 238},
}
MPOL_MF_MOVE = 1 << 1


def _call(kind: str, tid: int, fn, *args):
    """``fn(*args)``, its OSError as the HostError of knob ``task/TID/KIND`` (the name is only
    built on error: these run a few times per thread, a storm's thousands a second)."""
    try:
        return fn(*args)
    except OSError as exc:
        raise from_oserror(exc, f"task/{tid}/{kind}") from None


def get_affinity(tid: int) -> frozenset[int]:
    return frozenset(_call("affinity", tid, os.sched_getaffinity, tid))


def set_affinity(tid: int, cpus: frozenset[int]) -> None:
    _call("affinity", tid, os.sched_setaffinity, tid, cpus)


def get_sched(tid: int) -> tuple[str, int, bool]:
    """(policy name, RT priority, reset-on-fork) of a thread."""
    raw = _call("sched", tid, os.sched_getscheduler, tid)
    policy = raw & ~RESET_ON_FORK
    # a normal policy's priority is always 0 (sched(7)): one call less a new thread
    prio = _call("sched", tid, os.sched_getparam, tid).sched_priority if policy in RT else 0
    return POLICY_NAMES.get(policy, str(policy)), prio, bool(raw & RESET_ON_FORK)


def set_sched(tid: int, policy: str, priority: int, reset_on_fork: bool) -> None:
    number = POLICY_NUMBERS[policy] | (RESET_ON_FORK if reset_on_fork else 0)
    param = os.sched_param(priority if POLICY_NUMBERS[policy] in RT else 0)
    _call("sched", tid, os.sched_setscheduler, tid, number, param)


def get_nice(tid: int) -> int:
    return _call("nice", tid, os.getpriority, os.PRIO_PROCESS, tid)


def set_nice(tid: int, nice: int) -> None:
    _call("nice", tid, os.setpriority, os.PRIO_PROCESS, tid, nice)


_libc = None


def _syscall(name: str, *args) -> int:
    global _libc
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise HostError(38, name, f"{name} is not wired for {platform.machine()}")  # ENOSYS
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _libc.syscall.restype = ctypes.c_long
    result = _libc.syscall(ctypes.c_long(numbers[name]), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise from_oserror(OSError(err, os.strerror(err)), name)
    return result


def move_pages(pid: int, pages: list[int], node: int | None) -> list[int]:
    """move_pages(2): move ``pages`` (addresses) to ``node``, or query them when node is None.

    Returns each page's status: its node, or a negative errno (-ENOENT: not present).
    """
    count = len(pages)
    page_arr = (ctypes.c_void_p * count)(*pages)
    status = (ctypes.c_int * count)()
    nodes = None if node is None else (ctypes.c_int * count)(*([node] * count))
    _syscall(
        "move_pages",
        ctypes.c_int(pid),
        ctypes.c_ulong(count),
        page_arr,
        nodes,
        status,
        ctypes.c_int(MPOL_MF_MOVE if node is not None else 0),
    )
    return list(status)


def migrate_pages(pid: int, old_nodes: frozenset[int], new_nodes: frozenset[int]) -> int:
    """migrate_pages(2): move all pages of ``pid`` on old_nodes to new_nodes; pages not moved."""
    width = max([*old_nodes, *new_nodes, 0]) + 1
    words = (width + 63) // 64
    old = (ctypes.c_ulong * words)()
    new = (ctypes.c_ulong * words)()
    for n in old_nodes:
        old[n // 64] |= 1 << (n % 64)
    for n in new_nodes:
        new[n // 64] |= 1 << (n % 64)
    return _syscall("migrate_pages", ctypes.c_int(pid), ctypes.c_ulong(width + 1), old, new)

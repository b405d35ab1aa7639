"""Pure parsers of one thread's own /proc files; no I/O here.

``/proc/PID/task/TID/stat`` and ``status`` (proc(5)), ``schedstat``
(Documentation/scheduler/sched-stats.rst), ``syscall`` and ``io``: each function takes the text
of one file and returns plain values. The task snapshot reads these for every thread of every
pass, so ``Stat`` and ``Schedstat`` are NamedTuples. ``hostd.host.parsers`` re-exports every
name here; called by ``hostd.host.Host`` readers, by the task snapshot builder, by the sched
actuator, by the watch's weights and by ``hostd.stats``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hostd.model.cpus import parse_cpulist

# /proc/PID/stat flag bit for kernel threads (include/linux/sched.h).
PF_KTHREAD = 0x00200000


class Stat(NamedTuple):
    """The fields of /proc/PID/task/TID/stat that hostd uses (proc(5) numbering in comments).

    A NamedTuple, not a dataclass: one is built per thread, 100k times a pass.
    """

    comm: str  # (2)
    state: str  # (3)
    ppid: int  # (4)
    session: int  # (6) its session's id: the pid of the session leader
    tty_nr: int  # (7) its controlling terminal's device number (0: none)
    flags: int  # (9)
    utime: int  # (14) clock ticks
    stime: int  # (15)
    nice: int  # (19)
    num_threads: int  # (20)
    start_time: int  # (22) clock ticks after boot
    processor: int  # (39)
    rt_priority: int  # (40)
    policy: int  # (41)

    @property
    def is_kthread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def split_stat(text: str) -> tuple[str, list[str]]:
    """A /proc/PID/stat line as (comm, fields after it): field (n) of proc(5) is ``rest[n - 3]``.

    The comm may hold spaces and parentheses: split at the last ')'. Only fields up to (42) are
    split apart (hostd reads none beyond (41)); splitting the rest costs a microsecond a line.
    """
    close_paren = text.rindex(")")
    return text[text.index("(") + 1 : close_paren], text[close_paren + 2 :].split(" ", 40)


def parse_stat(text: str) -> Stat:
    """Parse /proc/PID/stat (see ``split_stat``)."""
    comm, rest = split_stat(text)
    n = len(rest)
    return Stat(
        comm,
        rest[0],
        int(rest[1]),
        int(rest[3]),
        int(rest[4]),
        int(rest[6]),
        int(rest[11]),
        int(rest[12]),
        int(rest[16]),
        int(rest[17]),
        int(rest[19]),
        int(rest[36]) if n > 36 else -1,
        int(rest[37]) if n > 37 else 0,
        int(rest[38]) if n > 38 else 0,
    )


@dataclass(frozen=True, slots=True)
class Status:
    """The fields of /proc/PID/task/TID/status that hostd uses."""

    tgid: int
    uid: int  # effective uid; a set-uid-root program's real uid (``parse_status``)
    gid: int  # effective gid
    cpus_allowed: frozenset[int]
    voluntary_ctxt_switches: int
    nonvoluntary_ctxt_switches: int
    cap_bnd: int = 0  # the capability bounding set (CapBnd), a bit per capability


def parse_status(text: str) -> Status:
    """Parse /proc/PID/status ("Key:\\tvalue" lines); missing keys default to neutral values."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    uids = [int(u) for u in fields.get("Uid", "0 0").split()]
    gids = [int(g) for g in fields.get("Gid", "0 0").split()]
    # The effective ids, but a set-uid (set-gid) root program counts as the user who ran it (its
    # real id): any user can start `su` or `passwd` with a rank's environment, and root's
    # protection (a uid-0 gate) must not go to a process a user started and still owns.
    uid, gid = uids[1] if len(uids) > 1 else uids[0], gids[1] if len(gids) > 1 else gids[0]
    return Status(
        tgid=int(fields.get("Tgid", "0")),
        uid=uids[0] if uid == 0 else uid,
        gid=gids[0] if gid == 0 else gid,
        cpus_allowed=parse_cpulist(fields.get("Cpus_allowed_list", "")),
        voluntary_ctxt_switches=int(fields.get("voluntary_ctxt_switches", "0")),
        nonvoluntary_ctxt_switches=int(fields.get("nonvoluntary_ctxt_switches", "0")),
        cap_bnd=int(fields.get("CapBnd", "0"), 16),
    )


class Schedstat(NamedTuple):
    """/proc/PID/task/TID/schedstat (Documentation/scheduler/sched-stats.rst): one thread's
    scheduler totals since it started. Present with CONFIG_SCHED_INFO (or CONFIG_SCHEDSTATS)."""

    run_ns: int  # time spent on a CPU
    wait_ns: int  # time spent runnable, waiting on a run queue
    timeslices: int  # number of timeslices run on a CPU


def parse_schedstat(text: str) -> Schedstat:
    """Parse "RUN_NS WAIT_NS TIMESLICES\\n"; raises ValueError on anything else."""
    fields = text.split()
    if len(fields) < 3 or not all(f.isdigit() for f in fields[:3]):
        raise ValueError(f"schedstat: expected three counts, got {text!r}")
    return Schedstat(int(fields[0]), int(fields[1]), int(fields[2]))


def parse_involuntary(text: str) -> int | None:
    """``nonvoluntary_ctxt_switches`` of a /proc/PID/task/TID/status (its last lines)."""
    at = text.rfind("nonvoluntary_ctxt_switches:")
    if at < 0:
        return None
    words = text[at + 27 :].split()
    return int(words[0]) if words and words[0].isdigit() else None


# System calls an idle thread blocks in, by machine (arch/x86/entry/syscalls/syscall_64.tbl;
# include/uapi/asm-generic/unistd.h for arm64): how ``thread_activity`` tells what an unnamed
# thread does.
_SYSCALLS = {
    "x86_64": {
        "poll": {7, 23, 232, 270, 271, 281, 441},  # poll select epoll_wait pselect6 ppoll ...
        "futex": {202, 449},  # futex futex_waitv
        "read": {0, 17, 19, 295},  # read pread64 readv preadv
        "write": {1, 18, 20, 296},  # write pwrite64 writev pwritev
    },
    "aarch64": {
        "poll": {22, 72, 73, 441},  # epoll_pwait pselect6 ppoll epoll_pwait2
        "futex": {98, 449},
        "read": {63, 65, 67, 69},
        "write": {64, 66, 68, 70},
    },
}


def parse_syscall(text: str, machine: str) -> tuple[str, int | None]:
    """/proc/PID/task/TID/syscall as (what, first argument): "running" (on a CPU or runnable),
    "poll", "futex", "read", "write", "other" (another call, or blocked outside one); the
    first argument is the call's fd for a read. Raises ValueError on a malformed text."""
    fields = text.split()
    if not fields:
        raise ValueError("syscall: empty")
    if fields[0] == "running":
        return "running", None
    nr = int(fields[0])
    arg = int(fields[1], 16) if len(fields) > 1 and nr >= 0 else None
    for what, numbers in _SYSCALLS.get(machine, {}).items():
        if nr in numbers:
            return what, arg
    return "other", arg


def parse_io_writes(text: str) -> int:
    """The ``syscw`` count of /proc/PID/task/TID/io: write system calls the thread made."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "syscw":
            return int(value)
    raise ValueError("io: no syscw")

"""What is in place, as far as the snapshot knows it: ``Observed`` (a thread's knob values from
its ``Task``, saving a read per knob), and ``same`` (whether a knob holds what is wanted).

Used by ``hostd.reconcile.prepare`` to skip what is already right, by the restore
(``hostd.reconcile.restoring``) and ``hostd.held`` to compare a knob with its original; the
agent builds ``Observed`` from its scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hostd import knobs
from hostd.host.syscalls import POLICY_NAMES
from hostd.model.cpus import format_cpulist
from hostd.model.tasks import Task


class Observed:
    """Task knob values already known from the snapshot (saves a syscall per thread), looked
    up by knob key. Built per lookup rather than as a dict of every thread's keys: at 100k
    threads that dict was 300k key strings and values, the agent's peak memory."""

    def __init__(self, tasks: Iterable[Task] | Mapping[int, Task]) -> None:
        """``tasks``: the threads, or a mapping of them by tid already made (the agent's cache)."""
        self.tasks = tasks if isinstance(tasks, Mapping) else {t.tid: t for t in tasks}

    def __contains__(self, ident: object) -> bool:
        """Whether the snapshot holds the thread ``(tid, start_time)`` (for ``live_keys``)."""
        t = self.tasks.get(ident[0]) if type(ident) is tuple else None
        return t is not None and t.start_time == ident[1]

    def task(self, key: str) -> Task | None:
        """The thread of a task key, if the snapshot holds that same thread."""
        if not key.startswith("task/"):  # (knobs.is_task_key, inline: a few per thread)
            return None
        tid, start = knobs.parse_task_key(key)
        t = self.tasks.get(tid)
        return t if t is not None and t.start_time == start else None

    def get(self, key: str, default: object = None) -> object:
        t = self.task(key)
        return default if t is None else self.value(t, key, default)

    @staticmethod
    def value(t: Task, key: str, default: object = None) -> object:
        """The value of one of thread ``t``'s knobs, as far as the snapshot knows it."""
        kind = key[key.rfind("/") + 1 :]  # a task key's kind is its last part
        if kind == "affinity":
            return format_cpulist(t.affinity)
        if kind == "nice":
            return t.nice
        if kind == "sched" and t.policy in POLICY_NAMES:
            # /proc/PID/stat does not show reset-on-fork: None means "unknown, read it". The
            # policies hostd sets only; deadline and ext threads are read if wanted.
            return [POLICY_NAMES[t.policy], t.rt_priority, None]
        return default


def same(current: object, wanted: object) -> bool:
    """Whether a knob holds what is wanted; a None in a list read from /proc: not known."""
    if current == wanted:
        return True
    if type(current) is not list or type(wanted) is not list or len(current) != len(wanted):
        return False
    # a loop, not all() over a generator: half the time (a new thread's policy, each)
    for c, w in zip(current, wanted, strict=True):  # noqa: SIM110
        if c is not None and c != w:
            return False
    return True

"""Knobs: every kernel setting hostd may change, named by a stable key, with read and write.

A key says what and where: ``task/4242@81234/affinity`` (thread 4242 that started at tick
81234), ``irq/42/smp_affinity_list``, ``cpu/3/scaling_governor``,
``cgroup/cpuset/hostd/trainer`` (a cpuset cgroup hostd created), ``cgroup/subtree/a`` (cpuset
enabled for the children of v2 cgroup /a), ``task/4242@81234/cpuset`` (which cpuset cgroup the
thread is in), ``session/4242@81234/preempted`` (session 4242, demoted at tick 81234: what its
threads born since then inherited is put back, ``hostd.sched``). Values are plain JSON values,
so the journal can store originals as they were read. A knob kind registers a ``Knob`` with
``read(host, key)`` and ``write(host, key, value)``; both raise the domain errors of
``hostd.host.errors`` (a thread whose start time no longer matches is ``Gone``: a reused tid is
never touched).

The actuator modules (``hostd.cpuset.affinity``, ``hostd.cpuset.cgroup``, ``hostd.sched``,
``hostd.irq``, ``hostd.cpufreq``) register their kinds here; ``hostd.reconcile`` looks them up.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

from hostd.host import Gone, Host, HostError

Value = object  # a JSON value: str, int, bool, list or None


@dataclass(frozen=True, slots=True)
class Knob:
    kind: str  # the last key component for task knobs, the first for host knobs
    read: Callable[[Host, str], Value]
    write: Callable[[Host, str, Value], None]
    per_task: bool = False


_REGISTRY: dict[str, Knob] = {}


def register(knob: Knob) -> Knob:
    _REGISTRY[knob.kind] = knob
    return knob


def kind_of(key: str) -> str:
    parts = key.split("/")
    if parts[0] in ("task", "session"):
        return parts[-1]
    if parts[0] == "cpu":
        return parts[-1]
    if parts[0] == "irq":
        return "irq"
    if parts[0] == "cgroup":
        return "subtree" if parts[1] == "subtree" else "cgroup"
    raise KeyError(key)


def knob_for(key: str) -> Knob:
    try:
        return _REGISTRY[kind_of(key)]
    except KeyError:
        raise HostError(errno.EINVAL, key, "no knob kind handles this key") from None


def is_task_key(key: str) -> bool:
    return key.startswith("task/")


def is_boot_bound(key: str) -> bool:
    """Keys of threads and sessions: meaningless after a reboot."""
    return key.startswith(("task/", "session/"))


def session_key(sid: int, since: int) -> str:
    return f"session/{sid}@{since}/preempted"


def task_key(tid: int, start_time: int, kind: str) -> str:
    return f"task/{tid}@{start_time}/{kind}"


def parse_task_key(key: str) -> tuple[int, int]:
    """(tid, start_time) of a ``task/TID@START/...`` key."""
    ident = key.split("/")[1]
    tid, _, start = ident.partition("@")
    return int(tid), int(start)


def live_tid(host: Host, key: str) -> int:
    """The tid of a task key, after checking it is still the same thread (else Gone)."""
    tid, start = parse_task_key(key)
    if host.start_time(tid) != start:
        raise Gone(errno.ESRCH, key, "the thread exited (or its tid was reused)")
    return tid


def read(host: Host, key: str) -> Value:
    return knob_for(key).read(host, key)


def write(host: Host, key: str, value: Value) -> None:
    knob_for(key).write(host, key, value)

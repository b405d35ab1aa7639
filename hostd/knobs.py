"""Knobs: every kernel setting hostd may change, named by a stable key, with read and write.

A key says what and where: ``task/4242@81234/affinity`` (thread 4242 that started at tick
81234), ``irq/42/smp_affinity_list``, ``cpu/3/scaling_governor``,
``cgroup/cpuset/hostd/trainer`` (a cpuset cgroup hostd created), ``cgroup/subtree/a`` (cpuset
enabled for the children of v2 cgroup /a), ``task/4242@81234/cpuset`` (which cpuset cgroup the
thread is in), ``cgroup/cpu/user.slice/x.scope`` (the CPU weight of a cgroup whose work
was demoted, ``hostd.sched.group``), ``session/4242@81234/preempted`` (session 4242, demoted
at tick 81234: what its threads born since then inherited is put back, ``hostd.sched``).
Values are plain JSON values, so the journal can store originals as they were read. A knob
kind registers a ``Knob`` with ``read(host, key)`` and ``write(host, key, value)``; both raise
the domain errors of ``hostd.host.errors`` (a thread whose start time no longer matches is
``Gone``: a reused tid is never touched).

The actuator modules (``hostd.cpuset.affinity``, ``hostd.cpuset.cgroup``, ``hostd.sched``,
``hostd.irq``, ``hostd.cpufreq``) register their kinds here; ``hostd.reconcile`` looks them up.

``check_key`` and ``check_value`` say what is wrong with a key or a value read back from the
journal (None: nothing), before anything is written with it: a damaged or edited journal must
never choose which file hostd writes, or write a value no knob of that kind can hold. Each kind
registers the check of its values (``Knob.check``); ``CHECKS`` holds the shared ones.
"""

from __future__ import annotations

import errno
import re
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
    check: Callable[[Value], str | None] = lambda value: None  # what is wrong with a value


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
        return {"subtree": "subtree", "cpu": "group_cpu"}.get(parts[1], "cgroup")
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


# -- checking what the journal holds -----------------------------------------------------------
_TASK_KEY = re.compile(r"task/[0-9]{1,10}@[0-9]{1,20}/[a-z_]{1,32}")
_SESSION_KEY = re.compile(r"session/[0-9]{1,10}@[0-9]{1,20}/preempted")
_IRQ_KEY = re.compile(r"irq/[0-9]{1,6}/smp_affinity_list")
_CPU_KEY = re.compile(r"cpu/[0-9]{1,5}/[a-z_]{1,40}")
_CGROUP_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,255}")
_CPULIST = re.compile(r"([0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*)?")


def cgroup_path_problem(path: object) -> str | None:
    """What is wrong with a cgroup path ("/a/b.scope"): absolute, plain names, no "." or ".."."""
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 4096:
        return f"{path!r} is not an absolute cgroup path"
    names = [n for n in path.split("/") if n]
    if any(n in (".", "..") or not _CGROUP_NAME.fullmatch(n) for n in names):
        return f"{path!r} is not a plain cgroup path"
    return None


def check_key(key: object) -> str | None:
    """What is wrong with a journal key (None: it names a knob hostd may have changed)."""
    if not isinstance(key, str):
        return f"the key {key!r} is not a string"
    if key.startswith("cgroup/"):
        _, _, rest = key.partition("/")
        what, _, path = rest.partition("/")
        problem = cgroup_path_problem("/" + path)
        if what not in ("cpuset", "subtree", "cpu") or problem:
            return problem or f"{key!r} is not a cgroup knob"
        if what == "cpu" and path.strip("/") == "":
            return f"{key!r}: hostd never weighs the root cgroup"
        names = [n for n in path.split("/") if n]
        # cpuset groups are hostd's own: /hostd[/LAYER] (v1), .../hostd.LAYER (v2)
        if what == "cpuset" and not (
            names and (names[0] == "hostd" or names[-1].startswith("hostd."))
        ):
            return f"{key!r} is not a cgroup hostd creates"
    elif not any(r.fullmatch(key) for r in (_TASK_KEY, _SESSION_KEY, _IRQ_KEY, _CPU_KEY)):
        return f"{key!r} is not a knob key"
    if kind_of(key) not in _REGISTRY:
        return f"{key!r}: no knob kind {kind_of(key)!r}"
    return None


def check_value(key: str, value: Value) -> str | None:
    """What is wrong with ``value`` as an original of ``key`` (a key check_key accepted)."""
    problem = _REGISTRY[kind_of(key)].check(value)
    return f"{key}: {problem}" if problem else None


def _int_in(lo: int, hi: int) -> Callable[[Value], str | None]:
    def check(value: Value) -> str | None:
        ok = type(value) is int and lo <= value <= hi
        return None if ok else f"{value!r} is not an integer in {lo}..{hi}"

    return check


def _cpulist(value: Value) -> str | None:
    ok = isinstance(value, str) and len(value) < 65536 and _CPULIST.fullmatch(value)
    return None if ok else f"{value!r} is not a CPU list"


def _word(value: Value) -> str | None:
    ok = isinstance(value, str) and re.fullmatch(r"[a-z_]{1,64}", value)
    return None if ok else f"{value!r} is not a setting's name"


def _sched(value: Value) -> str | None:
    if (
        isinstance(value, list)
        and len(value) == 3
        and value[0] in ("other", "batch", "idle", "fifo", "rr")
        and type(value[1]) is int
        and 0 <= value[1] <= 99
        and (value[2] is None or type(value[2]) is bool)
    ):
        return None
    return f"{value!r} is not [policy, priority 0..99, reset-on-fork]"


CHECKS: dict[str, Callable[[Value], str | None]] = {
    "nice": _int_in(-20, 19),
    "cpulist": _cpulist,
    "word": _word,
    "sched": _sched,
    "freq": _int_in(0, 10**9),
}

"""Knobs: every kernel setting hostd may change, named by a stable key, declared once per kind.

A key says what and where: ``task/4242@81234/affinity`` (thread 4242 that started at tick
81234), ``irq/42/smp_affinity_list``, ``cpu/3/scaling_governor``,
``cgroup/cpuset/hostd/trainer`` (a cpuset cgroup hostd created), ``cgroup/subtree/a`` (cpuset
enabled for the children of v2 cgroup /a), ``task/4242@81234/cpuset`` (which cpuset cgroup the
thread is in), ``cgroup/cpu/user.slice/x.scope`` (the CPU weight of a cgroup whose work
was demoted, ``hostd.sched.group``), ``session/4242@81234/preempted`` (session 4242, demoted
at tick 81234: what its threads born since then inherited is put back, ``hostd.sched``).
``parse_key`` turns a key into a ``KnobKey`` (scope, ident, name); nothing else splits keys.
Values are plain JSON values, so the journal can store originals as they were read.

A knob kind is one ``Spec``, declared next to its read and write in its actuator module
(``hostd.cpuset.affinity``, ``hostd.cpuset.cgroup``, ``hostd.sched``, ``hostd.sched.group``,
``hostd.irq``, ``hostd.cpufreq``, ``hostd.numa``): its key shape, how to read, write and check
it, whether it is a thread's, its apply order and restore phase, whether threads inherit it,
whether the agent rather than a pass owns it, what host capability it needs and how it is
named. ``hostd.knobkinds`` lists every kind, in one place, and looks keys up there
(``spec_of``, ``read``, ``write``, ``check_key``, ``check_value``). Reads and writes raise the
domain errors of ``hostd.host.errors`` (a thread whose start time no longer matches is
``Gone``: a reused tid is never touched).

``key_problem`` says what is wrong with the shape of a key read back from the journal, before
anything is written with it: a damaged or edited journal must never choose which file hostd
writes. ``CHECKS`` holds the value checks that several kinds share.
"""

from __future__ import annotations

import errno
import functools
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from hostd.host import Gone, Host

Value = object  # a JSON value: str, int, bool, list or None


@dataclass(frozen=True, slots=True)
class KnobKey:
    """A parsed key: ``task/4242@81234/nice`` is ("task", "4242@81234", "nice");
    ``cgroup/cpu/a/b.scope`` is ("cgroup", "/a/b.scope", "cpu") (the ident is the path)."""

    scope: str  # task | session | irq | cpu | cgroup
    ident: str
    name: str

    @property
    def task(self) -> tuple[int, int]:
        """(tid, start time) of a task or session key."""
        tid, _, start = self.ident.partition("@")
        return int(tid), int(start)


@functools.lru_cache(maxsize=16384)  # a pass asks for the same thread's keys a dozen times
def parse_key(key: str) -> KnobKey:
    scope, _, rest = key.partition("/")
    if scope == "cgroup":
        name, _, path = rest.partition("/")
        return KnobKey(scope, "/" + path, name)
    ident, _, name = rest.rpartition("/")
    if scope not in ("task", "session", "irq", "cpu") or not ident:
        raise KeyError(key)
    return KnobKey(scope, ident, name)


@dataclass(frozen=True, slots=True)
class Spec:
    """Everything hostd knows about one kind of knob."""

    kind: str  # its name in the journal's checks, the doctor's report and the policy docs
    shape: str  # its key, e.g. "task/TID@START/affinity"
    read: Callable[[Host, str], Value]
    write: Callable[[Host, str, Value], None]
    check: Callable[[Value], str | None]  # what is wrong with a value (None: nothing)
    noun: str  # what it is, for people: "thread CPU affinity"
    apply_order: int  # a pass writes lower orders first
    restore_phase: int = 1  # a restore puts back lower phases first (reverse journal order within)
    per_task: bool = False  # a thread's (or process's) knob: gone with the thread
    # a session's knob kept on its leader's key: it lives while any process of the session
    # does, not only while the leader does (the autogroup: a nohup'd child outlives its shell)
    session_bound: bool = False
    inheritable: bool = False  # threads created by a thread hostd changed inherit the value
    # The kernel never changes the value by itself: one that is neither the original nor a
    # value hostd wrote was written by someone else since, and a restore leaves it as it is.
    kept_by_kernel: bool = False
    agent_owned: bool = False  # recorded and given back by the agent (agent.watch), never a pass
    host_wide: bool = False  # a setting of the whole host: never written from a sidecar
    needs: str | None = None  # the host capability it needs (hostd.doctor), None: none
    check_key: Callable[[KnobKey], str | None] = lambda key: None  # a kind's own key rules

    @property
    def scope(self) -> str:
        return self.shape.split("/")[0]

    @property
    def name(self) -> str:
        """The key component that names the kind: the second for cgroups, else the last."""
        parts = self.shape.split("/")
        return parts[1] if parts[0] == "cgroup" else parts[-1]


def is_task_key(key: str) -> bool:
    return key.startswith("task/")


def is_boot_bound(key: str) -> bool:
    """Keys whose knob a reboot takes away: threads, sessions and cgroups (cgroupfs lives in
    memory; a cgroup of the same path after a reboot belongs to that boot). Their records are
    meaningless after a reboot, so the journal drops them then, and needs no fsync for them:
    what it wrote is in the page cache, which every reader sees until the kernel goes."""
    return key.startswith(BOOT_BOUND)


BOOT_BOUND = ("task/", "session/", "cgroup/")  # the key prefixes of ``is_boot_bound``


def session_key(sid: int, since: int) -> str:
    return f"session/{sid}@{since}/preempted"


# The task keys ``task_key`` made lately, with what they say ((tid, start time), kind): an
# event pass looks at each of its keys five times or so (its thread, its kind), a storm's
# 30,000 a second, and the first look, parsing, cost more than building the key. Forgotten all
# at once when full; a key not here (read back from the journal) is parsed.
MADE: dict[str, tuple[tuple[int, int], str]] = {}
MADE_MAX = 4096  # a few passes of keys (a pass: up to 256 threads, 3-4 keys each)


def task_key(tid: int, start_time: int, kind: str) -> str:
    key = f"task/{tid}@{start_time}/{kind}"
    if len(MADE) >= MADE_MAX:
        MADE.clear()
    MADE[key] = ((tid, start_time), kind)
    return key


def parse_task_key(key: str) -> tuple[int, int]:
    """(tid, start_time) of a ``task/TID@START/...`` or ``session/SID@SINCE/...`` key."""
    made = MADE.get(key)
    return made[0] if made is not None else _parse_task_key(key)


@functools.lru_cache(maxsize=4096)
def _parse_task_key(key: str) -> tuple[int, int]:
    """``parse_task_key`` of a key not made here, read off the string as ``parse_key`` reads
    it; the cache holds a few passes' keys (an event pass has a few hundred threads)."""
    scope, _, rest = key.partition("/")
    ident = rest.rpartition("/")[0]
    if scope not in ("task", "session") or not ident:
        raise KeyError(key)
    tid, _, start = ident.partition("@")
    return int(tid), int(start)


# The boot tick at which the original being put back was recorded (``hostd.reconcile``'s restore
# sets it around each key): a session's knob then acts through a member of the session only if
# that member existed then, so a session id reused after a crash is never taken for it.
RECORDED_AT: ContextVar[int | None] = ContextVar("recorded_at", default=None)


def live_tid(host: Host, key: str) -> int:
    """The tid of a task key, after checking it is still the same thread (else Gone; a read
    that failed otherwise raises its HostError: it says nothing of the thread)."""
    tid, start = parse_task_key(key)
    if host.start_time(tid, strict=True) != start:
        raise Gone(errno.ESRCH, key, "the thread exited (or its tid was reused)")
    return tid


# -- checking what the journal holds -----------------------------------------------------------
_IDENT = {
    "task": re.compile(r"[0-9]{1,10}@[0-9]{1,20}"),
    "session": re.compile(r"[0-9]{1,10}@[0-9]{1,20}"),
    "irq": re.compile(r"[0-9]{1,6}"),
    "cpu": re.compile(r"[0-9]{1,5}"),
}
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


def key_problem(key: object) -> tuple[KnobKey | None, str | None]:
    """The parsed key, or what is wrong with its shape (any kind's: ``knobkinds.check_key``
    adds the kind's own rules)."""
    if not isinstance(key, str):
        return None, f"the key {key!r} is not a string"
    try:
        k = parse_key(key)
    except KeyError:
        return None, f"{key!r} is not a knob key"
    if k.scope == "cgroup":
        problem = cgroup_path_problem(k.ident)
        if problem:
            return None, problem
    elif not _IDENT[k.scope].fullmatch(k.ident) or key.count("/") != 2:
        return None, f"{key!r} is not a knob key"
    return k, None


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

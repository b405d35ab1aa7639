"""The registry of knob kinds: every kind of kernel setting hostd may change, in one list.

Each kind is one ``hostd.knobs.Spec``, declared in its actuator module next to its read and
write. Adding a kind means declaring its spec there, listing it here, and giving the planner
(or the agent) a rule that wants it; the reconciler, the journal's checks, restore ordering,
the doctor's capability gates and the sidecar's host-wide exclusion all read the spec.

``spec_of(key)`` finds a key's kind; ``read``/``write`` go through it; ``check_key`` and
``check_value`` say what is wrong with a key or a value read back from the journal (None:
nothing), before anything is written with it: a damaged or edited journal must never choose
which file hostd writes, or write a value no knob of that kind can hold.
"""

from __future__ import annotations

import errno
import functools

from hostd import cpufreq, irq, numa, sched
from hostd.cpuset import affinity, cgroup
from hostd.host import Host, HostError
from hostd.knobs import MADE, KnobKey, Spec, Value, key_problem
from hostd.sched import group

KINDS: tuple[Spec, ...] = (
    cgroup.SUBTREE,
    cgroup.GROUP,
    cgroup.MEMBER,
    affinity.AFFINITY,
    sched.SCHED,
    sched.NICE,
    sched.AUTOGROUP,
    irq.IRQ,
    cpufreq.GOVERNOR,
    cpufreq.MIN_FREQ,
    cpufreq.EPP,
    numa.NUMA,
    sched.PREEMPTED,
    group.GROUP_CPU,
    group.GROUP_MAX,
    group.DEMOTED_HOME,
)
BY_KIND: dict[str, Spec] = {s.kind: s for s in KINDS}
BY_SHAPE: dict[tuple[str, str], Spec] = {(s.scope, s.name): s for s in KINDS}
assert len(BY_KIND) == len(BY_SHAPE) == len(KINDS), "two kinds share a name or a key shape"


def kinds(**facts: object) -> frozenset[str]:
    """The names of the kinds whose specs have these facts: ``kinds(per_task=True)``."""
    return frozenset(s.kind for s in KINDS if all(getattr(s, f) == v for f, v in facts.items()))


def needing(capabilities: set[str]) -> frozenset[str]:
    """The kinds that need one of these host capabilities."""
    return frozenset(s.kind for s in KINDS if s.needs in capabilities)


TASK_SPECS: dict[str, Spec] = {name: s for (scope, name), s in BY_SHAPE.items() if scope == "task"}


def spec_of(key: str | KnobKey) -> Spec:
    """The kind of a key (``HostError`` EINVAL: no kind handles it). A task key that
    ``knobs.task_key`` made lately says its kind (``knobs.MADE``); any other is read."""
    made = MADE.get(key) if type(key) is str else None
    spec = TASK_SPECS.get(made[1]) if made is not None else None
    return spec if spec is not None else _spec_of(key)


@functools.lru_cache(maxsize=4096)
def _spec_of(key: str | KnobKey) -> Spec:
    """``spec_of`` read off the string as ``parse_key`` reads it, without building a
    ``KnobKey``. An event pass looks up each of its keys about six times; the cache holds a
    few passes' keys."""
    if isinstance(key, str):
        scope, _, rest = key.partition("/")
        if scope == "cgroup":
            name = rest.partition("/")[0]
        else:
            ident, _, name = rest.rpartition("/")
            if not ident:
                name = ""  # no kind has an empty name
    else:
        scope, name = key.scope, key.name
    spec = BY_SHAPE.get((scope, name))
    if spec is None:
        raise HostError(errno.EINVAL, str(key), "no knob kind handles this key")
    return spec


def kind_of(key: str) -> str:
    return spec_of(key).kind


def read(host: Host, key: str) -> Value:
    return spec_of(key).read(host, key)


def write(host: Host, key: str, value: Value) -> None:
    spec_of(key).write(host, key, value)


def check_key(key: object) -> str | None:
    """What is wrong with a journal key (None: it names a knob hostd may have changed)."""
    k, problem = key_problem(key)
    if k is None:
        return problem
    spec = BY_SHAPE.get((k.scope, k.name))
    if spec is None:
        return f"{key!r}: no knob kind {k.name!r}"
    problem = spec.check_key(k)
    return f"{key!r}: {problem}" if problem else None


def check_value(key: str, value: Value) -> str | None:
    """What is wrong with ``value`` as an original of ``key`` (a key check_key accepted)."""
    problem = spec_of(key).check(value)
    return f"{key}: {problem}" if problem else None

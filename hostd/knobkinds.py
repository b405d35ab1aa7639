"""The registry of knob kinds: every kind of kernel setting hostd may change, in one list.

Each kind is one ``hostd.knobs.Spec``, declared in its actuator module next to its read and
write. Adding a kind means declaring its spec there, listing it here, and giving the planner
(or the agent) a rule that wants it; the reconciler, the journal's checks, restore ordering,
the doctor's capability gates and the sidecar's host-wide exclusion all read the spec.
"""

from __future__ import annotations

from hostd import cpufreq, irq, numa, sched
from hostd.cpuset import affinity, cgroup
from hostd.knobs import Spec
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

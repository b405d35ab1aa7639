"""The frozen values of a policy's layers (``Layer``, its ``Sched``, ``Predicate``,
``CpuAmount``) and their keys: each field that a policy file sets is declared here once with
``key(...)`` (``hostd.policy.schema``), which is what the checker validates, what the values are
built from by keyword, what ``hostd policy show`` prints and what the reference and the JSON
Schema are generated from. The tables and the policy itself: ``hostd.policy.tables``.

Pure. Read by the planner and the classifier (the attribute names here are theirs:
``layer.cpus_min``, ``layer.sched.group_nice``, ...).
"""

# ruff: noqa: RUF009  (a key(...) default is a dataclasses.field with its declaration)

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hostd.policy.schema import (
    EPP_VALUES,
    GOVERNORS,
    GROWTH_ORDERS,
    IRQ_MODES,
    KINDS,
    NUMA_MIGRATE,
    NUMA_MODES,
    RT_POLICIES,
    SCHED_POLICIES,
    key,
    part_of,
)

_REQUIRED = dataclasses.MISSING
CPUS = 'a count (integer >= 0), a fraction in (0, 1] or a percentage like "50%"'
CPU_AMOUNT_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        # a percentage above 0 and at most 100
        {
            "type": "string",
            "pattern": r"^\s*0*(100(\.0+)?|[1-9]\d?(\.\d+)?|0\.\d*[1-9]\d*)\s*%\s*$",
        },
    ]
}


@dataclass(frozen=True, slots=True)
class Predicate:
    """One test on a thread, e.g. ``comm_prefix = ["pt_nccl"]``; ``negate`` for ``not = {...}``."""

    name: str
    value: object  # tuple[str, ...] | str (regex) | tuple[int, ...] | int | bool
    negate: bool = False

    def describe(self) -> str:
        value = self.value
        if isinstance(value, tuple) and len(value) == 1:
            value = value[0]
        if isinstance(value, bool):
            text = f"{self.name} = {str(value).lower()}"
        elif isinstance(value, tuple):
            text = f"{self.name} = [{', '.join(repr(v) for v in value)}]"
        else:
            text = f"{self.name} = {value!r}"
        return f"not ({text})" if self.negate else text


@dataclass(frozen=True, slots=True)
class CpuAmount:
    """A CPU count ("count") or a fraction of the online CPUs ("fraction")."""

    count: int | None = None
    fraction: float | None = None

    def resolve(self, total: int) -> int:
        if self.count is not None:
            return self.count
        assert self.fraction is not None
        return max(0, int(self.fraction * total + 1e-9))

    def describe(self) -> str:
        if self.count is not None:
            return str(self.count)
        return f"{round((self.fraction or 0) * 100, 2):g}%"

    def toml(self) -> int | str:
        """As a policy writes it: the count, or the percentage."""
        return self.count if self.count is not None else self.describe()


@dataclass(frozen=True, slots=True)
class Sched:
    """``sched = { ... }`` of a layer: how its threads are scheduled (checked as a whole:
    ``priority`` and ``max_rt_threads`` only with fifo/rr, no ``nice`` with them or idle)."""

    policy: str | None = key(
        type="choice", choices=SCHED_POLICIES, shown_default="(the thread's own)",
        doc="the scheduling policy (unset: leave the thread's policy as it is)",
    )  # fmt: skip
    priority: int | None = key(
        type="int", lo=1, hi=99, doc="the real-time priority; required with fifo and rr only"
    )
    nice: int | None = key(
        type="int", lo=-20, hi=19, doc="the threads' nice value (not with fifo, rr or idle)"
    )
    reset_on_fork: bool = key(
        True, type="bool", doc="real-time only: children start as SCHED_OTHER"
    )
    max_rt_threads: int | None = key(
        type="int", lo=1, hi=1_000_000, shown_default="16 per CPU",
        doc="real-time only: the most threads of the layer made real-time",
    )  # fmt: skip
    # The nice of the autogroup of a session this layer's process leads (sched(7) "The
    # autogroup feature"): what CFS weighs a whole session by, against other sessions.
    group_nice: int | None = key(
        type="int", lo=-20, hi=19,
        doc="the nice of the autogroup of each session a process of the layer leads",
    )  # fmt: skip

    @property
    def realtime(self) -> bool:
        return self.policy in RT_POLICIES


@dataclass(frozen=True, slots=True)
class Layer:
    """``[[layer]]``: which threads (``match``) and what they get."""

    name: str = key(
        _REQUIRED, type="custom", parse="layer_name", required=True, shown_type="string",
        doc="the layer's name: 1-32 lowercase letters, digits, '-' or '_', unique",
        schema={"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,31}(?!\n)$"},
    )  # fmt: skip
    comment: str = key(_REQUIRED, type="string", required=True, doc="what the layer is for")
    match: tuple[tuple[Predicate, ...], ...] = key(
        _REQUIRED, type="custom", parse="match", required=True, shown_type="list of AND-groups",
        doc="an OR of AND-groups of predicates; [[]] matches every thread",
        schema={"$ref": "#/$defs/match"},
    )  # fmt: skip  # ((),) matches everything
    kind: str = key(
        "open", type="choice", choices=KINDS,
        doc="confined: only its CPUs; grouped: its CPUs and the shared pool; open: the pool",
    )  # fmt: skip
    cpus_min: CpuAmount = key(
        type="custom", toml="cpus", parse="cpus", fields=("cpus_min", "cpus_max"),
        shown_type="table",
        factory=lambda: CpuAmount(count=0), shown_default='{ min = 0, max = "100%" }',
        doc="{ min, max }: its CPUs, each " + CPUS + " of the online CPUs (not on open)",
        schema={"$ref": "#/$defs/cpus"},
    )  # fmt: skip
    cpus_max: CpuAmount = field(
        default_factory=lambda: CpuAmount(fraction=1.0), metadata=part_of("cpus")
    )
    sched: Sched = key(
        type="table", value=Sched, factory=Sched, parse="sched",
        doc="{ policy, priority, nice, reset_on_fork, max_rt_threads, group_nice }",
    )  # fmt: skip
    numa: str = key(
        "none", type="choice", choices=NUMA_MODES,
        doc="gpu-local: the threads and their memory on the NUMA node of their job's GPU",
    )  # fmt: skip
    governor: str | None = key(
        type="choice", choices=GOVERNORS, doc="the cpufreq governor of its CPUs (not on open)"
    )
    min_freq: str | None = key(
        type="custom", parse="min_freq", shown_type="integer or string",
        to_toml=lambda v: int(v) if v.isdigit() else v,
        doc='the lowest frequency of its CPUs: kHz, "max" or "NN%" of the maximum (not on open)',
        schema={"anyOf": [{"type": "integer", "exclusiveMinimum": 0},
                          {"type": "string", "pattern": "^(max|0*([1-9][0-9]?|100)%)$"}]},
    )  # fmt: skip
    epp: str | None = key(
        type="choice", choices=EPP_VALUES,
        doc="the energy-performance preference of its CPUs (not on open)",
    )  # fmt: skip
    irqs: str = key(
        "allow", type="choice", choices=IRQ_MODES,
        doc="avoid: device interrupts are steered off its CPUs (not on open)",
    )  # fmt: skip
    numa_migrate: str = key(
        "move_pages", type="choice", choices=NUMA_MIGRATE,
        doc="how memory follows its threads: batched move_pages, or migrate_pages",
    )  # fmt: skip
    # While a layer with ``preempt`` has threads, CPU-busy sessions of ``preemptible`` layers'
    # threads yield to it at once: SCHED_IDLE per thread, their session weighed down
    # (``hostd.preempt``).
    preempt: bool = key(
        False, type="bool", doc="while it has threads, busy preemptible sessions yield to it"
    )
    preemptible: bool = key(
        False, type="bool",
        doc="its busy sessions are demoted while a preempt layer has threads (not on a real-time "
        "layer; only in a policy with a preempt layer)",
    )  # fmt: skip
    # ``util = { low, high }``: the band of per-CPU utilisation of the layer's own CPUs it is
    # sized to (hostd.plan.sizing): above ``high`` it grows, below ``low`` long enough it
    # shrinks. None: a static layer (``cpus`` and its thread count decide).
    util_low: float | None = key(
        type="custom", toml="util", parse="util", fields=("util_low", "util_high"),
        shown_type="table",
        shown_default="(a static layer)",
        doc="{ low = 0.5, high = 0.8 }: a self-sizing layer keeps its CPUs' busy share in this "
        "band, 0 < low < high <= 1, within cpus (not on open)",
        schema={"type": "object", "additionalProperties": False,
                "properties": {"low": {"type": "number", "exclusiveMinimum": 0,
                                       "exclusiveMaximum": 1},
                               "high": {"type": "number", "exclusiveMinimum": 0,
                                        "maximum": 1}}},
    )  # fmt: skip
    util_high: float | None = field(default=None, metadata=part_of("util"))
    growth: str = key(
        "sticky", type="choice", choices=GROWTH_ORDERS,
        doc="which CPUs a self-sizing layer takes and drops first (docs/planner.md)",
    )  # fmt: skip

    @property
    def self_sizing(self) -> bool:
        """Whether its CPU count follows its measured utilisation (``util``)."""
        return self.util_low is not None and self.util_high is not None

    @property
    def catch_all(self) -> bool:
        return any(len(group) == 0 for group in self.match)

    @property
    def latency(self) -> bool:
        """Layers whose threads are latency-critical get whole cores (see hostd.plan)."""
        return self.sched.realtime or self.irqs == "avoid"

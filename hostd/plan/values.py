"""The plan as a value: layers, threads, cpusets, IRQs, cpufreq and NUMA targets (frozen, sorted).

``Plan.to_json()`` is what ``hostd plan --json`` prints and what the golden plans hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

PLAN_FORMAT = 2  # 2: "schema" (was "format"), CPU sets as lists of numbers
NORMAL_POLICIES = (0, 3, 5)  # SCHED_OTHER, SCHED_BATCH, SCHED_IDLE (include/uapi/linux/sched.h)


@dataclass(frozen=True, slots=True)
class LayerPlan:
    name: str
    kind: str
    cpus: frozenset[int]  # CPUs of its own (empty for open layers and layers that got none)
    mems: frozenset[int]  # NUMA nodes of those CPUs
    threads: int
    wanted: int
    notes: tuple[str, ...] = ()


class TaskPlan(NamedTuple):
    """One thread's decisions (a NamedTuple: built up to 100k times a pass)."""

    tid: int
    start_time: int
    pid: int
    comm: str
    layer: str
    affinity: frozenset[int] | None  # None: leave the thread's own affinity
    policy: str | None  # None: leave its scheduling policy
    priority: int | None
    nice: int | None
    reset_on_fork: bool
    node: int | None  # the NUMA node its process is placed on
    cpuset: str | None = None  # the cpuset cgroup it goes in ("/hostd/<layer>", "G/hostd.<layer>")
    group_nice: int | None = None  # its session's autogroup nice (session leaders only)


@dataclass(frozen=True, slots=True)
class CpusetPlan:
    """A hostd-owned cpuset cgroup (v1 ``/hostd/<layer>``, v2 ``G/hostd.<layer>``): the CPUs
    its threads may use."""

    layer: str
    path: str
    cpus: frozenset[int]
    mems: frozenset[int]


@dataclass(frozen=True, slots=True)
class IrqPlan:
    irq: int
    name: str
    affinity: frozenset[int]
    reason: str


@dataclass(frozen=True, slots=True)
class CpuFreqPlan:
    cpu: int
    layer: str
    governor: str | None
    min_freq: int | None  # kHz
    epp: str | None


@dataclass(frozen=True, slots=True)
class NumaPlan:
    pid: int
    start_time: int
    comm: str
    layer: str
    node: int
    method: str = "move_pages"  # or "migrate_pages": the layer's numa_migrate


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    policy_sha256: str
    mode: str
    online: frozenset[int]
    pool: frozenset[int]
    layers: tuple[LayerPlan, ...]
    tasks: tuple[TaskPlan, ...]
    irqs: tuple[IrqPlan, ...]
    cpufreq: tuple[CpuFreqPlan, ...]
    numa: tuple[NumaPlan, ...]
    cpusets: tuple[CpusetPlan, ...] = ()
    notes: tuple[str, ...] = field(default=())
    demoted: tuple[int, ...] = ()  # sessions whose preemptible threads yield (hostd.preempt)
    spared: tuple[int, ...] = ()  # processes of demoted sessions left alone (bystanders)
    weighted: bool = True  # a layer's negative group_nice applies (hostd.plan.threads)

    def layer(self, name: str) -> LayerPlan:
        return next(lp for lp in self.layers if lp.name == name)

    def to_json(self) -> dict:
        """A plain, stable dict (CPU and node sets as sorted lists of numbers): what ``hostd plan
        --json`` prints."""
        return {
            "schema": PLAN_FORMAT,
            "policy": self.policy,
            "policy_sha256": self.policy_sha256,
            "mode": self.mode,
            "online": sorted(self.online),
            "pool": sorted(self.pool),
            "layers": [
                {
                    "name": lp.name,
                    "kind": lp.kind,
                    "cpus": sorted(lp.cpus),
                    "mems": sorted(lp.mems),
                    "threads": lp.threads,
                    "wanted": lp.wanted,
                    "notes": list(lp.notes),
                }
                for lp in self.layers
            ],
            "tasks": [
                {
                    "tid": tp.tid,
                    "start_time": tp.start_time,
                    "pid": tp.pid,
                    "comm": tp.comm,
                    "layer": tp.layer,
                    "affinity": None if tp.affinity is None else sorted(tp.affinity),
                    "policy": tp.policy,
                    "priority": tp.priority,
                    "nice": tp.nice,
                    "reset_on_fork": tp.reset_on_fork,
                    "node": tp.node,
                    "cpuset": tp.cpuset,
                    "group_nice": tp.group_nice,
                }
                for tp in self.tasks
            ],
            "cpusets": [
                {
                    "layer": cs.layer,
                    "path": cs.path,
                    "cpus": sorted(cs.cpus),
                    "mems": sorted(cs.mems),
                }
                for cs in self.cpusets
            ],
            "irqs": [
                {
                    "irq": ip.irq,
                    "name": ip.name,
                    "affinity": sorted(ip.affinity),
                    "reason": ip.reason,
                }
                for ip in self.irqs
            ],
            "cpufreq": [
                {
                    "cpu": cp.cpu,
                    "layer": cp.layer,
                    "governor": cp.governor,
                    "min_freq": cp.min_freq,
                    "epp": cp.epp,
                }
                for cp in self.cpufreq
            ],
            "numa": [
                {
                    "pid": np_.pid,
                    "start_time": np_.start_time,
                    "comm": np_.comm,
                    "layer": np_.layer,
                    "node": np_.node,
                    "method": np_.method,
                }
                for np_ in self.numa
            ],
            "notes": list(self.notes),
            "demoted_sessions": list(self.demoted),
            "spared_processes": list(self.spared),
        }

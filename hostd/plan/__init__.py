"""The pure planner: topology + classified threads + policy -> one frozen, sorted ``Plan``.

``plan()`` does no I/O. Its decisions, each documented where it is made:

* **CPUs per layer.** Layers of kind ``confined``/``grouped`` get CPUs of their own, in policy
  order, within their ``cpus.min``/``cpus.max`` (fractions are of the online CPUs). Without
  usage statistics a layer wants one CPU per thread, clamped to [min, max]; with ``stats``
  (CPUs in use per layer) it wants 1.25x its use. Empty layers get nothing. A quarter of the
  CPUs, and at least 2, always stay in the shared pool (``pool_reserve``; the policy's
  ``pool_min`` says otherwise): every open layer
  (comm threads, data workers, system services) runs there, and a one-CPU pool starved them
  (BENCHMARKS.md, trainer throughput). A layer that gets no CPU says so in its notes and its
  threads use the pool, which is then every CPU on a small host.
* **Which CPUs.** Latency layers (real-time sched or ``irqs = "avoid"``) take whole cores, so no
  other layer's thread shares their core's SMT pipeline; the others take cores whole while they
  can and may split the last one. Cores are taken from the top of a node down, so the pool keeps
  CPU 0, where housekeeping and most IRQs live. ``numa = "gpu-local"`` layers take CPUs on the
  NUMA nodes their processes' GPUs sit on (split by thread count), else on the nodes with GPUs;
  other layers take the node with the most free CPUs.
* **Threads.** ``confined``: the layer's CPUs; ``grouped``: the layer's CPUs plus the pool;
  ``open``: the pool. A narrower affinity the thread had before (its ``base`` affinity, e.g. a
  launcher's pin) is kept where it overlaps. A process using specific GPUs in a ``gpu-local``
  layer is narrowed to its GPUs' node. Kernel threads are never planned unless the matching
  AND-group says ``is_kthread = true``; ``exclude_pids`` (hostd itself) never.
* **Threads with nothing to decide** (no affinity change, no sched, no node) are counted in
  their layer but not listed, so a plan stays small on hosts with 100k threads.
* **Mechanism.** Thread affinity everywhere, plus a cpuset per layer with CPUs of its own, so a
  thread cannot widen its affinity past its layer. No process ever leaves its cgroup (see
  ``hostd.cpuset.cgroup``): on a v1 cpuset hierarchy, threads still in the root cpuset go to
  hostd's ``/hostd/<layer>``; on v2, threads go to a threaded child ``G/hostd.<layer>`` of
  their own cgroup G, which keeps every other controller of the process as it was.
* **Real-time.** Capped per layer at 16 threads per usable CPU (``sched.max_rt_threads``);
  threads over the cap, and every RT thread where RT is not allowed, get nice -20 instead.
* **IRQs.** Off the CPUs of ``irqs = "avoid"`` layers; a NIC's IRQs on its own node's CPUs. The
  current affinity is kept where it overlaps the target (drivers spread queues on purpose).
* **cpufreq.** Governor, frequency floor and EPP on the CPUs of layers that ask, where the CPU
  offers them.
* **NUMA.** One target node per process of a ``gpu-local`` layer on multi-node hosts.
* **Preemptible work** (``hostd.preempt``). The agent says which sessions are demoted
  (``demoted_sessions``) and which real-time threads ran away (``runaways``): threads of
  preemptible layers in a demoted session get SCHED_IDLE, the session's leader gets the
  ``[preempt] session_nice`` autogroup nice, and a runaway gets SCHED_OTHER at nice -20.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hostd.classify import Classified
from hostd.model.cpus import CPUSET_ROOT, format_cpulist, home_of, v2_group
from hostd.model.tasks import Process
from hostd.model.topology import Topology
from hostd.policy import CpuAmount, Layer, Policy

PLAN_FORMAT = 1
NORMAL_POLICIES = (0, 3, 5)  # SCHED_OTHER, SCHED_BATCH, SCHED_IDLE (include/uapi/linux/sched.h)
_MISSING = object()


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

    def layer(self, name: str) -> LayerPlan:
        return next(lp for lp in self.layers if lp.name == name)

    def to_json(self) -> dict:
        """A plain, stable dict (CPU sets as cpulist strings); what ``hostd plan --json`` prints."""
        return {
            "format": PLAN_FORMAT,
            "policy": self.policy,
            "policy_sha256": self.policy_sha256,
            "mode": self.mode,
            "online": format_cpulist(self.online),
            "pool": format_cpulist(self.pool),
            "layers": [
                {
                    "name": lp.name,
                    "kind": lp.kind,
                    "cpus": format_cpulist(lp.cpus),
                    "mems": format_cpulist(lp.mems),
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
                    "affinity": None if tp.affinity is None else format_cpulist(tp.affinity),
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
                    "cpus": format_cpulist(cs.cpus),
                    "mems": format_cpulist(cs.mems),
                }
                for cs in self.cpusets
            ],
            "irqs": [
                {
                    "irq": ip.irq,
                    "name": ip.name,
                    "affinity": format_cpulist(ip.affinity),
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
        }


# -- helpers -------------------------------------------------------------------------------------
def process_gpu_nodes(topo: Topology, proc: Process) -> tuple[int, ...]:
    """The NUMA nodes of the GPUs a process holds open (by /dev/nvidiaN or renderD minor)."""
    nodes = []
    for minor in proc.nvidia_minors:
        gpu = topo.gpu_by_minor("nvidia", minor)
        if gpu is not None and gpu.node is not None:
            nodes.append(gpu.node)
    if "/dev/kfd" in proc.gpu_devices:
        for dev in proc.gpu_devices:
            if dev.startswith("/dev/dri/renderD") and dev[16:].isdigit():
                gpu = topo.gpu_by_minor("amd", int(dev[16:]))
                if gpu is not None and gpu.node is not None:
                    nodes.append(gpu.node)
    return tuple(nodes)


def _target_node(topo: Topology, proc: Process) -> int | None:
    """The node most of the process's GPUs sit on (lowest id on a tie)."""
    nodes = process_gpu_nodes(topo, proc)
    if not nodes:
        return None
    counts = Counter(nodes)
    return min(counts, key=lambda n: (-counts[n], n))


def _split(total: int, weights: Mapping[int, int]) -> dict[int, int]:
    """Split ``total`` over keys proportionally to ``weights`` (largest remainder, stable)."""
    weight_sum = sum(weights.values())
    if weight_sum <= 0 or total <= 0:
        return {k: 0 for k in weights}
    exact = {k: total * w / weight_sum for k, w in weights.items()}
    shares = {k: int(v) for k, v in exact.items()}
    left = total - sum(shares.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - shares[k]), k))[:left]:
        shares[k] += 1
    return shares


class _Allocator:
    """Hands out free CPUs core by core, from the top of each node down."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.free = set(topo.cpus)

    def cores_of(self, node: int) -> list[list[int]]:
        """Free CPUs of ``node`` grouped by core; best candidates first.

        Cores are ordered by LLC then core id, both descending; the core holding CPU 0 goes last.
        """
        groups: dict[int, list[int]] = {}
        for cpu_id in sorted(self.free):
            cpu = self.topo.cpus[cpu_id]
            if cpu.node == node:
                groups.setdefault(cpu.core, []).append(cpu_id)
        order = sorted(
            groups,
            key=lambda core: (
                0 in self.topo.cpus[core].siblings,
                -self.topo.cpus[core].llc,
                -core,
            ),
        )
        return [groups[c] for c in order]

    def free_on(self, node: int) -> int:
        return sum(1 for c in self.free if self.topo.cpus[c].node == node)

    def take(self, node: int, count: int, whole_cores: bool) -> set[int]:
        taken: set[int] = set()
        for core in self.cores_of(node):
            need = count - len(taken)
            if need <= 0:
                break
            if len(core) <= need or not whole_cores:
                part = core if len(core) <= need else core[:need]
                taken.update(part)
            elif whole_cores:
                break  # a latency layer does not share a core with another layer
        self.free -= taken
        return taken


def _demand(layer: Layer, members: int, stats: Mapping[str, float] | None) -> int:
    if stats is not None and layer.name in stats:
        return max(1, math.ceil(stats[layer.name] * 1.25)) if members else 0
    return members


def layer_want(
    layer: Layer,
    members: int,
    total: int,
    smt_width: int,
    stats: Mapping[str, float] | None = None,
) -> int:
    """How many CPUs a confined/grouped layer with ``members`` threads asks for (before what
    is left limits it). The agent compares this with the plan's ``wanted`` after events: a
    change means the layer's CPUs should be re-planned."""
    if not members:
        return 0
    hi = layer.cpus_max.resolve(total)
    if layer.cpus_max.fraction is not None:
        hi = max(hi, 1)
    want = min(max(_demand(layer, members, stats), layer.cpus_min.resolve(total)), hi)
    if want and layer.latency and smt_width > 1:
        want = min(math.ceil(want / smt_width) * smt_width, max(hi, smt_width))
    return want


def pool_reserve(total: int, pool_min: CpuAmount | None = None) -> int:
    """CPUs that always stay in the shared pool: the policy's ``pool_min`` (at least 1), else a
    quarter of them and at least 2."""
    if pool_min is not None:
        return max(1, pool_min.resolve(total))
    return max(2, math.ceil(total / 4))


def smt_width_of(topo: Topology) -> int:
    return max((len(c.siblings) for c in topo.cpus.values()), default=1)


# -- the planner -------------------------------------------------------------------------------
def plan(
    topo: Topology,
    classified: Sequence[Classified],
    policy: Policy,
    *,
    stats: Mapping[str, float] | None = None,
    base_affinity: Mapping[tuple[int, int], frozenset[int]] | None = None,
    exclude_pids: frozenset[int] = frozenset(),
    allow_rt: bool = True,
    demoted_sessions: frozenset[int] = frozenset(),
    runaways: frozenset[tuple[int, int]] = frozenset(),
) -> Plan:
    """Decide the desired state. Pure and deterministic: same inputs, same Plan.

    ``stats``: CPUs in use per layer name (optional). ``base_affinity``: each thread's affinity
    before hostd changed it, by (tid, start_time); defaults to the affinity seen now.
    ``allow_rt`` False (RT throttling is off, or RT is refused here) turns real-time layers into
    SCHED_OTHER at nice -20, with a note. ``demoted_sessions``, ``runaways``: what the agent's
    watch decided (``hostd.preempt``).
    """
    online = topo.online
    total = len(online)
    notes: list[str] = list(topo.notes)
    layers = {ly.name: ly for ly in policy.layers}
    multi_node = len(topo.nodes) > 1

    # Which threads hostd may touch, and who is in each layer.
    touchable = [item for item in classified if may_touch(item, layers, exclude_pids)]
    members = Counter(item.layer for item in touchable)

    # Per-process GPU node targets, for gpu-local layers.
    targets: dict[int, int | None] = {}
    for item in touchable:
        pid = item.task.pid
        if pid not in targets and layers[item.layer].numa == "gpu-local":
            targets[pid] = _target_node(topo, item.task.process)

    # CPUs per layer.
    alloc = _Allocator(topo)
    reserve = pool_reserve(total, policy.pool_min)
    smt_width = smt_width_of(topo)
    gpu_node_weights = Counter(g.node for g in topo.gpus if g.node is not None)
    layer_cpus: dict[str, frozenset[int]] = {}
    layer_plans: dict[str, LayerPlan] = {}
    for layer in policy.layers:
        if layer.kind == "open":
            continue
        n = members[layer.name]
        lo = layer.cpus_min.resolve(total)
        want = layer_want(layer, n, total, smt_width, stats)
        budget = max(0, len(alloc.free) - reserve)
        layer_notes: list[str] = []
        if want > budget:
            layer_notes.append(f"wanted {want} CPUs, {budget} left")
        count = min(want, budget)
        # Where: a share per node.
        if layer.numa == "gpu-local" and multi_node and gpu_node_weights:
            by_target = Counter(
                targets.get(item.task.pid)
                for item in touchable
                if item.layer == layer.name and targets.get(item.task.pid) is not None
            )
            weights = by_target or gpu_node_weights
            shares = _split(count, {k: v for k, v in weights.items() if k is not None})
        else:
            best = max(topo.nodes, key=lambda nid: (alloc.free_on(nid), -nid))
            shares = {best: count}
        taken: set[int] = set()
        for nid, share in sorted(shares.items()):
            taken |= alloc.take(nid, min(share, alloc.free_on(nid)), layer.latency)
        # A node that ran short: top up from the others, nearest first.
        for nid in sorted(topo.nodes, key=lambda x: (-alloc.free_on(x), x)):
            short = count - len(taken)
            if short <= 0 or len(alloc.free) <= reserve:
                break
            taken |= alloc.take(nid, min(short, len(alloc.free) - reserve), layer.latency)
        if n and not taken:
            layer_notes.append("got no CPU of its own: its threads use the shared pool")
        elif n and len(taken) < lo:
            layer_notes.append(f"got {len(taken)} CPUs, below its min of {lo}")
        layer_cpus[layer.name] = frozenset(taken)
        layer_plans[layer.name] = LayerPlan(
            name=layer.name,
            kind=layer.kind,
            cpus=frozenset(taken),
            mems=frozenset(topo.cpus[c].node for c in taken),
            threads=n,
            wanted=want,
            notes=tuple(layer_notes),
        )
    pool = frozenset(alloc.free)
    pool_mems = frozenset(topo.cpus[c].node for c in pool)
    for layer in policy.layers:
        if layer.kind == "open":
            layer_plans[layer.name] = LayerPlan(
                layer.name, "open", frozenset(), pool_mems, members[layer.name], 0
            )

    # cpusets: hostd-owned cgroups for layers with CPUs of their own, holding what their threads
    # may use: one per layer on v1, one per layer and home cgroup on v2 (hostd.cpuset.cgroup).
    v2 = topo.cgroup.cpuset == "v2"
    cpuset_of: dict[str, CpusetPlan] = {}
    if topo.cgroup.cpuset in ("v1", "v2"):
        for layer in policy.layers:
            own = layer_cpus.get(layer.name, frozenset())
            if layer.kind == "open" or not own:
                continue
            cpus = own if layer.kind == "confined" else own | pool
            cpuset_of[layer.name] = CpusetPlan(
                layer.name,
                f"{CPUSET_ROOT}/{layer.name}",
                cpus,
                frozenset(topo.cpus[c].node for c in cpus),
            )
    groups = dict(cpuset_of)
    if v2:
        groups = {}
        for item in touchable:
            cs = cpuset_of.get(item.layer)
            if cs is not None and item.task.process.cpuset:
                path = v2_group(home_of(item.task.process.cpuset), cs.layer)
                groups[path] = CpusetPlan(cs.layer, path, cs.cpus, cs.mems)

    if not allow_rt and any(ly.sched.realtime for ly in policy.layers):
        notes.append("real-time scheduling is not allowed here: RT layers get nice -20 instead")
    decider = TaskPlanner(
        topo,
        policy,
        layer_cpus,
        pool,
        groups.values(),
        allow_rt=allow_rt,
        exclude_pids=exclude_pids,
        demoted=demoted_sessions,
        runaways=runaways,
    )
    decider.targets.update(targets)
    decider.cpuset_pids.update(
        item.task.pid
        for item in touchable
        if item.layer in cpuset_of and (v2 or home_of(item.task.process.cpuset) == "/")
    )
    base_of = base_affinity or {}
    task_plans: list[TaskPlan] = []
    numa_plans: dict[int, NumaPlan] = {}
    for item in touchable:
        tp, np_ = decider.decide(item, base_of.get(item.task.key))
        if np_ is not None:
            numa_plans[np_.pid] = np_
        if tp is not None:
            task_plans.append(tp)
    for name, count in sorted(decider.rt_capped.items()):
        notes.append(f"layer {name!r}: {count} threads over its real-time cap get nice -20")
    task_plans.sort(key=lambda tp: (tp.tid, tp.start_time))

    # IRQs.
    avoid = frozenset().union(
        *(layer_cpus.get(ly.name, frozenset()) for ly in policy.layers if ly.irqs == "avoid")
    )
    nic_of_irq = {irq: nic for nic in topo.nics for irq in nic.irqs}
    irq_plans: list[IrqPlan] = []
    for irq in topo.irqs:
        nic = nic_of_irq.get(irq.irq)
        if nic is not None and nic.node is not None:
            target = nic.local_cpus - avoid
            reason = f"NIC {nic.name} on node {nic.node}"
        elif avoid:
            target = online - avoid
            reason = "off the CPUs of irqs=avoid layers"
        else:
            continue  # no rule acts on this IRQ: hostd has no opinion
        if not target:
            target = online - avoid
            reason += " (its node is all avoided: any non-avoided CPU)"
        if not target:
            notes.append(f"IRQ {irq.irq}: every CPU is avoided; left as it is")
            continue
        current = irq.affinity & online
        desired = (current & target) or target
        irq_plans.append(IrqPlan(irq.irq, irq.name, desired, reason))

    # cpufreq.
    freq_plans: list[CpuFreqPlan] = []
    for layer in policy.layers:
        if not (layer.governor or layer.min_freq or layer.epp):
            continue
        for cpu_id in sorted(layer_cpus.get(layer.name, ())):
            freq = topo.cpus[cpu_id].freq
            if freq is None:
                continue
            governor = layer.governor
            if governor and governor not in freq.available_governors:
                notes.append(
                    f"cpu{cpu_id}: governor {governor!r} not offered "
                    f"({' '.join(freq.available_governors) or 'none'})"
                )
                governor = None
            floor = _min_freq(layer.min_freq, freq.hw_min_freq, freq.hw_max_freq)
            epp = layer.epp
            if epp and (freq.epp is None or (epp != "default" and epp not in freq.available_epp)):
                epp = None
            if governor or floor or epp:
                freq_plans.append(CpuFreqPlan(cpu_id, layer.name, governor, floor, epp))

    if topo.cgroup.cpuset == "none":
        notes.append("no usable cpuset controller: layers are enforced by thread affinity only")

    return Plan(
        policy=policy.name,
        policy_sha256=policy.sha256,
        mode=policy.mode,
        online=online,
        pool=pool,
        layers=tuple(layer_plans[ly.name] for ly in policy.layers),
        tasks=tuple(task_plans),
        irqs=tuple(sorted(irq_plans, key=lambda ip: ip.irq)),
        cpufreq=tuple(freq_plans),
        numa=tuple(numa_plans[pid] for pid in sorted(numa_plans)),
        cpusets=tuple(groups[path] for path in sorted(groups)),
        notes=tuple(notes),
        demoted=tuple(sorted(demoted_sessions)),
    )


def may_touch(item: Classified, layers: Mapping[str, Layer], exclude_pids: frozenset[int]) -> bool:
    """Whether hostd may change this thread: never itself, and a kernel thread only when the
    AND-group that matched it says ``is_kthread = true``."""
    task = item.task
    if task.pid in exclude_pids:
        return False
    if task.is_kthread:
        group = layers[item.layer].match[item.group]
        return any(p.name == "is_kthread" and p.value is True and not p.negate for p in group)
    return True


class TaskPlanner:
    """Per-thread decisions, given the CPUs each layer got.

    ``plan()`` runs it over every thread; the agent keeps one per full plan (``for_plan``) and
    runs it over just the threads an event concerns, so a new or renamed thread is decided in
    microseconds without re-planning the host. It remembers which threads hold a real-time slot
    (the per-layer cap) and which processes already have a NUMA target.
    """

    def __init__(
        self,
        topo: Topology,
        policy: Policy,
        layer_cpus: Mapping[str, frozenset[int]],
        pool: frozenset[int],
        cpusets: Iterable[CpusetPlan],
        *,
        allow_rt: bool,
        exclude_pids: frozenset[int] = frozenset(),
        demoted: frozenset[int] | set[int] = frozenset(),
        runaways: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
    ) -> None:
        self.topo = topo
        self.layers = {ly.name: ly for ly in policy.layers}
        self.preemptible = policy.preemptible
        self.session_nice = policy.preempt.session_nice
        self.demoted = set(demoted)  # sessions whose preemptible threads are SCHED_IDLE
        self.runaways = set(runaways)  # real-time threads that kept a CPU busy too long
        self.layer_cpus = dict(layer_cpus)
        self.pool = pool
        self.v2 = topo.cgroup.cpuset == "v2"
        self.groups = {cs.path: cs for cs in cpusets}  # hostd's cpuset cgroups by path
        self.cpusets = {cs.layer: cs for cs in self.groups.values()}  # a layer's (any one)
        self.allow_rt = allow_rt
        self.exclude_pids = exclude_pids
        self.multi_node = len(topo.nodes) > 1
        self.node_cpus = {nid: node.cpus for nid, node in topo.nodes.items()}
        self.targets: dict[int, int | None] = {}  # pid -> NUMA node of its GPUs
        self.numa_done: set[int] = set()  # pids that have their NumaPlan
        self.cpuset_pids: set[int] = set()  # processes with threads in hostd's cpusets
        self.rt_holders: dict[str, set[tuple[int, int]]] = {}
        self.rt_capped: Counter[str] = Counter()
        # The affinity depends only on (layer, node, base affinity): memoized, since at 100k
        # threads most share all three.
        self._memo: dict[tuple, frozenset[int] | None] = {}

    @classmethod
    def for_plan(
        cls,
        the_plan: Plan,
        topo: Topology,
        policy: Policy,
        *,
        allow_rt: bool,
        exclude_pids: frozenset[int] = frozenset(),
        runaways: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
    ) -> TaskPlanner:
        """The planner that made ``the_plan``, rebuilt from it (with its RT slots taken)."""
        planner = cls(
            topo,
            policy,
            {lp.name: lp.cpus for lp in the_plan.layers},
            the_plan.pool,
            the_plan.cpusets,
            allow_rt=allow_rt,
            exclude_pids=exclude_pids,
            demoted=frozenset(the_plan.demoted),
            runaways=runaways,
        )
        for tp in the_plan.tasks:
            if tp.cpuset is not None:
                planner.cpuset_pids.add(tp.pid)
            if tp.policy in ("fifo", "rr"):
                planner.rt_holders.setdefault(tp.layer, set()).add((tp.tid, tp.start_time))
        for np_ in the_plan.numa:
            planner.targets[np_.pid] = np_.node
            planner.numa_done.add(np_.pid)
        return planner

    def forget(self, key: tuple[int, int], pid: int | None = None) -> None:
        """A thread exited (and, with ``pid``, its whole process): free what it held."""
        for holders in self.rt_holders.values():
            holders.discard(key)
        if pid is not None:
            self.targets.pop(pid, None)
            self.numa_done.discard(pid)
            self.cpuset_pids.discard(pid)

    def decide(
        self, item: Classified, base: frozenset[int] | None = None
    ) -> tuple[TaskPlan | None, NumaPlan | None]:
        """The thread's plan (None: nothing to decide) and, the first time its process is seen
        with a NUMA target, the process's NumaPlan. ``base``: its affinity before hostd."""
        task, layer = item.task, self.layers[item.layer]
        own = self.layer_cpus.get(layer.name, frozenset())
        pool = self.pool
        if layer.kind == "open" or not own:
            allowed = pool
        elif layer.kind == "confined":
            allowed = own
        else:
            allowed = own | pool
        # A process with a thread in a gpu-local layer has a target node, and all its threads
        # (its comm threads too, whatever their layer) follow it there.
        node = numa = None
        pid = task.pid
        if self.multi_node:
            if pid not in self.targets and layer.numa == "gpu-local":
                self.targets[pid] = _target_node(self.topo, task.process)
            node = self.targets.get(pid)
            if node is not None and pid not in self.numa_done:
                self.numa_done.add(pid)
                numa = NumaPlan(
                    pid, task.process.start_time, task.process.comm, layer.name, node,
                    layer.numa_migrate,
                )  # fmt: skip
        if base is None:
            base = task.affinity
        memo_key = (layer.name, node, base)
        affinity = self._memo.get(memo_key, _MISSING)
        if affinity is _MISSING:
            if node is not None:
                allowed = (allowed & self.node_cpus[node]) or allowed
            desired = (allowed & base) or allowed
            affinity = self._memo[memo_key] = None if desired == base else desired
        # cpusets: v1, only threads in the root cpuset or in one of hostd's (never steal from
        # docker/k8s); v2, the layer's threaded child of the thread's own cgroup, once the full
        # plan made it. A thread is created in its creator's cpuset, so in a process hostd
        # placed in a cpuset, a thread whose layer has none is explicitly wanted back home.
        current = task.process.cpuset
        home = home_of(current)
        cs = self.cpusets.get(layer.name)
        cpuset = None
        if cs is not None and self.v2 and current:
            path = v2_group(home, layer.name)
            cpuset = path if path in self.groups else None
        elif cs is not None and home == "/":
            cpuset = cs.path
        if cpuset is not None:
            self.cpuset_pids.add(pid)
        elif current != home or (pid in self.cpuset_pids and (self.v2 or home == "/")):
            cpuset = home
            self.cpuset_pids.add(pid)
        sched = layer.sched
        sched_policy, priority, nice = sched.policy, sched.priority, sched.nice
        reset = sched.reset_on_fork if sched.realtime else False
        if sched.realtime:
            holders = self.rt_holders.setdefault(layer.name, set())
            cap = sched.max_rt_threads or 16 * len(allowed)
            if task.key in holders:
                pass
            elif not self.allow_rt or len(holders) >= cap:
                if self.allow_rt:
                    self.rt_capped[layer.name] += 1
                sched_policy, priority, nice, reset = "other", None, -20, False
            else:
                holders.add(task.key)
        if sched.realtime and task.key in self.runaways:
            # It kept a CPU busy as real-time for too long (hostd.preempt): normal scheduling.
            sched_policy, priority, nice, reset = "other", None, -20, False
        demoted = task.process.session in self.demoted
        if demoted and layer.name in self.preemptible and task.policy in NORMAL_POLICIES:
            # Only threads of the normal classes yield: another's real-time or deadline thread
            # keeps what its owner chose.
            sched_policy, priority, reset = "idle", None, False
        group_nice = None
        if self.topo.autogroup and task.tid == task.pid == task.process.session:
            if demoted and self.session_nice is not None:
                group_nice = self.session_nice
            elif sched.group_nice is not None:
                group_nice = sched.group_nice
        if (
            affinity is None
            and node is None
            and cpuset is None
            and group_nice is None
            and not (sched_policy or nice)
        ):
            return None, numa  # nothing to decide for this thread: small plans at 100k threads
        return (
            TaskPlan(
                tid=task.tid,
                start_time=task.start_time,
                pid=task.pid,
                comm=task.comm,
                layer=layer.name,
                affinity=affinity,
                policy=sched_policy,
                priority=priority,
                nice=nice,
                reset_on_fork=reset,
                node=node,
                cpuset=cpuset,
                group_nice=group_nice,
            ),
            numa,
        )


def _min_freq(spec: str | None, hw_min: int | None, hw_max: int | None) -> int | None:
    if spec is None or hw_max is None:
        return None
    if spec == "max":
        value = hw_max
    elif spec.endswith("%"):
        value = hw_max * int(spec[:-1]) // 100
    else:
        value = int(spec)
    return max(hw_min or 0, min(value, hw_max))

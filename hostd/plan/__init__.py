"""The pure planner: topology + classified threads + policy -> one frozen, sorted ``Plan``.

``plan()`` does no I/O. It composes the concerns, each in a module of its own: ``cpus`` and
``layers`` (CPUs per layer, and the cpusets holding them: the agent runs ``layers`` alone when a
layer's count changes), ``threads`` (per-thread decisions, ``TaskPlanner``), ``irq``,
``cpufreq``, ``numa`` (GPU-local nodes) and ``values`` (the ``Plan`` value). Its decisions, each
documented where it is made:

* **CPUs per layer.** Layers of kind ``confined``/``grouped`` get CPUs of their own, in policy
  order, within their ``cpus.min``/``cpus.max`` (fractions are of the online CPUs). Without
  usage statistics a layer wants one CPU per thread, clamped to [min, max]; with ``stats``
  (CPUs in use per layer) it wants 1.25x its use. Empty layers get nothing. A quarter of the
  CPUs, and at least 2, always stay in the shared pool (``pool_reserve``; the policy's
  ``pool_min`` says otherwise): every open layer
  (comm threads, data workers, system services) runs there, and a one-CPU pool starved them
  (BENCHMARKS.md, trainer throughput). A layer that gets no CPU says so in its notes and its
  threads use the pool, which is then every CPU on a small host.
* **Self-sizing layers** (``util = { low, high }``, ``hostd.plan.sizing``): their count is the
  agent's decision (``sizes``, from the utilisation of their own CPUs), still within what is
  free and the pool reserve, and their CPUs follow their ``growth`` order: the CPUs they have
  now (``current``) first, then their LLC, their node, the nearest nodes (``sticky``); whole
  LLCs (``llc``); spread over the nodes (``node``). Without ``sizes`` a self-sizing layer wants
  what a static one would.
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
  (``demoted_sessions``, less the bystanders it spares: ``spared_pids``) and which real-time
  threads ran away (``runaways``): threads of preemptible layers in a demoted session (of a
  process not spared) get SCHED_IDLE, the session's leader (not spared) gets the
  ``[preempt] session_nice`` autogroup nice, and a runaway gets SCHED_OTHER at nice -20.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hostd.classify import Classified
from hostd.model.cpus import home_of, v2_group
from hostd.model.topology import Topology
from hostd.plan.cpufreq import plan_cpufreq
from hostd.plan.cpus import layer_want, pool_reserve, smt_width_of
from hostd.plan.irq import plan_irqs
from hostd.plan.layers import plan_cpusets, plan_layers
from hostd.plan.numa import _target_node, process_gpu_nodes
from hostd.plan.threads import TaskPlanner, may_touch
from hostd.plan.values import (
    NORMAL_POLICIES,
    PLAN_FORMAT,
    CpuFreqPlan,
    CpusetPlan,
    IrqPlan,
    LayerPlan,
    NumaPlan,
    Plan,
    TaskPlan,
)
from hostd.policy import Policy

__all__ = [
    "NORMAL_POLICIES",
    "PLAN_FORMAT",
    "CpuFreqPlan",
    "CpusetPlan",
    "IrqPlan",
    "LayerPlan",
    "NumaPlan",
    "Plan",
    "TaskPlan",
    "TaskPlanner",
    "layer_want",
    "may_touch",
    "plan",
    "pool_reserve",
    "process_gpu_nodes",
    "smt_width_of",
]


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
    spared_pids: frozenset[int] = frozenset(),
    runaways: frozenset[tuple[int, int]] = frozenset(),
    weighted: bool = True,
    sizes: Mapping[str, int] | None = None,
    current: Mapping[str, frozenset[int]] | None = None,
) -> Plan:
    """Decide the desired state. Pure and deterministic: same inputs, same Plan.

    ``stats``: CPUs in use per layer name (optional). ``base_affinity``: each thread's affinity
    before hostd changed it, by (tid, start_time); defaults to the affinity seen now.
    ``allow_rt`` False (RT throttling is off, or RT is refused here) turns real-time layers into
    SCHED_OTHER at nice -20, with a note. ``demoted_sessions``, ``spared_pids`` (processes of
    demoted sessions left alone: another user's bystanders of the busy work), ``runaways``: what
    the agent's watch decided (``hostd.preempt``); ``weighted`` False: a layer's negative
    ``group_nice`` is not given, because no demoted work needs outweighing (the agent's watch
    decides it: ``hostd.agent.weights.GroupWeights.contained``). ``sizes``: a self-sizing
    layer's CPU count (``hostd.plan.sizing.decide``), used instead of ``layer_want`` while it
    has threads, still limited by what is free and the pool reserve; ``current``: each layer's
    CPUs now, which a self-sizing layer keeps first (``hostd.plan.sizing.place``). Without them,
    and for layers without ``util``, CPUs are planned as without self-sizing.
    """
    online = topo.online
    notes: list[str] = list(topo.notes)
    layers = {ly.name: ly for ly in policy.layers}

    # Which threads hostd may touch, who is in each layer, the cgroups they are in (one loop:
    # it runs over every thread of the host), and per process a GPU node target, for gpu-local
    # layers.
    touchable: list[Classified] = []
    cpusets: dict[str, set[str]] = {}
    targets: dict[int, int | None] = {}
    gpu_local = {ly.name for ly in policy.layers if ly.numa == "gpu-local"}
    for item in classified:
        proc = item.task.process
        if proc.pid in exclude_pids or (
            proc.is_kthread and not may_touch(item, layers, exclude_pids)
        ):
            continue
        touchable.append(item)
        if proc.cpuset:
            cpusets.setdefault(item.layer, set()).add(proc.cpuset)
        if item.layer in gpu_local and proc.pid not in targets:
            targets[proc.pid] = _target_node(topo, proc)
    members = Counter(item.layer for item in touchable)

    # CPUs per layer (hostd.plan.layers), then hostd's cpusets holding them.
    by_target: dict[str, Counter[int]] = {}
    for item in touchable if targets else ():
        node = targets.get(item.task.pid)
        if node is not None:
            by_target.setdefault(item.layer, Counter())[node] += 1
    layer_plans, pool = plan_layers(
        topo, policy, members, by_target, stats=stats, sizes=sizes, current=current
    )
    layer_cpus = {name: lp.cpus for name, lp in layer_plans.items() if lp.kind != "open"}
    homes = {layer: {home_of(path) for path in paths} for layer, paths in cpusets.items()}
    groups = plan_cpusets(topo, policy, layer_cpus, pool, homes)
    v2 = topo.cgroup.cpuset == "v2"
    with_cpuset = {n for n, c in layer_cpus.items() if c and topo.cgroup.cpuset in ("v1", "v2")}

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
        spared=spared_pids,
        runaways=runaways,
        weighted=weighted,
    )
    decider.targets.update(targets)
    decider.cpuset_pids.update(
        item.task.pid
        for item in touchable
        if item.layer in with_cpuset
        and (
            v2_group(home_of(item.task.process.cpuset), item.layer) in groups
            if v2
            else home_of(item.task.process.cpuset) == "/"
        )
    )
    base_of = base_affinity.get if base_affinity else None  # (asked once: it may be lazy)
    task_plans: list[TaskPlan] = []
    numa_plans: dict[int, NumaPlan] = {}
    for item in touchable:
        tp, np_ = decider.decide(item, base_of(item.task.key) if base_of else None)
        if np_ is not None:
            numa_plans[np_.pid] = np_
        if tp is not None:
            task_plans.append(tp)
    for name, count in sorted(decider.rt_capped.items()):
        notes.append(f"layer {name!r}: {count} threads over its real-time cap get nice -20")
    task_plans.sort(key=lambda tp: (tp.tid, tp.start_time))

    irq_plans = plan_irqs(topo, policy, layer_cpus, notes)
    freq_plans = plan_cpufreq(topo, policy, layer_cpus, notes)

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
        spared=tuple(sorted(spared_pids)),
        weighted=weighted,
    )

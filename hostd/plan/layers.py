"""CPUs per layer and the cpusets that hold them: the part of the plan that depends only on how
many threads each layer has (and, for ``gpu-local`` layers, on which nodes their GPUs sit).

``plan()`` runs it once per full pass; the agent runs it again alone when events or the sizer
change a layer's count (``hostd.agent.incremental``: a layer's first member, a resize), so that
a layer gets its CPUs in milliseconds, without reading or deciding every thread again. The
decisions it makes are documented in ``hostd.plan``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from hostd.model.cpus import CPUSET_ROOT, v2_group
from hostd.model.node import place as node_place
from hostd.model.topology import Topology
from hostd.plan.cpus import _Allocator, _split, layer_want, pool_reserve, smt_width_of
from hostd.plan.sizing import place
from hostd.plan.values import CpusetPlan, LayerPlan
from hostd.policy import Policy


def plan_layers(
    topo: Topology,
    policy: Policy,
    members: Mapping[str, int],
    targets: Mapping[str, Counter[int]] | None = None,
    *,
    stats: Mapping[str, float] | None = None,
    sizes: Mapping[str, int] | None = None,
    current: Mapping[str, frozenset[int]] | None = None,
) -> tuple[dict[str, LayerPlan], frozenset[int]]:
    """Each layer's plan (its CPUs, in policy order) and the shared pool.

    ``members``: threads hostd may touch, per layer. ``targets``: per ``gpu-local`` layer, its
    threads counted by the NUMA node of their process's GPUs. ``stats``, ``sizes``, ``current``:
    as ``hostd.plan.plan`` takes them.
    """
    online = topo.online
    total = len(online)
    multi_node = len(topo.nodes) > 1
    alloc = _Allocator(topo)
    reserve = pool_reserve(total, policy.pool_min)
    smt_width = smt_width_of(topo)
    gpu_node_weights = Counter(g.node for g in topo.gpus if g.node is not None)
    now = {name: frozenset(cpus) & online for name, cpus in (current or {}).items()}
    layer_plans: dict[str, LayerPlan] = {}
    for layer in policy.layers:
        if layer.kind == "open":
            continue
        n = members.get(layer.name, 0)
        lo = layer.cpus_min.resolve(total)
        if layer.self_sizing and sizes is not None and layer.name in sizes:
            want = max(0, int(sizes[layer.name])) if n else 0
        else:
            want = layer_want(layer, n, total, smt_width, stats)
        budget = max(0, len(alloc.free) - reserve)
        layer_notes: list[str] = []
        if want > budget:
            layer_notes.append(f"wanted {want} CPUs, {budget} left")
        count = min(want, budget)
        # Where: a share per node.
        shares: dict[int, int] | None
        if layer.numa == "gpu-local" and multi_node and gpu_node_weights:
            by_target = (targets or {}).get(layer.name) or Counter()
            weights = by_target or gpu_node_weights
            shares = _split(count, dict(weights))
        elif layer.self_sizing:
            shares = None  # its growth order says where (hostd.plan.sizing)
        else:
            best = max(topo.nodes, key=lambda nid: (alloc.free_on(nid), -nid))
            shares = {best: count}
        taken: set[int] = set()
        if layer.self_sizing:  # the CPUs it has now first, then by its growth order
            others = frozenset().union(*(c for name, c in now.items() if name != layer.name))
            taken = set(
                place(
                    topo, alloc.free, count, growth=layer.growth, whole_cores=layer.latency,
                    mine=now.get(layer.name, frozenset()), avoid=others, shares=shares,
                )
            )  # fmt: skip
            alloc.free -= taken
        else:
            assert shares is not None
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
    ordered: dict[str, LayerPlan] = {}
    for layer in policy.layers:
        ordered[layer.name] = layer_plans.get(layer.name) or LayerPlan(
            layer.name, "open", frozenset(), pool_mems, members.get(layer.name, 0), 0
        )
    return ordered, pool


def plan_cpusets(
    topo: Topology,
    policy: Policy,
    layer_cpus: Mapping[str, frozenset[int]],
    pool: frozenset[int],
    homes: Mapping[str, set[str]] | None = None,
) -> dict[str, CpusetPlan]:
    """hostd's cpuset cgroups by path: one per layer with CPUs of its own on v1 (in hostd's
    ``/hostd``), one per layer and home cgroup of its threads on v2 (``homes``: per layer, the
    home cgroups of its members' processes). A ``grouped`` layer's also holds the pool."""
    if topo.cgroup.cpuset not in ("v1", "v2"):
        return {}
    cpuset_of: dict[str, CpusetPlan] = {}
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
    if topo.cgroup.cpuset == "v1":
        return {cs.path: cs for cs in cpuset_of.values()}
    groups: dict[str, CpusetPlan] = {}
    for name, cs in cpuset_of.items():
        for home in (homes or {}).get(name, ()):
            if may_split(home, policy):
                path = v2_group(home, name)
                groups[path] = CpusetPlan(name, path, cs.cpus, cs.mems)
    return groups


def may_split(home: str, policy: Policy) -> bool:
    """Whether hostd may make its v2 cpusets in ``home``: the root, or a cgroup of a kind the
    policy's ``[cgroups] write`` lists (any other is a manager's: systemd's units, the kubelet's
    pods, a container runtime's, Slurm's steps; there the layer's threads get their affinity
    only, which applies in every cgroup)."""
    return home == "/" or node_place(home).kind in policy.cgroups_write

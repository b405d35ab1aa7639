"""CPUs per layer: how many a layer wants, how many stay in the pool, and which ones it gets
(whole cores for latency layers, from the top of a node down, CPU 0 last).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from hostd.model.topology import Topology
from hostd.policy import CpuAmount, Layer


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

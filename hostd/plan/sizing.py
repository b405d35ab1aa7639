"""Self-sizing layers (``util = { low, high }``): how many CPUs each gets, and which ones.

Pure: no I/O, deterministic (same inputs, same answer). The agent calls ``decide`` once per
``[sizing] interval`` with the utilisation of each self-sizing layer's own CPUs, and passes the
counts to ``hostd.plan.plan(sizes=..., current=...)``, which places each self-sizing layer's
CPUs with ``place`` by its growth order. As in scx_layered: a utilisation band (its
``util_range``) within CPU bounds (its ``cpus_range``), and growth orders.

* **Grow** within one interval: when the newest interval's utilisation is above ``util.high``,
  to ``max(count + one step, ceil(used / target))`` CPUs, where ``used = util x count`` and
  ``target = (low + high) / 2``; a step is one CPU, or one core (the SMT width) for latency
  layers (``Layer.latency``), whose counts stay whole cores.
* **Shrink** only when every interval of the last ``shrink_after`` seconds
  (``shrink_window``: ``ceil(shrink_after / interval)`` values) was below ``util.low``, to
  ``ceil(most used over that window / target)``, whole cores for latency layers. Fewer values
  than that: no shrink. So a layer grows at once and shrinks slowly, and one that hovers around
  its band does not flap: after a change its utilisation sits near ``target``, inside the band.
* **Bounds**: never below ``cpus.min`` (rounded up to whole cores), never below one core while
  the layer has threads, never above ``cpus.max`` (rounded down to whole cores, at least one).
  A layer with threads and no CPUs starts at its min (or one core). A layer without threads
  gets 0 (the planner gives an empty layer nothing anyway).

``history`` holds, per self-sizing layer that has threads, its CPUs' utilisation (busy time
over capacity, 0..1) in each past interval, newest last, all measured at its current count:
the agent starts a layer's history afresh when its count changes (``replay`` does so), which
also makes a layer wait ``shrink_after`` after any change before it shrinks.

**Which CPUs** (``place``, by ``Layer.growth``):

* ``sticky`` (default): first the CPUs it has now that are still free; when it grows, (whole)
  cores from the LLC that holds most of its CPUs, then from that LLC's NUMA node, then from the
  other nodes, nearest first; when it shrinks, it drops CPUs from the LLCs where it has fewest,
  so it keeps its cache.
* ``llc``: whole LLCs: first the LLCs it has CPUs in (most first), then the LLC with the most
  free CPUs; it shrinks like ``sticky``.
* ``node``: spread evenly over the NUMA nodes (as far as each has free CPUs), sticky within each.

``numa = "gpu-local"`` layers keep the planner's per-node GPU shares (``shares``), and the
growth order applies within each node. Everywhere the core holding CPU 0 comes last (the pool
keeps it), and CPUs another layer holds now (``avoid``) come after those nobody holds.

``replay`` runs ``decide`` over a trace of CPUs used per layer and interval (the format of
``tests/fixtures/traces/*.json``), for tests and for tuning a policy's band.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from hostd.model.topology import Topology
from hostd.plan.cpus import smt_width_of
from hostd.policy import Layer, Policy, Sizing

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Decision:
    """A self-sizing layer's CPU count for the next interval, and why, in words."""

    layer: str
    count: int
    was: int
    why: str  # "grow: 95% busy over 1 s, above 80%", "shrink: below 50% for 10 s", "keep"

    @property
    def changed(self) -> bool:
        return self.count != self.was


def shrink_window(sizing: Sizing) -> int:
    """How many intervals (history values) must all be below ``util.low`` before a shrink: the
    agent needs to keep no more than that many per layer."""
    return max(1, math.ceil(sizing.shrink_after / sizing.interval - _EPS))


def _up(count: int, step: int) -> int:
    return -(-count // step) * step


def bounds(layer: Layer, total: int, smt_width: int) -> tuple[int, int, int]:
    """(step, lowest, highest): a self-sizing layer with threads moves by ``step`` CPUs (one
    core for latency layers, else one CPU) within [lowest, highest] CPUs of ``total``."""
    step = smt_width if layer.latency and smt_width > 1 else 1
    hi = min(max(layer.cpus_max.resolve(total), 1), max(total, 1))
    hi = max(step, hi // step * step)
    lo = min(max(_up(layer.cpus_min.resolve(total), step), step), hi)
    return step, lo, hi


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def decide(
    policy: Policy,
    topo: Topology,
    history: Mapping[str, Sequence[float]],
    current: Mapping[str, int],
    *,
    members: Mapping[str, int] | None = None,
) -> dict[str, Decision]:
    """Each self-sizing layer's CPU count for the next interval (rules: the module's doc).

    ``history``: per self-sizing layer with threads, its CPUs' utilisation per past interval
    (0..1, newest last, at its current count); ``current``: its CPU count now (absent: 0).
    ``members``: threads per layer; None: a layer has threads when it is in ``history``.
    Only layers with ``util`` are decided; every one of them gets a Decision.
    """
    total = len(topo.cpus)
    smt = smt_width_of(topo)
    window = shrink_window(policy.sizing)
    out: dict[str, Decision] = {}
    for layer in policy.self_sizing:
        name = layer.name
        was = max(0, int(current.get(name, 0)))
        busy = (members.get(name, 0) > 0) if members is not None else name in history
        if not busy:
            out[name] = Decision(name, 0, was, "empty: no threads" if was else "keep: no threads")
            continue
        step, lo, hi = bounds(layer, total, smt)
        if was == 0:
            what = f"its min of {lo}" if lo > step else f"one {'core' if step > 1 else 'CPU'}"
            out[name] = Decision(name, lo, 0, f"start: {what}")
            continue
        seen = [min(1.0, max(0.0, float(u))) for u in history.get(name, ())]
        out[name] = _decide_one(layer, policy.sizing, seen, was, step, lo, hi, window)
    return out


def _decide_one(
    layer: Layer,
    sizing: Sizing,
    seen: list[float],
    was: int,
    step: int,
    lo: int,
    hi: int,
    window: int,
) -> Decision:
    assert layer.util_low is not None and layer.util_high is not None
    low, high = layer.util_low, layer.util_high
    target = (low + high) / 2
    name = layer.name
    new, why = was, "keep"
    if seen and seen[-1] > high:
        grown = min(_up(max(was + step, math.ceil(seen[-1] * was / target - _EPS)), step), hi)
        if grown > was:
            new = grown
            why = f"grow: {_pct(seen[-1])} busy over {sizing.interval:g} s, above {_pct(high)}"
        else:
            why = f"keep: {_pct(seen[-1])} busy, at its max of {hi}"
    elif len(seen) >= window and all(u < low for u in seen[-window:]):
        most = max(seen[-window:])
        shrunk = max(lo, _up(math.ceil(most * was / target - _EPS), step))
        if shrunk < was:
            new = shrunk
            why = f"shrink: below {_pct(low)} for {sizing.shrink_after:g} s (at most {_pct(most)})"
    if new > hi:
        return Decision(name, hi, was, f"bounds: above its max of {hi}")
    if new < lo:
        return Decision(name, lo, was, f"bounds: below its min of {lo}")
    if new % step:
        new, why = min(_up(new, step), hi), f"bounds: whole cores of {step} CPUs"
    return Decision(name, new, was, why)


# -- which CPUs ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Unit:
    """A core's CPUs that may be taken together (all of them, for whole cores)."""

    core: int
    cpus: tuple[int, ...]
    llc: int
    node: int
    cpu0: bool  # the core that holds CPU 0 (the pool keeps it)
    whole: bool  # every online sibling is there (no other layer has part of the core)


def _units(topo: Topology, scope: Set[int], whole: bool) -> list[_Unit]:
    by_core: dict[int, list[int]] = {}
    for cpu in sorted(scope):
        by_core.setdefault(topo.cpus[cpu].core, []).append(cpu)
    out = []
    for core, cpus in sorted(by_core.items()):
        info = topo.cpus[cpus[0]]
        complete = info.siblings & topo.online <= scope
        if whole and not complete:
            continue  # a latency layer shares no core with another layer
        out.append(_Unit(core, tuple(cpus), info.llc, info.node, 0 in info.siblings, complete))
    return out


def _count_by(topo: Topology, cpus: Set[int], attr: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for cpu in cpus:
        key = getattr(topo.cpus[cpu], attr)
        out[key] = out.get(key, 0) + 1
    return out


def _distance(topo: Topology, a: int, b: int) -> int:
    dist = topo.nodes[a].distances if a in topo.nodes else ()
    return dist[b] if 0 <= b < len(dist) else (10 if a == b else 255)


def _fill(units: list[_Unit], need: int, whole: bool, into: set[int]) -> int:
    """Take ``units`` in order into ``into`` until ``need`` CPUs; return what is still needed."""
    for unit in units:
        if need <= 0:
            break
        cpus = [c for c in unit.cpus if c not in into]
        if not cpus or (whole and len(cpus) > need):
            continue
        part = cpus[:need]
        into.update(part)
        need -= len(part)
    return need


def _pick(
    topo: Topology,
    scope: Set[int],
    count: int,
    growth: str,
    mine: Set[int],
    whole: bool,
    avoid: Set[int],
) -> set[int]:
    """``count`` CPUs of ``scope`` for one layer: its own first (fewest-LLC ones dropped), then
    more by ``growth`` ("sticky" or "llc")."""
    taken: set[int] = set()
    if count <= 0 or not scope:
        return taken
    units = _units(topo, scope, whole)
    own = mine & scope
    own_llc = _count_by(topo, own, "llc")
    own_node = _count_by(topo, own, "node")
    # Keep: its own CPUs, from the LLCs (then nodes) where it has most; the rest is dropped
    # (CPU 0's core first: the pool keeps it).
    keep = sorted(
        (u for u in units if own.intersection(u.cpus)),
        key=lambda u: (u.cpu0, -own_llc.get(u.llc, 0), -own_node.get(u.node, 0), -u.llc, -u.core),
    )
    if whole:
        need = _fill(keep, count, whole, taken)
    else:
        need = _fill([_Unit(u.core, tuple(c for c in u.cpus if c in own), u.llc, u.node,
                            u.cpu0, u.whole) for u in keep], count, whole, taken)  # fmt: skip
    if need <= 0:
        return taken
    # Grow: CPU 0's core last of all; a core it has part of before others, whole free cores
    # before those another layer has part of; CPUs other layers have now after the rest.
    free_llc = _count_by(topo, scope, "llc")
    free_node = _count_by(topo, scope, "node")
    ref = taken or (mine & topo.online)
    ref_llc = _count_by(topo, ref, "llc")
    held = _count_by(topo, taken, "llc")
    if growth == "llc":
        rank = {
            llc: (-held.get(llc, 0), -free_llc[llc], -ref_llc.get(llc, 0), -llc) for llc in free_llc
        }
        order = sorted(
            units,
            key=lambda u: (
                u.cpu0, rank[u.llc], not taken.intersection(u.cpus), not u.whole,
                bool(avoid.intersection(u.cpus)), -u.core,
            ),
        )  # fmt: skip
    else:
        home_llc: int | None = None
        if ref_llc:  # the LLC that holds most of its CPUs, and that LLC's node
            home_llc = max(ref_llc, key=lambda llc: (ref_llc[llc], llc))
            home_node = min(topo.cpus[c].node for c in ref if topo.cpus[c].llc == home_llc)
        else:  # nothing yet: the node with the most free CPUs, as the planner starts a layer
            home_node = max(free_node, key=lambda nid: (free_node[nid], -nid))

        def tier(u: _Unit) -> int:
            return 0 if u.llc == home_llc else 1 if u.node == home_node else 2

        order = sorted(
            units,
            key=lambda u: (
                u.cpu0, tier(u), _distance(topo, home_node, u.node), -free_node[u.node], u.node,
                not taken.intersection(u.cpus), not u.whole, bool(avoid.intersection(u.cpus)),
                -ref_llc.get(u.llc, 0), -u.llc, -u.core,
            ),
        )  # fmt: skip
    _fill(order, need, whole, taken)
    return taken


def _even_shares(
    topo: Topology, free: Set[int], count: int, step: int, whole: bool, mine: Set[int]
) -> dict[int, int]:
    """``count`` CPUs split evenly over the NUMA nodes, as far as each has room (in steps)."""
    room = dict.fromkeys(sorted(topo.nodes), 0)
    for unit in _units(topo, free, whole):
        room[unit.node] = room.get(unit.node, 0) + len(unit.cpus)
    caps = {nid: cpus // step for nid, cpus in room.items()}
    mine_on = _count_by(topo, mine, "node")
    shares = dict.fromkeys(caps, 0)
    left = count // step
    active = [nid for nid in caps if caps[nid] > 0]
    while left > 0 and active:
        order = sorted(active, key=lambda nid: (-mine_on.get(nid, 0), nid))
        each, extra = divmod(left, len(order))
        for i, nid in enumerate(order):
            give = min(each + (1 if i < extra else 0), caps[nid] - shares[nid])
            shares[nid] += give
            left -= give
        active = [nid for nid in active if shares[nid] < caps[nid]]
    return {nid: share * step for nid, share in shares.items() if share}


def place(
    topo: Topology,
    free: Set[int],
    count: int,
    *,
    growth: str = "sticky",
    whole_cores: bool = False,
    mine: Set[int] = frozenset(),
    avoid: Set[int] = frozenset(),
    shares: Mapping[int, int] | None = None,
) -> frozenset[int]:
    """Which ``count`` CPUs of ``free`` a self-sizing layer gets (fewer when ``free`` lacks
    them, whole cores only with ``whole_cores``): by ``growth`` (the module's doc), from
    ``mine`` (the CPUs it has now) first, CPUs in ``avoid`` (other layers' now) last.
    ``shares``: CPUs per NUMA node to take first (a ``gpu-local`` layer's), the growth order
    applying within each node. The caller keeps ``count`` within what the pool may give."""
    if count <= 0:
        return frozenset()
    step = smt_width_of(topo) if whole_cores else 1
    if shares is None and growth == "node":
        shares = _even_shares(topo, free, count, step, whole_cores, mine)
    within = "sticky" if growth == "node" else growth
    taken: set[int] = set()
    if shares is not None:
        for nid, share in sorted(shares.items()):
            scope = {c for c in free if topo.cpus[c].node == nid} - taken
            taken |= _pick(topo, scope, min(share, count - len(taken)), within, mine, whole_cores,
                           avoid)  # fmt: skip
    short = count - len(taken)
    if short > 0:  # no shares, or a node ran short: the rest from anywhere, nearest first
        taken |= _pick(topo, set(free) - taken, short, within, mine | taken, whole_cores, avoid)
    return frozenset(taken)


# -- replaying a trace ---------------------------------------------------------------------------
def replay(
    policy: Policy,
    topo: Topology,
    trace: Mapping[str, object],
    start_counts: Mapping[str, int],
) -> list[dict[str, int]]:
    """The CPU count of each of the trace's layers after each interval's decision.

    ``trace``: ``{"interval_s": 1.0, "layers": {name: [CPUs used in each interval, ...]}}``
    (the CPUs a layer's threads kept busy, or would have with CPUs enough: its demand). Each
    interval, a layer with ``count`` CPUs shows ``min(1, used / count)`` utilisation; its
    history starts afresh when its count changes, as the agent's does. Every layer of the
    trace has threads throughout. ``interval_s`` must be the policy's ``[sizing] interval``.
    """
    interval = float(trace["interval_s"])  # type: ignore[arg-type]
    if abs(interval - policy.sizing.interval) > _EPS:
        raise ValueError(
            f"the trace's interval_s ({interval:g}) is not the policy's "
            f"[sizing] interval ({policy.sizing.interval:g})"
        )
    layers: Mapping[str, Sequence[float]] = trace["layers"]  # type: ignore[assignment]
    length = min((len(v) for v in layers.values()), default=0)
    counts = {name: int(start_counts.get(name, 0)) for name in layers}
    history: dict[str, list[float]] = {name: [] for name in layers}
    window = shrink_window(policy.sizing)
    out: list[dict[str, int]] = []
    for i in range(length):
        for name, used in layers.items():
            if counts[name] > 0:
                history[name].append(min(1.0, float(used[i]) / counts[name]))
                del history[name][:-window]
        for name, decision in decide(policy, topo, history, counts).items():
            if name in counts and decision.count != counts[name]:
                counts[name] = decision.count
                history[name] = []
        out.append(dict(counts))
    return out

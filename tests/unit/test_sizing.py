"""Self-sizing layers (hostd.plan.sizing): the policy keys, the decisions (grow at once, shrink
slowly, no flapping, within bounds, whole cores for latency layers), where the planner puts
their CPUs (sticky, llc, node, gpu-local, the pool reserve), and a replay of a one-minute
training trace (tests/fixtures/traces/training-1min.json), over synthetic hosts (tests/synth.py).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from hostd.classify import Classifier
from hostd.plan import plan
from hostd.plan.cpus import pool_reserve, smt_width_of
from hostd.plan.sizing import Decision, bounds, decide, place, replay, shrink_window
from hostd.policy import Sizing, parse_policy
from tests import synth

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "fixtures" / "traces" / "training-1min.json"

# Layers for the decisions: a latency layer (irqs = "avoid": whole cores), a plain one, and a
# static one that is never decided.
DECIDE = b"""
version = 1
[[layer]]
name = "fast"
comment = "latency: whole cores"
match = [[{ comm_prefix = "fast" }]]
kind = "grouped"
cpus = { min = 4, max = 16 }
util = { low = 0.5, high = 0.8 }
irqs = "avoid"

[[layer]]
name = "bulk"
comment = "plain"
match = [[{ comm_prefix = "bulk" }]]
kind = "confined"
cpus = { min = 1, max = 24 }
util = { low = 0.5, high = 0.8 }

[[layer]]
name = "static"
comment = "no util: never decided"
match = [[{ comm_prefix = "static" }]]
kind = "confined"
cpus = { min = 1, max = 4 }

[[layer]]
name = "rest"
comment = "everything else"
match = [[]]
"""

# Layers for placement: one per growth order, a latency one, a gpu-local one, and a static
# layer first (it takes CPUs from the top of a node down, before the others).
PLACE = b"""
version = 1
[[layer]]
name = "static"
comment = "static, first"
match = [[{ comm_prefix = "static" }]]
kind = "confined"
cpus = { min = 1, max = 8 }

[[layer]]
name = "bulk"
comment = "sticky"
match = [[{ comm_prefix = "bulk" }]]
kind = "confined"
util = { low = 0.5, high = 0.8 }

[[layer]]
name = "other"
comment = "sticky too"
match = [[{ comm_prefix = "other" }]]
kind = "confined"
util = { low = 0.5, high = 0.8 }

[[layer]]
name = "cache"
comment = "whole LLCs"
match = [[{ comm_prefix = "cache" }]]
kind = "confined"
util = { low = 0.5, high = 0.8 }
growth = "llc"

[[layer]]
name = "wide"
comment = "spread over the nodes"
match = [[{ comm_prefix = "wide" }]]
kind = "confined"
util = { low = 0.5, high = 0.8 }
growth = "node"

[[layer]]
name = "fast"
comment = "latency: whole cores"
match = [[{ comm_prefix = "fast" }]]
kind = "grouped"
util = { low = 0.5, high = 0.8 }
irqs = "avoid"

[[layer]]
name = "gpu"
comment = "gpu-local"
match = [[{ comm_prefix = "gpu" }]]
kind = "grouped"
util = { low = 0.5, high = 0.8 }
numa = "gpu-local"

[[layer]]
name = "rest"
comment = "everything else"
match = [[]]
"""

# The trace's job: the trainer (latency, grouped), its data loaders and its compilers.
JOB = b"""
version = 1
[[layer]]
name = "trainer"
comment = "ranks"
match = [[{ comm_prefix = "trainer" }]]
kind = "grouped"
cpus = { min = 2, max = "50%" }
util = { low = 0.5, high = 0.8 }
irqs = "avoid"

[[layer]]
name = "data"
comment = "data loaders"
match = [[{ comm_prefix = "pt_data" }]]
kind = "confined"
cpus = { min = 1, max = 16 }
util = { low = 0.5, high = 0.8 }

[[layer]]
name = "compile"
comment = "compilers"
match = [[{ comm_prefix = "cc1" }]]
kind = "confined"
cpus = { min = 1, max = 32 }
util = { low = 0.5, high = 0.8 }
growth = "llc"

[[layer]]
name = "rest"
comment = "everything else"
match = [[]]
"""


def policy(text: bytes = DECIDE, sizing: str = ""):
    return parse_policy(text.replace(b"version = 1\n", b"version = 1\n" + sizing.encode()), "t")


def changes(series: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(series) if a != b)


# -- the policy keys ---------------------------------------------------------------------------
def test_policy_values_and_defaults():
    p = policy(sizing="[sizing]\ninterval = 0.5\nshrink_after = 3\n")
    fast, bulk, static = p.layer("fast"), p.layer("bulk"), p.layer("static")
    assert (fast.util_low, fast.util_high, fast.growth) == (0.5, 0.8, "sticky")
    assert fast.self_sizing and bulk.self_sizing and not static.self_sizing
    assert (static.util_low, static.util_high) == (None, None)
    assert [ly.name for ly in p.self_sizing] == ["fast", "bulk"]
    assert (p.sizing.interval, p.sizing.shrink_after) == (0.5, 3.0)
    assert policy().sizing == Sizing(interval=1.0, shrink_after=10.0)
    band = policy(DECIDE.replace(b"{ low = 0.5, high = 0.8 }", b"{ high = 0.9 }", 1))
    assert (band.layer("fast").util_low, band.layer("fast").util_high) == (0.5, 0.9)
    assert (
        policy(DECIDE.replace(b"{ low = 0.5, high = 0.8 }", b"{}", 1)).layer("fast").util_high
        == 0.8
    )


@pytest.mark.parametrize(
    ("interval", "shrink_after", "window"),
    [(1.0, 10.0, 10), (0.5, 5.0, 10), (2.0, 5.0, 3), (1.0, 1.0, 1), (0.3, 0.9, 3)],
)
def test_shrink_window(interval, shrink_after, window):
    assert shrink_window(Sizing(interval, shrink_after)) == window


# -- the decisions -----------------------------------------------------------------------------
TOPO = synth.topology("2x32x2", gpus=8)  # 128 CPUs, SMT 2

# (case, layer, history, count now, count decided, why starts with)
DECISIONS = [
    (
        "grow within one interval",
        "bulk",
        [0.6, 0.6, 0.95],
        8,
        12,
        "grow: 95% busy over 1 s, above 80%",
    ),
    ("grow to fit the use", "bulk", [0.81], 10, 13, "grow: 81% busy"),
    ("grow at least a step", "bulk", [0.85], 1, 2, "grow: 85%"),
    ("grow a latency layer by whole cores", "fast", [0.9], 4, 6, "grow: 90%"),
    ("grow a latency layer to whole cores", "fast", [1.0], 6, 10, "grow: 100%"),
    ("grow up to the max", "bulk", [1.0], 20, 24, "grow: 100%"),
    ("at the max: keep", "bulk", [1.0], 24, 24, "keep: 100% busy, at its max of 24"),
    ("latency max is whole cores", "fast", [1.0], 14, 16, "grow"),
    ("exactly high: keep", "bulk", [0.8], 8, 8, "keep"),
    ("in the band: keep", "bulk", [0.6] * 30, 8, 8, "keep"),
    ("below low, not long enough: keep", "bulk", [0.1] * 9, 8, 8, "keep"),
    ("below low for shrink_after: shrink", "bulk", [0.1] * 10, 8, 2, "shrink: below 50% for 10 s"),
    ("shrink to the most used in the window", "bulk", [0.1] * 9 + [0.4], 8, 5, "shrink"),
    ("the most used may come first", "bulk", [0.4] + [0.1] * 9, 8, 5, "shrink"),
    ("only the window counts", "bulk", [0.45] + [0.1] * 10, 8, 2, "shrink"),
    ("one interval in the band: keep", "bulk", [0.1] * 5 + [0.55] + [0.1] * 4, 8, 8, "keep"),
    ("exactly low is not below", "bulk", [0.5] * 10, 8, 8, "keep"),
    ("shrink never below one CPU", "bulk", [0.0] * 10, 8, 1, "shrink"),
    ("shrink a latency layer to whole cores", "fast", [0.35] * 10, 12, 8, "shrink"),
    ("shrink a latency layer, exact cores", "fast", [0.3] * 10, 12, 6, "shrink"),
    ("shrink never below the min", "fast", [0.05] * 10, 8, 4, "shrink"),
    ("at the min: keep", "fast", [0.05] * 10, 4, 4, "keep"),
    ("threads, no CPUs: start at the min", "fast", [], 0, 4, "start: its min of 4"),
    ("threads, no CPUs: start at one CPU", "bulk", [], 0, 1, "start: one CPU"),
    ("no history yet: keep", "bulk", [], 6, 6, "keep"),
    ("above the max: bounds", "bulk", [0.6], 30, 24, "bounds: above its max of 24"),
    ("below the min: bounds", "fast", [0.6], 2, 4, "bounds: below its min of 4"),
    ("half a core: whole cores", "fast", [0.6], 5, 6, "bounds: whole cores of 2 CPUs"),
]


@pytest.mark.parametrize(
    ("layer", "history", "count", "decided", "why"),
    [pytest.param(*case[1:], id=case[0]) for case in DECISIONS],
)
def test_decide(layer, history, count, decided, why):
    p = policy()
    got = decide(p, TOPO, {layer: history}, {layer: count})
    assert got[layer] == Decision(layer, decided, count, got[layer].why)
    assert got[layer].why.startswith(why), got[layer].why
    assert got[layer].changed == (decided != count)


def test_only_self_sizing_layers_are_decided_and_each_of_them_is():
    p = policy()
    got = decide(p, TOPO, {"bulk": [0.6], "static": [1.0]}, {"bulk": 4, "static": 2, "fast": 6})
    assert set(got) == {"fast", "bulk"}
    # fast has no history: no threads (the agent gives history to layers with threads)
    assert got["fast"] == Decision("fast", 0, 6, "empty: no threads")
    assert decide(p, TOPO, {}, {})["bulk"] == Decision("bulk", 0, 0, "keep: no threads")


def test_members_say_who_has_threads():
    p = policy()
    got = decide(p, TOPO, {"bulk": [0.95]}, {"bulk": 4, "fast": 0}, members={"bulk": 0, "fast": 3})
    assert (got["bulk"].count, got["bulk"].why) == (0, "empty: no threads")
    assert (got["fast"].count, got["fast"].why) == (4, "start: its min of 4")


def test_the_shrink_window_follows_the_sizing_table():
    p = policy(sizing="[sizing]\ninterval = 0.5\nshrink_after = 2\n")  # 4 values
    assert decide(p, TOPO, {"bulk": [0.1] * 3}, {"bulk": 8})["bulk"].count == 8
    shrunk = decide(p, TOPO, {"bulk": [0.1] * 4}, {"bulk": 8})["bulk"]
    assert (shrunk.count, shrunk.why) == (2, "shrink: below 50% for 2 s (at most 10%)")


def test_decisions_stay_within_bounds_on_random_histories():
    p = policy()
    rng = random.Random(7)
    smt = smt_width_of(TOPO)
    for _ in range(3000):
        name = rng.choice(["fast", "bulk"])
        layer = p.layer(name)
        step, lo, hi = bounds(layer, len(TOPO.cpus), smt)
        count = rng.randint(0, 40)
        history = [
            rng.choice([rng.random(), rng.uniform(0, 0.5)]) for _ in range(rng.randint(0, 14))
        ]
        d = decide(p, TOPO, {name: history}, {name: count})[name]
        assert lo <= d.count <= hi, (name, history, count, d)
        assert d.count % step == 0, (name, history, count, d)
        if history and history[-1] > layer.util_high and lo <= count <= hi:
            assert d.count >= count, d  # never shrinks while saturated
        if count and len(history) < 10 and d.count < count:
            assert d.why.startswith("bounds"), d  # no shrink before shrink_after


def _oscillate(pattern: list[float], n: int = 60) -> list[float]:
    return [pattern[i % len(pattern)] for i in range(n)]


# (case, CPUs used per interval, start count, most changes allowed over the minute)
FLAPPING = [
    ("alternating across both edges", _oscillate([3.6, 6.8]), 8, 1),
    ("slow wave around the band", _oscillate([4.0, 5.0, 6.0, 7.0, 6.0, 5.0]), 8, 1),
    ("noise inside and just outside the band", None, 8, 2),
    ("spikes above high every 5 s", _oscillate([4.0, 4.0, 4.0, 4.0, 7.2]), 8, 1),
    ("dips below low every 5 s", _oscillate([5.0, 5.0, 5.0, 5.0, 3.0]), 8, 0),
]


@pytest.mark.parametrize(
    ("used", "start", "most"), [pytest.param(*c[1:], id=c[0]) for c in FLAPPING]
)
def test_no_flapping_around_the_band(used, start, most):
    if used is None:
        rng = random.Random(3)
        used = [start * rng.uniform(0.45, 0.85) for _ in range(60)]
    p = policy()
    counts = [c["bulk"] for c in replay(p, TOPO, trace({"bulk": used}), {"bulk": start})]
    assert changes([start, *counts]) <= most, counts


def trace(layers: dict[str, list[float]], interval: float = 1.0) -> dict:
    return {"interval_s": interval, "source": "test", "layers": layers}


def test_after_a_change_a_shrink_waits_shrink_after_again():
    # 8 CPUs, 40% busy then 12.5%: shrink after 10 s to 5 CPUs (3.2 used at most, at 65%),
    # where it is 20% busy: the next shrink waits another 10 s, on its new history
    used = [3.2] + [1.0] * 30
    counts = [c["bulk"] for c in replay(policy(), TOPO, trace({"bulk": used}), {"bulk": 8})]
    assert counts[8:11] == [8, 5, 5] and counts[18:21] == [5, 2, 2], counts


def test_replay_wants_the_policys_interval():
    with pytest.raises(ValueError, match="interval"):
        replay(policy(), TOPO, trace({"bulk": [1.0]}, 2.0), {"bulk": 1})


def test_replay_grows_at_once_and_shrinks_after_shrink_after():
    used = [2.0] * 5 + [9.0] * 5 + [1.0] * 30
    counts = [c["bulk"] for c in replay(policy(), TOPO, trace({"bulk": used}), {"bulk": 3})]
    assert counts[4] == 3 and counts[5] > 3  # the first saturated interval grows it
    last_grow = max(i for i in range(1, 40) if counts[i] > counts[i - 1])
    first_shrink = min(i for i in range(1, 40) if counts[i] < counts[i - 1])
    # load fell at interval 10: ten intervals below low (10..19), shrink on the tenth
    assert last_grow < 10 and first_shrink == 19, counts
    assert counts[-1] == math.ceil(1.0 / 0.65)  # 1 CPU used, at the band's middle (65%)


# -- where the CPUs go -------------------------------------------------------------------------
def tasks_for(members: dict[str, int], online: frozenset[int]):
    out = []
    for i, (name, n) in enumerate(sorted(members.items())):
        proc = synth.process(1000 + 100 * i, name)  # the same tids every time
        out += [synth.thread(proc, tid=proc.pid + k, online=online) for k in range(n)]
    return out


def plan_with(topo, text, members, **kw):
    p = parse_policy(text, "t")
    classified = Classifier(p).classify_all(tasks_for(members, topo.online))
    return plan(topo, classified, p, **kw)


def cpus_of(pl) -> dict[str, frozenset[int]]:
    return {ly.name: ly.cpus for ly in pl.layers if ly.cpus}


CCX = synth.topology("1x32x2", llc_cores=4)  # 64 CPUs, 8 LLCs of 4 cores (8 CPUs)


def llc_set(topo, llc: int) -> frozenset[int]:
    return topo.llcs()[llc]


def test_sticky_keeps_its_cpus_across_a_grow_and_a_shrink():
    start = plan_with(CCX, PLACE, {"bulk": 1}, sizes={"bulk": 8}).layer("bulk").cpus
    assert start == llc_set(CCX, 28)  # the top LLC of the node, CPU 0's LLC last
    grown = plan_with(CCX, PLACE, {"bulk": 1}, sizes={"bulk": 12}, current={"bulk": start})
    grown_cpus = grown.layer("bulk").cpus
    assert start <= grown_cpus  # it kept every CPU it had
    assert grown_cpus - start == frozenset({26, 27, 58, 59})  # whole cores of the next LLC
    shrunk = plan_with(CCX, PLACE, {"bulk": 1}, sizes={"bulk": 6}, current={"bulk": grown_cpus})
    shrunk_cpus = shrunk.layer("bulk").cpus
    # the LLC where it had fewest went first: what is left is all in its own LLC
    assert shrunk_cpus == frozenset({29, 30, 31, 61, 62, 63})
    assert shrunk_cpus <= start


def test_sticky_grows_in_its_own_llc_first():
    mine = frozenset({24, 25, 56, 57})  # half of LLC 24; LLC 28 above it is free
    got = plan_with(CCX, PLACE, {"bulk": 1}, sizes={"bulk": 8}, current={"bulk": mine})
    assert got.layer("bulk").cpus == llc_set(CCX, 24)


@pytest.mark.parametrize("growth", ["sticky", "llc"])
def test_cpus_another_layer_has_now_come_last(growth):
    got = place(CCX, set(CCX.cpus), 4, growth=growth, avoid=frozenset({31, 63}))
    assert got == frozenset({29, 30, 61, 62})  # not core 31, though it is the top one


def test_sticky_starts_where_it_was_when_its_cpus_were_taken():
    # its old LLC 20 is now someone else's: it grows back around it, in its node
    p = plan_with(CCX, PLACE, {"bulk": 1}, sizes={"bulk": 4}, current={"bulk": llc_set(CCX, 20)})
    assert p.layer("bulk").cpus <= llc_set(CCX, 20)


def test_a_growing_layer_goes_around_another_sticky_layers_cpus():
    members = {"bulk": 1, "other": 1}
    first = cpus_of(plan_with(CCX, PLACE, members, sizes={"bulk": 8, "other": 8}))
    assert first["bulk"] == llc_set(CCX, 28) and first["other"] == llc_set(CCX, 24)
    after = cpus_of(plan_with(CCX, PLACE, members, sizes={"bulk": 16, "other": 8}, current=first))
    assert after["other"] == first["other"]  # untouched
    assert first["bulk"] <= after["bulk"] and not after["bulk"] & first["other"]
    assert after["bulk"] - first["bulk"] == llc_set(CCX, 20)  # the next LLC nobody holds


@pytest.mark.parametrize("shape", ["1x4x2", "2x8x2", "1x32x2"])
def test_latency_layers_get_whole_cores(shape):
    topo = synth.topology(shape)
    for want in (2, 6, 7, 100):
        cpus = plan_with(topo, PLACE, {"fast": 1}, sizes={"fast": want}).layer("fast").cpus
        assert cpus and all(topo.cpus[c].siblings <= cpus for c in cpus), (shape, want, cpus)
        assert len(cpus) <= want


def test_latency_layers_skip_a_core_shared_with_another_layer():
    topo = synth.topology("1x4x2")  # cores 0..3, siblings i and i + 4
    free = set(topo.cpus) - {7}  # core 3's sibling 7 is another layer's
    got = place(topo, free, 4, whole_cores=True)
    assert got == frozenset({1, 2, 5, 6})  # cores 2 and 1: not core 3, CPU 0's core last


@pytest.mark.parametrize("growth", ["sticky", "llc"])
def test_other_layers_take_whole_free_cores_before_a_shared_one(growth):
    topo = synth.topology("1x4x2")
    got = place(topo, set(topo.cpus) - {7}, 2, growth=growth)  # core 3 is half another's
    assert got == frozenset({2, 6})


def test_llc_order_takes_the_llc_with_most_free_cpus():
    # the static layer (4 threads) took cores 31 and 30: LLC 28 has 4 CPUs left, LLC 24 has 8
    cache = plan_with(CCX, PLACE, {"static": 4, "cache": 1}, sizes={"cache": 8}).layer("cache")
    assert cache.cpus == llc_set(CCX, 24)
    sticky = plan_with(CCX, PLACE, {"static": 4, "bulk": 1}, sizes={"bulk": 8}).layer("bulk")
    assert len({CCX.cpus[c].llc for c in sticky.cpus}) == 2  # sticky starts from the top


def test_llc_order_fills_whole_llcs_and_keeps_them():
    first = plan_with(CCX, PLACE, {"cache": 1}, sizes={"cache": 12}).layer("cache").cpus
    by_llc = sorted(len(first & cpus) for cpus in CCX.llcs().values() if first & cpus)
    assert by_llc == [4, 8]  # one whole LLC and part of the next
    grown = plan_with(
        CCX, PLACE, {"cache": 1}, sizes={"cache": 16}, current={"cache": first}
    ).layer("cache")
    assert first <= grown.cpus
    assert sorted(len(grown.cpus & c) for c in CCX.llcs().values() if grown.cpus & c) == [8, 8]
    shrunk = plan_with(
        CCX, PLACE, {"cache": 1}, sizes={"cache": 8}, current={"cache": grown.cpus}
    ).layer("cache")
    assert shrunk.cpus <= grown.cpus and len({CCX.cpus[c].llc for c in shrunk.cpus}) == 1


@pytest.mark.parametrize(
    ("count", "per_node"), [(8, [2, 2, 2, 2]), (10, [2, 2, 3, 3]), (4, [1] * 4)]
)
def test_node_order_spreads_evenly(count, per_node):
    topo = synth.topology("4x8x2")
    cpus = plan_with(topo, PLACE, {"wide": 1}, sizes={"wide": count}).layer("wide").cpus
    assert sorted(sum(1 for c in cpus if topo.cpus[c].node == n) for n in topo.nodes) == per_node


def test_node_order_latency_whole_cores_one_per_node_and_around_a_full_node():
    topo = synth.topology("4x8x2")
    got = place(topo, set(topo.cpus), 8, growth="node", whole_cores=True)
    assert sorted(topo.cpus[c].node for c in got) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(topo.cpus[c].siblings <= got for c in got)
    free = set(topo.cpus) - set(topo.nodes[3].cpus)  # node 3 is full
    got = place(topo, free, 12, growth="node")
    assert sorted(sum(1 for c in got if topo.cpus[c].node == n) for n in topo.nodes) == [0, 4, 4, 4]


def test_sticky_grows_to_the_nearest_node_when_its_node_is_full():
    topo = synth.topology("4x8x2")
    # node 2 is nearest to node 0 (synth makes every other node 21 away)
    nodes = dict(topo.nodes)
    nodes[0] = replace(nodes[0], distances=(10, 30, 12, 30))
    topo = replace(topo, nodes=nodes)
    mine = topo.nodes[0].cpus - {0, 32}  # all of node 0 but CPU 0's core
    got = place(topo, set(topo.cpus), 18, mine=mine)
    assert mine <= got
    assert {topo.cpus[c].node for c in got - mine} == {2}
    # without distances to tell, the node with the most free CPUs
    free = set(topo.cpus) - {63, 31}
    got = place(replace(topo, nodes=synth.topology("4x8x2").nodes), free, 18, mine=mine)
    assert {topo.cpus[c].node for c in got - mine} == {1}


def test_gpu_local_layers_keep_their_gpu_node_shares():
    topo = synth.topology("2x32x2", gpus=8)
    first = plan_with(topo, PLACE, {"gpu": 2}, sizes={"gpu": 16}).layer("gpu").cpus
    assert sorted(topo.cpus[c].node for c in first) == [0] * 8 + [1] * 8
    grown = (
        plan_with(topo, PLACE, {"gpu": 2}, sizes={"gpu": 24}, current={"gpu": first})
        .layer("gpu")
        .cpus
    )
    assert first <= grown and sorted(topo.cpus[c].node for c in grown) == [0] * 12 + [1] * 12


@pytest.mark.parametrize("topo", [CCX, synth.topology("2x8x2"), synth.topology("4x8x2")])
def test_the_pool_reserve_is_respected(topo):
    total = len(topo.cpus)
    members = {"bulk": 1, "cache": 1, "wide": 1, "fast": 1}
    sizes = dict.fromkeys(members, 1000)
    pl = plan_with(topo, PLACE, members, sizes=sizes)
    assert len(pl.pool) >= pool_reserve(total)
    assert sum(len(ly.cpus) for ly in pl.layers) == total - len(pl.pool)
    assert "wanted 1000 CPUs" in pl.layer("bulk").notes[0]
    assert 0 in pl.pool


@pytest.mark.parametrize("layer", ["bulk", "cache", "wide", "fast", "gpu"])
@pytest.mark.parametrize("shape", ["1x32x2/4", "2x8x2", "4x8x2", "1x6x1"])
def test_same_inputs_same_plan_and_a_plan_is_its_own_fixed_point(layer, shape):
    dims, _, llc = shape.partition("/")
    topo = synth.topology(dims, gpus=2, llc_cores=int(llc) if llc else None)
    members = {"static": 3, layer: 2, "other": 1}
    sizes = {layer: 6, "other": 2}
    first = plan_with(topo, PLACE, members, sizes=sizes)
    assert first == plan_with(topo, PLACE, members, sizes=sizes)
    now = cpus_of(first)
    again = plan_with(topo, PLACE, members, sizes=sizes, current=now)
    backwards = dict(reversed(list(now.items())))
    assert again == plan_with(topo, PLACE, members, sizes=sizes, current=backwards)
    assert cpus_of(again) == now  # nothing moves when nothing changed


def test_layers_without_util_ignore_sizes_and_current():
    topo = synth.topology("2x8x2")
    plain = plan_with(topo, PLACE, {"static": 5})
    moved = {"static": frozenset({0, 1, 2}), "bulk": frozenset({3})}
    assert plan_with(topo, PLACE, {"static": 5}, sizes={"static": 1}, current=moved) == plain
    # without sizes a self-sizing layer wants what a static one would: a CPU per thread
    assert len(plan_with(topo, PLACE, {"bulk": 2}).layer("bulk").cpus) == 2


# -- the one-minute training trace -------------------------------------------------------------
JOB_START = {"trainer": 8, "data": 4, "compile": 2}


def load_trace() -> dict:
    return json.loads(TRACE.read_text())


def test_the_trace_is_shaped_like_a_training_minute():
    t = load_trace()
    assert t["interval_s"] == 1.0 and "synthetic" in t["source"]
    layers = t["layers"]
    assert set(layers) == {"trainer", "data", "compile"}
    assert {len(v) for v in layers.values()} == {60}
    assert all(0.85 * 8 <= u <= 0.95 * 8 for u in layers["trainer"])
    assert min(layers["compile"][:10]) > 5 and max(layers["compile"][10:]) < 0.2
    assert min(layers["data"][30:36]) > 5 and max(layers["data"][:30] + layers["data"][36:]) < 2


def test_replay_of_the_training_trace():
    t = load_trace()
    p = parse_policy(JOB, "job.toml")
    window = shrink_window(p.sizing)
    got = replay(p, TOPO, t, JOB_START)
    series = {name: [JOB_START[name]] + [c[name] for c in got] for name in JOB_START}
    # series[name][i + 1]: the count decided after interval i
    data, compile_, trainer = series["data"], series["compile"], series["trainer"]
    used = t["layers"]
    spike = [i for i, u in enumerate(used["data"]) if u > 2 * min(used["data"])]
    first, last = spike[0], spike[-1]
    # the data layer grows within one interval of its spike...
    assert data[first + 1] > data[first], data
    # ... covers it before the spike ends, and shrinks back once shrink_after has passed
    assert data[last + 1] >= max(used["data"][first : last + 1]) / 0.8
    shrinks = [i for i in range(last + 1, len(data)) if data[i] < data[i - 1]]
    assert shrinks and last + window <= shrinks[0] - 1 <= last + window + 2, data
    assert data[-1] < data[last + 1]
    # the compile layer shrinks after its burst, not before shrink_after
    burst_end = max(i for i, u in enumerate(used["compile"]) if u > 1)
    first_shrink = min(i for i in range(1, len(compile_)) if compile_[i] < compile_[i - 1])
    assert first_shrink - 1 == burst_end + window, compile_
    assert compile_[-1] == 1 < max(compile_)
    # the trainer, steady at 85-95% of 8 CPUs, settles once and stays
    assert changes(trainer) <= 2, trainer
    assert all(c % 2 == 0 for c in trainer)  # whole cores


def test_replay_through_the_planner_keeps_cpus_sticky():
    """The trace's decisions, planned each interval from the CPUs of the interval before: a
    growing layer keeps every CPU it had, a shrinking one keeps only CPUs it had."""
    t = load_trace()
    p = parse_policy(JOB, "job.toml")
    counts = replay(p, TOPO, t, JOB_START)
    members = {"trainer": 8, "pt_data": 4, "cc1": 4}
    tasks = []
    for i, (comm, n) in enumerate(members.items()):
        tasks += synth.threads(synth.process(2000 + 10 * i, comm), n, online=TOPO.online)
    classified = Classifier(p).classify_all(tasks)
    now = cpus_of(plan(TOPO, classified, p, sizes=JOB_START))
    moves = dict.fromkeys(JOB_START, 0)
    for sizes in counts:
        nxt = cpus_of(plan(TOPO, classified, p, sizes=sizes, current=now))
        for name in JOB_START:
            old, new = now.get(name, frozenset()), nxt.get(name, frozenset())
            assert len(new) == sizes[name]
            if new != old:
                moves[name] += 1
                assert old <= new or new <= old, (name, sorted(old), sorted(new))
        now = nxt
    assert moves == {n: changes([JOB_START[n]] + [c[n] for c in counts]) for n in JOB_START}


# -- a recorded trace: the trainer benchmark's job with torch.compile and a data spike ---------
RECORDED = REPO / "tests" / "fixtures" / "traces" / "trainer-compile-spike.json"
SMALL = """version = 1
[sizing]
interval = 1.0
shrink_after = {after}
[[layer]]
name = "trainer"
comment = "the ranks"
match = [[{{ job_role = "rank" }}]]
kind = "grouped"
cpus = {{ min = 1, max = 2 }}
util = {{ low = 0.5, high = 0.8 }}
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""


def test_replay_of_a_recorded_trace_does_not_flap():
    """Recorded on a 2-CPU host: the ranks busy on 2 CPUs, then compiling (torch.compile) with
    pauses of up to 4 s, then steady. The trainer grows at once and, with shrink_after = 10 s,
    rides out the pauses; with 3 s it shrinks in each pause and grows back (it flaps)."""
    t = json.loads(RECORDED.read_text())
    assert t["interval_s"] == 1.0 and "recorded" in t["source"]
    trainer = t["layers"]["trainer"]
    assert max(trainer) > 1.5 and sum(1 for u in trainer if u < 0.1) >= 5  # busy, with pauses
    topo = synth.topology("1x2x1")
    trace = {"interval_s": 1.0, "layers": {"trainer": trainer}}
    steady = [c["trainer"] for c in replay(parse_policy(SMALL.format(after=10).encode(), "p"),
                                           topo, trace, {"trainer": 1})]  # fmt: skip
    first_busy = next(i for i, u in enumerate(trainer) if u > 0.8)
    assert steady[first_busy] == 2  # grown within the interval it saturated
    assert changes([1, *steady]) == 1, steady  # and never shrunk in a pause
    jumpy = [c["trainer"] for c in replay(parse_policy(SMALL.format(after=3).encode(), "p"),
                                          topo, trace, {"trainer": 1})]  # fmt: skip
    assert changes([1, *jumpy]) >= 3, jumpy  # the hysteresis is what keeps it still

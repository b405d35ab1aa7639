"""Self-sizing layers in the agent, without root: the dgx-h100 fixture with a fake kernel, a
policy whose data layer sizes itself, and /proc/stat written by the test. A layer that stays
idle for ``shrink_after`` shrinks, keeping CPUs it had; a saturated one grows at the next tick,
keeping its CPUs (sticky); the status document and the log say why."""

from __future__ import annotations

import pytest

import hostd.agent.sizer
from hostd.agent import Agent
from hostd.host import Host
from hostd.reconcile import PassReport
from tests.fakes import FakeCalls, host_copy

POLICY = """version = 1
[sizing]
interval = 1
shrink_after = 3
[[layer]]
name = "data"
comment = "the data loaders, sized to 50-80 % busy"
match = [[{ job_role = "data" }]]
kind = "confined"
cpus = { min = 2, max = 16 }
util = { low = 0.5, high = 0.8 }
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""


class Stat:
    """/proc/stat of the fixture tree, advanced by the test: each CPU busy a given share."""

    def __init__(self, tree, cpus: int) -> None:
        self.path = tree / "proc" / "stat"
        self.ticks = {c: [0, 0] for c in range(cpus)}  # busy, idle

    def advance(self, busy: dict[int, float], ticks: int = 100) -> None:
        for cpu, t in self.ticks.items():
            share = busy.get(cpu, 0.0)
            t[0] += round(ticks * share)
            t[1] += ticks - round(ticks * share)
        total = [sum(t[0] for t in self.ticks.values()), sum(t[1] for t in self.ticks.values())]
        lines = [f"cpu  {total[0]} 0 0 {total[1]} 0 0 0 0 0 0"]
        lines += [f"cpu{c} {b} 0 0 {i} 0 0 0 0 0 0" for c, (b, i) in self.ticks.items()]
        self.path.write_text("\n".join(lines) + "\nintr 0\nctxt 0\n")


@pytest.fixture
def sized(tmp_path):
    tree = host_copy(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), str(policy), state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", allow_insecure_policy=True)  # fmt: skip
    agent.caps.sched = agent.caps.affinity = True  # the fake has threads to call
    yield agent, Stat(tree, 64)
    agent.journal.close()
    agent.status.close()


def relayer(agent: Agent) -> PassReport:
    """Re-layer as the agent's loop does, then check that a full pass plans the same CPUs and
    writes nothing more: the re-layer left every thread as the full pass wants it."""
    now = agent.relayer("resize")
    inc = agent.inc
    while inc.redo_left:
        agent.redo(64)
    layers = {lp.name: lp.cpus for lp in agent.plan.layers}
    report = agent.pass_once("check")
    assert {lp.name: lp.cpus for lp in agent.plan.layers} == layers
    assert report.counts.get("applied", 0) == 0, report.counts
    return now


def data_cpus(agent: Agent) -> frozenset[int]:
    return next(lp.cpus for lp in agent.plan.layers if lp.name == "data")


@pytest.fixture
def hostd_log(monkeypatch):
    """The lines the sizer logs (its logger's, whatever other tests did to logging)."""
    lines: list[str] = []

    class Log:
        def info(self, msg: str, *args: object) -> None:
            lines.append(msg % args)

    monkeypatch.setattr(hostd.agent.sizer, "log", Log())
    return lines


def test_an_idle_layer_shrinks_later_and_a_saturated_one_grows_at_once(sized, hostd_log):
    agent, stat = sized
    agent.pass_once()
    first = data_cpus(agent)
    assert len(first) == 12  # before any measurement: one CPU per thread, as a static layer
    assert agent.sizer.wanted
    stat.advance({})
    agent.sizer.tick()  # the baseline: no interval measured yet
    # idle: no shrink before shrink_after (3 intervals), then one, to its min
    for _ in range(2):
        stat.advance({})
        assert not agent.sizer.tick()
        assert not agent.sizer.resizes
    stat.advance({})
    assert agent.sizer.tick()  # the agent re-layers now
    (shrink,) = agent.sizer.resizes
    assert (shrink["layer"], shrink["from"], shrink["to"]) == ("data", 12, 2)
    assert shrink["why"].startswith("shrink")
    assert any(line.startswith("resize layer=data cpus=12->2 why=") for line in hostd_log)
    assert relayer(agent).counts["applied"] >= 12  # the layer's threads, at once
    small = data_cpus(agent)
    assert len(small) == 2 and small <= first  # sticky: it kept two of its CPUs
    # saturated over one interval: it grows at the next tick, keeping its CPUs
    stat.advance(dict.fromkeys(small, 1.0))
    assert agent.sizer.tick()
    grow = agent.sizer.resizes[-1]
    assert (grow["from"], grow["why"][:4]) == (2, "grow") and grow["to"] > 2
    relayer(agent)
    grown = data_cpus(agent)
    assert len(grown) == grow["to"] and small <= grown
    agent.write_status(PassReport(), None, "running")
    doc = agent.status.last["sizing"]
    assert doc["resizes_total"] == {"data": 2}
    assert doc["layers"]["data"]["cpus"] == grow["to"]


def test_a_layer_in_its_band_keeps_its_cpus(sized):
    agent, stat = sized
    agent.pass_once()
    first = data_cpus(agent)
    stat.advance({})
    for _ in range(10):
        stat.advance(dict.fromkeys(first, 0.65))
        agent.sizer.tick()
    assert not agent.sizer.resizes
    assert agent.sizer.last["data"].why.startswith("keep")


def test_no_self_sizing_layer_reads_nothing(tmp_path):
    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
        assert not agent.sizer.wanted
        assert agent.status.last["sizing"] is None
    finally:
        agent.journal.close()
        agent.status.close()


def test_a_layer_the_pool_cannot_feed_is_not_asked_for_again(tmp_path):
    """All CPUs kept for the pool: the layer's start size is decided once, the re-plan gives it
    nothing, and the next ticks keep that decision instead of re-planning every interval."""
    tree = host_copy(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("[sizing]", "pool_min = 64\n[sizing]"))
    stat = Stat(tree, 64)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), str(policy), state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", allow_insecure_policy=True)  # fmt: skip
    agent.caps.sched = agent.caps.affinity = True
    try:
        agent.pass_once()
        assert data_cpus(agent) == frozenset()
        for _ in range(5):
            stat.advance({})
            if agent.sizer.tick():
                relayer(agent)
        assert [r["to"] for r in agent.sizer.resizes] == [2]  # its start, once
        assert data_cpus(agent) == frozenset()
    finally:
        agent.journal.close()
        agent.status.close()


def test_status_and_top_say_each_resize_and_the_attempts():
    import time

    from hostd.cli.status import attempt_lines, sizing_lines

    sizing = {
        "layers": {"data": {"cpus": 4, "why": "grow: 95% busy over 1 s, above 80%", "util": []}},
        "resizes": [
            {"time": time.time() - 7, "layer": "data", "from": 2, "to": 4,
             "why": "grow: 95% busy over 1 s, above 80%"},
        ],
        "resizes_total": {"data": 1},
        "tick_seconds": 0.0001,
    }  # fmt: skip
    lines = sizing_lines(sizing)
    assert lines[0] == "self-sizing data: 4 CPUs (grow: 95% busy over 1 s, above 80%)"
    assert lines[1].startswith("  7s ago data 2 -> 4 CPUs: grow")
    assert sizing_lines(None) == []
    attempts = {
        "live": [{"job": "llama", "attempt": "slurm 7 restart 0", "protected": False,
                  "throughput": 12.5, "throughput_unit": "steps/s"}],
        "other": {"attempts": 3},
    }  # fmt: skip
    assert attempt_lines(attempts) == [
        "recording job llama attempt slurm 7 restart 0 (not protected, 12.5 steps/s)",
        "recording 3 more attempts",
    ]

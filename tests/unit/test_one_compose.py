"""``hostd plan`` shows what ``hostd run`` does: both build a pass's plan with ``plan()`` from
the same inputs (real-time allowed or not, as the doctor's probe says). Checked on the fixture
hosts: the plan of an agent's full pass (observe mode: nothing is written) equals ``hostd
plan``'s, JSON for JSON, with real-time allowed and refused (where refused, neither shows a
real-time thread). The agent keeps its plan without the per-thread decisions once applied
(its planner decides from then on): the plan its pass made is caught as ``plan()`` returns it."""

from __future__ import annotations

from pathlib import Path

import pytest

import hostd.agent.core
from hostd.agent import Agent
from hostd.host import Host
from hostd.journal import base_affinities
from hostd.plan import Plan
from hostd.policy import load_policy
from hostd.snapshot import take
from tests.fakes import FakeCalls, host_copy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
HOSTS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
RT_POLICY = Path(__file__).resolve().parents[2] / "policies" / "inference.toml"


@pytest.fixture
def made(monkeypatch) -> list[Plan]:
    """The plans the agent's full passes make, as ``plan()`` returns them."""
    plans: list[Plan] = []
    real = hostd.agent.core.plan

    def plan(*args: object, **kwargs: object) -> Plan:
        plans.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return plans[-1]

    monkeypatch.setattr(hostd.agent.core, "plan", plan)
    return plans


@pytest.mark.parametrize("allow_rt", [True, False], ids=["rt-allowed", "rt-refused"])
@pytest.mark.parametrize("policy", [None, str(RT_POLICY)], ids=["default", "inference"])
@pytest.mark.parametrize("name", HOSTS)
def test_the_agents_pass_plans_what_hostd_plan_shows(tmp_path, made, name, policy, allow_rt):
    host = Host(FIXTURES / name)
    agent = Agent(
        host, policy, state_dir=tmp_path / "state", run_dir=tmp_path / "run", mode="observe"
    )
    agent.caps.rt = allow_rt
    agent.pass_once()
    assert agent.plan is not None and len(made) == 1
    shown = take(host, agent.policy, allow_rt=allow_rt).plan()
    assert shown.to_json() == made[0].to_json()
    assert agent.plan.to_json() == {**shown.to_json(), "tasks": []}  # kept without them
    rt_layers = {ly.name for ly in agent.policy.layers if ly.sched.policy in ("fifo", "rr")}
    members = [t for t in shown.tasks if t.layer in rt_layers and t.policy is not None]
    assert all((t.policy in ("fifo", "rr")) == allow_rt for t in members)
    assert allow_rt or not [t for t in shown.tasks if t.policy in ("fifo", "rr")]


def test_a_fixture_host_has_threads_in_the_inference_policys_real_time_layer():
    """So that the test above sees real-time decisions, not only their absence."""
    policy = load_policy(RT_POLICY)
    rt_layers = {ly.name for ly in policy.layers if ly.sched.policy in ("fifo", "rr")}
    plan = take(Host(FIXTURES / "dgx-h100"), policy, allow_rt=True).plan()
    assert [t for t in plan.tasks if t.layer in rt_layers and t.policy == "fifo"]


def test_after_the_agent_placed_threads_hostd_plan_still_shows_what_it_does(tmp_path, made):
    """An enforcing agent changes affinities; its next pass plans each thread from the original
    the journal holds. ``hostd plan`` given the same journal plans the same; without it, from the
    affinities hostd wrote, it would not."""
    tree = host_copy(tmp_path)
    host = Host(tree, calls=FakeCalls(tree))
    agent = Agent(host, None, state_dir=tmp_path / "state", run_dir=tmp_path / "run")
    agent.caps.sched = agent.caps.affinity = True
    agent.pass_once()
    base = base_affinities(agent.journal)
    assert base, "the agent placed no thread: nothing to compare"
    agent.pass_once("drift")
    assert agent.plan is not None and len(made) == 2
    shown = take(host, agent.policy, allow_rt=agent.caps.rt)
    shown.base_affinity = base
    assert shown.plan().to_json() == made[1].to_json()
    shown.base_affinity = {}
    assert shown.plan().to_json() != made[1].to_json()
    agent.journal.close()


def test_hostd_plan_reads_the_journal_it_is_given(tmp_path):
    from hostd.cli.plan import journal_base
    from hostd.journal import Journal, read_boot_id

    host = Host()
    assert journal_base(host, str(tmp_path)) == {}  # no journal: nothing to read
    journal = Journal(tmp_path, read_boot_id(host))
    journal.record([("task/1@1/affinity", "0-1"), ("task/1@1/nice", 0)])
    journal.close()
    assert journal_base(host, str(tmp_path)) == {(1, 1): frozenset({0, 1})}


def test_hostd_plan_reads_a_running_agents_watch(tmp_path):
    """The sessions a running agent demoted, and its runaways, from its status file; nothing
    when no agent holds the pid file."""
    import fcntl
    import json
    import os

    from hostd.cli.plan import watch_state

    status = {
        "preempt": {
            "demoted": [{"session": 4350, "seconds": 2.0}, ["session"], {"session": None}],
            # Malformed entries (a hand-edited file under --run-dir) are left out, not a crash.
            "runaways": [
                {"tid": 77, "start": 1234, "comm": "spin"},
                {"tid": 78},
                "x",
                {"tid": "9", "start": 1},
            ],
        }
    }
    (tmp_path / "status.json").write_text(json.dumps(status))
    assert watch_state(str(tmp_path)) == (frozenset(), frozenset())  # no agent runs
    fd = os.open(tmp_path / "agent.pid", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        assert watch_state(str(tmp_path)) == (frozenset({4350}), frozenset({(77, 1234)}))
    finally:
        os.close(fd)


def test_a_snapshot_plans_demoted_sessions_as_the_agent_does():
    host = Host(FIXTURES / "dgx-h100")
    snap = take(
        host, load_policy(Path(__file__).resolve().parents[2] / "policies" / "training.toml")
    )
    sid = host.processes()[5000].session  # stress-ng's session: preemptible work
    before = {t.tid: t.policy for t in snap.plan().tasks}
    snap.demoted_sessions = frozenset({sid})
    after = {t.tid: t.policy for t in snap.plan().tasks}
    assert after[5000] == "idle" and before.get(5000) != "idle"

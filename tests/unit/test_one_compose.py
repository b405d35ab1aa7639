"""``hostd plan`` shows what ``hostd run`` does: both build a pass's plan with ``plan()`` from
the same inputs (real-time allowed or not, as the doctor's probe says). Checked on the fixture
hosts: the plan of an agent's full pass (observe mode: nothing is written) equals ``hostd
plan``'s, JSON for JSON, with real-time allowed and refused (where refused, neither shows a
real-time thread)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostd.agent import Agent
from hostd.host import Host
from hostd.policy import load_policy
from hostd.snapshot import take

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
HOSTS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
RT_POLICY = Path(__file__).resolve().parents[2] / "policies" / "inference.toml"


@pytest.mark.parametrize("allow_rt", [True, False], ids=["rt-allowed", "rt-refused"])
@pytest.mark.parametrize("policy", [None, str(RT_POLICY)], ids=["default", "inference"])
@pytest.mark.parametrize("name", HOSTS)
def test_the_agents_pass_plans_what_hostd_plan_shows(tmp_path, name, policy, allow_rt):
    host = Host(FIXTURES / name)
    agent = Agent(
        host, policy, state_dir=tmp_path / "state", run_dir=tmp_path / "run", mode="observe"
    )
    agent.caps.rt = allow_rt
    agent.pass_once()
    assert agent.plan is not None
    shown = take(host, agent.policy, allow_rt=allow_rt).plan()
    assert shown.to_json() == agent.plan.to_json()
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

"""CPU hotplug under cgroup v2 cpusets: what the kernel does, recorded as assertions.

Measured here (Debian's 6.1 kernel, the VM of tests/vm): on v2, offlining a CPU shrinks the
``cpuset.cpus.effective`` of every cgroup holding it (and the affinity of their processes),
while ``cpuset.cpus`` keeps what was written; onlining it gives both back, with no help. When
every CPU of a member cgroup goes offline its processes fall back to the parent's effective
CPUs, and come back when one returns. A partition root stays a partition root through it. This
differs from v1 (FACTS.md: offlining empties a v1 cpuset, moves its tasks to the parent, and
onlining restores nothing), which is why hostd re-applies after a CPU comes back.

The CPUs are node 1's, read from the live kernel (conftest's ``NODE1``; ``ONLINE``: every CPU
online when the session started): the highest of them goes offline, or all of them, and what
the kernel should show is computed from those sets, so the tests hold for any VM shape.

The agent's own part (``hostd.agent``, device events): with the rank's CPU offline it plans the
host again on the CPUs left, and once the CPU is back the rank has its planned CPU, cpuset and
affinity again; SIGTERM then restores everything.
"""

from __future__ import annotations

import functools
import os

import pytest

from hostd.cpuset.cgroup import write_v2_cpuset
from hostd.model.cpus import parse_cpulist
from tests import agentproc
from tests.agentproc import Agent
from tests.vm.inside.conftest import NODE1, ONLINE, cpus_allowed, read
from tests.vm.inside.test_agent import POLICY, cgroup_of, job_state
from tests.workload import TrainingJob

# Under software emulation a full pass takes seconds: a failure is reported after 2 minutes.
wait_for = functools.partial(agentproc.wait_for, timeout=120)

GROUP = "hostd-vmtest-hotplug"
ALL = ONLINE
REST = ALL - NODE1  # every online CPU not on node 1


def hold_node1(host, v2, pid: int, partition: str) -> None:
    """Make GROUP a v2 child with cpuset.cpus = node 1's CPUs (a member or a partition root)
    holding pid."""
    v2.create(GROUP)
    write_v2_cpuset(host, GROUP, NODE1, frozenset({1}), None if partition == "member" else "root")
    v2.move(pid, GROUP)
    assert v2.read(GROUP, "cpuset.cpus.partition") == partition
    assert cpus_allowed(pid) == NODE1


@pytest.fixture
def node1_group(host, v2, sleeper) -> int:
    """A member v2 child holding node 1's CPUs with a sleeping process in it; its pid."""
    hold_node1(host, v2, sleeper.pid, "member")
    return sleeper.pid


def effective(v2, group: str) -> frozenset[int]:
    return parse_cpulist(v2.read(group, "cpuset.cpus.effective") or "")


@pytest.mark.parametrize("kind", ["member", "root"])
def test_offline_shrinks_the_effective_cpus_and_online_gives_them_back(
    host, v2, hotplug, sleeper, kind
):
    pid = sleeper.pid
    hold_node1(host, v2, pid, kind)
    victim = max(NODE1)  # one of node 1's CPUs goes offline, the others stay
    left = NODE1 - {victim}
    assert left, f"node 1 has one CPU ({victim}): nothing would be left in the group"
    hotplug.set(victim, False)
    assert hotplug.online() == ALL - {victim}
    assert parse_cpulist(v2.read(GROUP, "cpuset.cpus")) == NODE1  # what was written stays
    assert effective(v2, GROUP) == left
    assert v2.read(GROUP, "cpuset.cpus.partition") == kind
    assert cpus_allowed(pid) == left
    assert str(pid) in v2.read(GROUP, "cgroup.procs").split()  # not moved out (v1 would)
    # A member shares the root's CPUs, so the root only loses the offline one; a partition's
    # CPUs are not the root's, and its offline CPU does not come back to the root either.
    assert effective(v2, "") == (ALL - {victim} if kind == "member" else REST)

    hotplug.set(victim, True)
    assert hotplug.online() == ALL
    assert effective(v2, GROUP) == NODE1
    assert cpus_allowed(pid) == NODE1
    assert v2.read(GROUP, "cpuset.cpus.partition") == kind
    assert effective(v2, "") == (ALL if kind == "member" else REST)


def test_member_with_every_cpu_offline_falls_back_to_the_parent(v2, hotplug, node1_group):
    pid = node1_group
    for cpu in sorted(NODE1, reverse=True):  # every CPU of node 1 offline
        hotplug.set(cpu, False)
    assert hotplug.online() == REST
    assert parse_cpulist(v2.read(GROUP, "cpuset.cpus")) == NODE1
    assert effective(v2, "") == REST
    assert effective(v2, GROUP) == REST  # the parent's effective CPUs
    assert cpus_allowed(pid) == REST
    assert str(pid) in v2.read(GROUP, "cgroup.procs").split()

    first, *others = sorted(NODE1)
    hotplug.set(first, True)  # one CPU back is enough for the group to use its own again
    assert effective(v2, GROUP) == {first}
    assert cpus_allowed(pid) == {first}
    for cpu in others:
        hotplug.set(cpu, True)
    assert effective(v2, GROUP) == NODE1
    assert cpus_allowed(pid) == NODE1


def test_agent_reapplies_after_the_ranks_cpu_comes_back(tmp_path, hotplug):
    trainer = "/sys/fs/cgroup/hostd.trainer"
    with TrainingJob(ranks=1, workers=1) as job:
        before = job_state(job)
        agent = Agent(tmp_path, job.launcher, policy=POLICY)
        try:
            rank = job.ranks[0]
            agent.wait_passes(1, timeout=300)  # an interpreter starts slowly under emulation
            wait_for(lambda: cgroup_of(rank) == "/hostd.trainer", "rank placed", agent)
            (own,) = os.sched_getaffinity(rank)
            assert read(f"{trainer}/cpuset.cpus") == str(own)
            devices = agent.wait_passes(1)["events"].get("device_events", 0)

            hotplug.set(own, False)
            wait_for(
                lambda: agent.status()["events"].get("device_events", 0) > devices,
                "the offline event",
                agent,
            )
            # Planned again on the CPUs left: the rank has another CPU of its own meanwhile.
            wait_for(
                lambda: len(os.sched_getaffinity(rank)) == 1 and own not in cpus_allowed(rank),
                "the rank on another CPU",
                agent,
            )
            hotplug.set(own, True)
            wait_for(lambda: os.sched_getaffinity(rank) == {own}, "the rank's CPU again", agent)
            wait_for(
                lambda: (
                    read(f"{trainer}/cpuset.cpus") == str(own)
                    and read(f"{trainer}/cpuset.cpus.effective") == str(own)
                ),
                "the trainer cpuset again",
                agent,
            )
            assert cgroup_of(rank) == "/hostd.trainer"
        finally:
            log = agent.stop()
        assert "Traceback" not in log, log
        assert job_state(job) == before, log

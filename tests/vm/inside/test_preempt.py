"""Preemptible work on a cgroup-v2 kernel: a busy session in a cgroup of its own is demoted
while the job runs, and everything is back after ``kill -9`` of the agent and ``hostd restore``.

The same sandbox as tests/privileged/test_preempt.py (an idle protected "job" process and a
busy session), with the busy session in a v2 cgroup of its own, as another tenant's container
or a systemd scope would be: hostd demotes its threads (SCHED_IDLE) and its session's autogroup
in place, and never moves it out of that cgroup; as the cgroup holds nothing else, it gets
``cpu.idle = 1`` too (the cpu controller enabled for it by the test), since CFS shares the CPUs
between cgroups before it looks at a thread's policy. Threads born in it while no agent runs are
put back by the session record, the cgroup's ``cpu.idle`` by its own.

A busy session in the root cgroup (where the VM's processes live, as in a container without
systemd) moves into hostd's own ``/hostd.demoted`` (``cpu.idle = 1``) instead, and back to the
root, with what was born in it, after ``kill -9`` and ``hostd restore``.
"""

from __future__ import annotations

import functools
import signal
from pathlib import Path

from tests import agentproc
from tests.agentproc import Agent
from tests.privileged.test_preempt import (
    POLICY,
    Sandbox,
    _back_as_before,
    _born_demoted,
    _demoted,
)
from tests.vm.inside.conftest import hostd_here

wait_for = functools.partial(agentproc.wait_for, timeout=180)


def cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return ""


def test_a_busy_session_in_a_cgroup_of_its_own_is_demoted_and_restored_after_kill_9(
    tmp_path, v2, kernel_state
):
    cpu_on = "cpu" in (v2.read("", "cgroup.subtree_control") or "").split()
    if not cpu_on:
        v2.write("", "cgroup.subtree_control", "+cpu")
    group = v2.create("hostd-vmtest-tenant")
    try:
        _demote_in_own_cgroup(tmp_path, v2, group)
    finally:
        v2.empty(group)
        if not cpu_on:
            v2.write("", "cgroup.subtree_control", "-cpu")


def _idle(v2, group: str) -> str:
    return (v2.read(group, "cpu.idle") or "").strip()


def _demote_in_own_cgroup(tmp_path, v2, group: str) -> None:
    with Sandbox(tmp_path, ["job", "busy"], cpu=3) as box:
        busy = [box.pids["busy"], *box.kids("busy")]
        for pid in busy:
            v2.move(pid, group)
        before = box.threads()
        assert _idle(v2, group) == "0"
        agent = Agent(tmp_path, box.root, policy=POLICY)
        try:
            agent.wait_passes(1, timeout=300)
            wait_for(lambda: _demoted(box), "the busy session demoted", agent)
            assert {cgroup_of(pid) for pid in busy} == {f"/{group}"}  # it stays in its cgroup
            wait_for(lambda: _idle(v2, group) == "1", "the cgroup's cpu.idle", agent)
            born = box.more()  # inherited, or decided from the fork event: _born_demoted
            wait_for(lambda: _born_demoted(born), "the session's new threads SCHED_IDLE", agent)
        finally:
            log = agent.stop(signal.SIGKILL)
        assert "Traceback" not in log, log
        born += box.more()  # born while no agent runs
        hostd_here("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        _back_as_before(box, before, born)
        assert _idle(v2, group) == "0"


def test_a_busy_session_of_the_root_cgroup_moves_to_hostds_cgroup_and_back_after_kill_9(
    tmp_path, v2, kernel_state
):
    cpu_on = "cpu" in (v2.read("", "cgroup.subtree_control") or "").split()
    if not cpu_on:
        v2.write("", "cgroup.subtree_control", "+cpu")
    try:
        _demote_at_root(tmp_path, v2)
    finally:
        if v2.read("hostd.demoted", "cgroup.procs") is not None:  # only if the test failed
            v2.empty("hostd.demoted")
            v2.host.rmdir("sys/fs/cgroup/hostd.demoted")
        if not cpu_on:
            v2.write("", "cgroup.subtree_control", "-cpu")


def _demote_at_root(tmp_path, v2) -> None:
    with Sandbox(tmp_path, ["job", "busy"], cpu=3) as box:
        busy = [box.pids["busy"], *box.kids("busy")]
        assert {cgroup_of(pid) for pid in busy} == {"/"}
        before = box.threads()
        agent = Agent(tmp_path, box.root, policy=POLICY)
        try:
            agent.wait_passes(1, timeout=300)
            wait_for(
                lambda: _demoted(box) and {cgroup_of(p) for p in busy} == {"/hostd.demoted"},
                "the busy session demoted into hostd's cgroup",
                agent,
            )
            assert _idle(v2, "hostd.demoted") == "1"
            assert cgroup_of(box.pids["job"]) == "/"  # the job stays where it is
            born = box.more()
            assert {cgroup_of(t) for t in born} == {"/hostd.demoted"}
        finally:
            log = agent.stop(signal.SIGKILL)
        assert "Traceback" not in log, log
        born += box.more()  # born in hostd's cgroup while no agent runs
        hostd_here("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        _back_as_before(box, before, born)
        assert {cgroup_of(t) for t in busy + born} == {"/"}
        assert not Path("/sys/fs/cgroup/hostd.demoted").exists()

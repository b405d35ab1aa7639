"""cgroup v2: a layer's member from a home cgroup that has no cpuset of that layer yet gets one by
an event, not at the next full pass.

On v2 a layer's cpuset is a threaded child ``G/hostd.<layer>`` of each home cgroup G of its
members (a thread may only move within its process's cgroup). The job's first process lives in
cgroup A with a member thread; the full pass makes ``A/hostd.hot``. Then a second process of the
job starts in cgroup B (as a Slurm step or a container's exec would) with a member thread: the
event pass re-layers (``relayer reason=home``, no full pass), makes ``B/hostd.hot`` and the thread
joins it. SIGTERM restores: the threads are back in their home cgroups, on every CPU, and
``kernel_state`` (conftest) checks the cgroup tree.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap

from hostd.model.cpus import parse_cpulist
from tests import agentproc
from tests.agentproc import Agent
from tests.vm.inside.conftest import read
from tests.vm.inside.test_agent import cgroup_of

# Under software emulation a full pass takes seconds: a failure is reported after 2 minutes.
wait_for = functools.partial(agentproc.wait_for, timeout=120)

POLICY = """version = 1
name = "vm-new-home"
pool_min = 1
[agent]
rescan_interval = 3600  # no drift pass during the test: only events may place the member
[cgroups]
write = ["other"]  # the test's own cgroups hostd-vmtest-a and -b
[[layer]]
name = "hot"
comment = "the test's member threads: one CPU of their own"
match = [[{ comm_prefix = "homehot" }, { uid = 0 }]]
kind = "confined"
cpus = { min = 1, max = 1 }
[[layer]]
name = "rest"
comment = "everything else: left alone"
match = [[]]
"""

# Each process starts one member thread and prints its tid; the first, on a line from stdin
# naming a cgroup.procs file, starts a second process that moves itself there before exec.
MEMBER = textwrap.dedent(
    """
    import os, sys, threading, time
    def member():
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
            fh.write("homehot")
        print(threading.get_native_id(), flush=True)
        time.sleep(3600)
    threading.Thread(target=member, daemon=True).start()
    """
)
FIRST = MEMBER + textwrap.dedent(
    """
    import subprocess
    procs = sys.stdin.readline().strip()
    def move():
        with open(procs, "w") as fh:
            fh.write("0")
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1] + "time.sleep(3600)"],
                             preexec_fn=move)
    child.wait()
    """
)


def move_self(group: str) -> None:
    with open(f"/sys/fs/cgroup/{group}/cgroup.procs", "w") as fh:
        fh.write("0")


def test_a_member_from_a_new_home_cgroup_gets_its_cpuset_by_an_event(tmp_path, v2):
    a, b = v2.create("hostd-vmtest-a"), v2.create("hostd-vmtest-b")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    job = subprocess.Popen(
        [sys.executable, "-c", FIRST, MEMBER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=functools.partial(move_self, a),
    )  # fmt: skip
    try:
        first = int(job.stdout.readline())
        before = os.sched_getaffinity(first)
        assert cgroup_of(first) == f"/{a}"
        agent = Agent(tmp_path, job.pid, policy=policy)
        try:
            agent.wait_passes(1, timeout=300)  # an interpreter starts slowly under emulation
            wait_for(lambda: cgroup_of(first) == f"/{a}/hostd.hot", "the first member", agent)
            own = os.sched_getaffinity(first)
            assert len(own) == 1 and own < before
            passes = agent.status()["passes"]
            job.stdin.write(f"/sys/fs/cgroup/{b}/cgroup.procs\n")
            job.stdin.flush()
            second = int(job.stdout.readline())
            assert cgroup_of(second) in (f"/{b}", f"/{b}/hostd.hot")
            wait_for(lambda: cgroup_of(second) == f"/{b}/hostd.hot", "the second member", agent)
            wait_for(lambda: os.sched_getaffinity(second) == own, "its affinity", agent)
            assert agent.status()["passes"] == passes, "a full pass did it, not an event"
            effective = read(f"/sys/fs/cgroup/{b}/hostd.hot/cpuset.cpus.effective")
            assert parse_cpulist(effective or "") == own
        finally:
            log = agent.stop(signal.SIGTERM)
        assert "Traceback" not in log, log
        assert log.count(" pass n=") == 1, log  # the start's; the status may lag a pass
        assert "relayer reason=home layer=hot home=/hostd-vmtest-b" in log, log
        for tid, home in ((first, f"/{a}"), (second, f"/{b}")):
            assert cgroup_of(tid) == home, (tid, cgroup_of(tid))
            assert os.sched_getaffinity(tid) == before
        assert not os.path.exists(f"/sys/fs/cgroup/{b}/hostd.hot")
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the second process too
        job.wait()

"""A layer's first member, on the real kernel (root): the agent gives the layer its CPU at once,
with no full pass, then narrows the pool's threads to what is left; when the layer is empty
again for ``[sizing] shrink_after``, it gives the CPU back to the pool, again without a full
pass; a full pass in between changes nothing; the stop puts every thread and cpuset back as it
was.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agentproc import Agent, wait_for
from tests.privileged.test_agent import HOSTD, needs_v1_cpuset

POLICY = """version = 1
name = "relayer-test"
pool_min = 1

[agent]
mode = "enforce"

[sizing]
shrink_after = 1

[[layer]]
name = "hot"
comment = "threads named hostd_hot*: one CPU of their own, batch, nice -3"
match = [[{ comm_prefix = "hostd_hot" }]]
kind = "confined"
cpus = { min = 1, max = 1 }
sched = { policy = "batch", nice = -3 }

[[layer]]
name = "rest"
comment = "the rest: the shared pool"
match = [[]]
kind = "open"
"""

# A process with two idle threads; its main thread renames the second on command.
_JOB = r"""
import sys, threading, time
def idle():
    time.sleep(3600)
threads = [threading.Thread(target=idle, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
print(" ".join(str(t.native_id) for t in threads), flush=True)
for line in sys.stdin:
    with open(f"/proc/self/task/{threads[1].native_id}/comm", "w") as fh:
        fh.write(line.strip())
    print("ok", flush=True)
"""

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent changes real threads"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
]


def _cpuset(tid: int) -> str:
    for line in Path(f"/proc/{tid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            return path
    return ""


@needs_v1_cpuset
def test_a_first_member_gets_its_cpu_at_once_and_gives_it_back_later(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    job = subprocess.Popen(
        [sys.executable, "-c", _JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    agent = None
    try:
        plain, hot = map(int, job.stdout.readline().split())
        everyone = (job.pid, plain, hot)
        before = {
            t: (os.sched_getaffinity(t), os.getpriority(os.PRIO_PROCESS, t)) for t in everyone
        }
        home = _cpuset(hot)
        agent = Agent(tmp_path, job.pid, policy=policy, new_session=True)  # as a service runs
        agent.wait_passes(1)
        # it leads its session, at rest at the nice it started with (a storm raises both:
        # tests/privileged/test_agent.py)
        mine = Path("/proc/self/autogroup").read_text()
        assert Path(f"/proc/{agent.proc.pid}/autogroup").read_text().endswith(" nice 0\n")
        assert os.getpriority(os.PRIO_PROCESS, agent.proc.pid) == 0
        passes = agent.status()["passes"]
        # no member: the layer has no CPU, the pool is every CPU, nothing changed
        assert {t: os.sched_getaffinity(t) for t in everyone} == {
            t: b[0] for t, b in before.items()
        }

        def rename(name: str) -> None:
            job.stdin.write(name + "\n")
            job.stdin.flush()
            assert job.stdout.readline() == "ok\n"

        rename("hostd_hot_1")
        wait_for(lambda: len(os.sched_getaffinity(hot)) == 1, "the first member's own CPU", agent)
        (own,) = os.sched_getaffinity(hot)
        assert os.sched_getscheduler(hot) == os.SCHED_BATCH
        assert os.getpriority(os.PRIO_PROCESS, hot) == -3
        pool = before[plain][0] - {own}
        # the pool's threads follow, a few at a time, still without a full pass
        wait_for(
            lambda: os.sched_getaffinity(plain) == os.sched_getaffinity(job.pid) == pool,
            "the pool's threads off the layer's CPU",
            agent,
        )
        wait_for(lambda: _cpuset(hot) == "/hostd/hot", "the member in its layer's cpuset", agent)
        assert agent.status()["passes"] == passes, "a full pass did it, not the re-layer"
        layers = {ly["name"]: ly for ly in agent.status()["layers"]}
        assert layers["hot"]["cpus"] == [own]
        # A full pass (made in pieces: hostd's cgroups, the threads, the rest) finds it all as
        # the re-layer left it: it writes nothing and gives nothing back, the cpusets included.
        counts = agent.full_pass()["last_pass"]["counts"]
        assert not {k: n for k, n in counts.items() if k in ("applied", "restored")}, counts
        assert _cpuset(hot) == "/hostd/hot" and os.sched_getaffinity(hot) == {own}
        passes += 1

        rename("plain_again")  # the layer is empty: after shrink_after, its CPU goes back
        wait_for(
            lambda: all(os.sched_getaffinity(t) == before[t][0] for t in everyone),
            "every thread back on every CPU",
            agent,
        )
        assert os.getpriority(os.PRIO_PROCESS, hot) == before[hot][1]
        assert os.sched_getscheduler(hot) == os.SCHED_OTHER
        assert _cpuset(hot) == home
        assert agent.status()["passes"] == passes, "a full pass did it, not the re-layer"
        log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert "relayer reason=grow" in log and "relayer reason=shrink" in log, log
        assert " ERROR " not in log and "Traceback" not in log, log
        agent = None
        assert {
            t: (os.sched_getaffinity(t), os.getpriority(os.PRIO_PROCESS, t)) for t in everyone
        } == before
        assert not Path("/sys/fs/cgroup/cpuset/hostd/hot").exists()
        assert Path("/proc/self/autogroup").read_text() == mine  # the test's own: untouched
    finally:
        if agent is not None:
            agent.stop()
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()

"""The agent on a cgroup-v2, multi-node kernel: a stand-in job's threads placed, then restored.

``hostd run`` (tests/vm/inside/policy.toml, scoped to a ``tests/workload.py`` job) on the VM:
the rank's threads get SCHED_FIFO on a CPU of their own, in a threaded child
``G/hostd.trainer`` of the job's own cgroup G (its comm threads stay in G), the data worker
SCHED_BATCH at nice 5, and IRQs leave the rank's CPU. After ``kill -9`` of the agent,
``hostd restore`` puts back every thread and IRQ: the job's threads read as before, and
``kernel_state`` (conftest) checks the cgroup tree, the root's ``cgroup.subtree_control`` and
IRQs. (A job in the root cgroup, and SIGTERM's restore: test_hotplug.py's agent test.)
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

from tests import agentproc
from tests.agentproc import Agent
from tests.vm.inside.conftest import hostd_here, read, snapshot
from tests.workload import TrainingJob

# Under software emulation a full pass takes seconds: a failure is reported after 2 minutes.
wait_for = functools.partial(agentproc.wait_for, timeout=120)

POLICY = Path(__file__).with_name("policy.toml")


def cgroup_of(tid: int) -> str | None:
    """The thread's v2 cgroup (the "0::" line of /proc/TID/cgroup)."""
    for line in (read(f"/proc/{tid}/cgroup") or "").splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def thread_state(tid: int) -> tuple | None:
    try:
        return (
            tuple(sorted(os.sched_getaffinity(tid))),
            os.sched_getscheduler(tid),
            os.sched_getparam(tid).sched_priority,
            os.getpriority(os.PRIO_PROCESS, tid),
            cgroup_of(tid),
        )
    except OSError:
        return None


def job_state(job: TrainingJob) -> dict:
    return {tid: thread_state(tid) for pid in job.pids for tid in job.tids(pid)}


def comm(tid: int) -> str | None:
    return read(f"/proc/{tid}/comm")


def test_threaded_subtree_in_the_jobs_cgroup_events_and_kill_9_then_restore(
    tmp_path, v2, kernel_state
):
    """The job in a cgroup of its own (as under systemd or a container runtime): its trainer
    threads move to ``G/hostd.trainer``, G becomes the thread root and keeps the processes; a
    thread and a process born later in hostd.trainer (but of other layers) go back to G by
    events; after ``kill -9`` of the agent, ``hostd restore`` puts everything back."""
    group = v2.create("hostd-vmtest-job")
    home = f"/{group}"
    base = f"/sys/fs/cgroup/{group}"
    with TrainingJob(ranks=1, workers=1) as job:
        for pid in job.pids:
            v2.move(pid, group)
        before, kernel = job_state(job), kernel_state
        assert {state[4] for state in before.values()} == {home}
        agent = Agent(tmp_path, job.launcher, policy=POLICY)
        try:
            rank = job.ranks[0]
            agent.wait_passes(1, timeout=300)  # an interpreter starts slowly under emulation
            wait_for(lambda: cgroup_of(rank) == f"{home}/hostd.trainer", "rank placed", agent)
            assert read(f"{base}/cgroup.type") == "domain threaded"
            assert read(f"{base}/hostd.trainer/cgroup.type") == "threaded"
            placed = job_state(job)
            (own,) = placed[rank][0]  # confined to one CPU of its own
            assert placed[rank][1:3] == (os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, 10)
            worker = placed[job.workers[0]]
            assert worker[1] == os.SCHED_BATCH and worker[3] == 5
            assert read(f"{base}/hostd.trainer/cpuset.cpus.effective") == str(own)
            irqs = [irq for irq, aff in snapshot()["irqs"].items() if aff != kernel["irqs"][irq]]
            assert irqs, "no IRQ left the rank's CPU"
            assert all(
                str(own) not in (read(f"/proc/irq/{irq}/smp_affinity_list") or "") for irq in irqs
            )
            for tid, state in placed.items():
                name = comm(tid)
                trainer = tid in job.tids(rank) and not name.startswith(("gloo", "pt_"))
                assert state[4] == (f"{home}/hostd.trainer" if trainer else home), (tid, name)
            assert str(rank) in read(f"{base}/cgroup.procs").split()  # the process stays in G

            old = set(job.tids(rank))
            job.new_thread(rank)  # pt_nccl_heartbt, born in hostd.trainer: not a trainer
            wait_for(lambda: set(job.tids(rank)) - old, "the new thread", agent)
            (new,) = set(job.tids(rank)) - old
            wait_for(lambda: comm(new) == "pt_nccl_heartbt", "its rename", agent)
            wait_for(lambda: cgroup_of(new) == home, "the new thread back home", agent)
            workers = set(job.workers)
            job.new_worker(rank)  # forked by the trainer thread: born in hostd.trainer too

            def new_worker() -> set[int]:
                kids = read(f"/proc/{rank}/task/{rank}/children") or ""
                return {int(p) for p in kids.split()} - workers

            wait_for(new_worker, "the new worker", agent)
            (worker,) = new_worker()
            wait_for(lambda: comm(worker) == "pt_data_worker", "its rename", agent)
            wait_for(lambda: cgroup_of(worker) == home, "the new worker back home", agent)
            wait_for(lambda: thread_state(worker)[1] == os.SCHED_BATCH, "its sched", agent)
        finally:
            log = agent.stop(signal.SIGKILL)
        assert "Traceback" not in log, log
        assert read(f"{base}/cgroup.type") == "domain threaded"  # killed: nothing restored
        out = hostd_here("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        after = job_state(job)
        assert {tid: after[tid] for tid in before} == before, out.stdout
        assert read(f"{base}/cgroup.type") == "domain", out.stdout
        assert not [p for p in os.listdir(base) if p.startswith("hostd.")], out.stdout

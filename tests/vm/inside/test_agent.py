"""The agent on a cgroup-v2, 2-node kernel: one enforcing pass over a stand-in job, then restore.

``hostd run --once`` (tests/vm/inside/policy.toml, scoped to a ``tests/workload.py`` job) on
the VM: the rank gets SCHED_FIFO on a CPU of its own (on v2 by thread affinity), the data
worker SCHED_BATCH at nice 5, and IRQs leave the rank's CPU. ``hostd restore`` then puts back
every thread and IRQ: the job's threads read as before, and ``kernel_state`` (conftest) checks
the cgroup tree and IRQs.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.vm.inside.conftest import hostd, read, snapshot
from tests.workload import TrainingJob

POLICY = Path(__file__).with_name("policy.toml")


def thread_state(tid: int) -> tuple | None:
    try:
        return (
            tuple(sorted(os.sched_getaffinity(tid))),
            os.sched_getscheduler(tid),
            os.sched_getparam(tid).sched_priority,
            os.getpriority(os.PRIO_PROCESS, tid),
        )
    except OSError:
        return None


def job_state(job: TrainingJob) -> dict:
    return {tid: thread_state(tid) for pid in job.pids for tid in job.tids(pid)}


def test_one_pass_then_restore_on_cgroup_v2(tmp_path):
    dirs = ["--state-dir", str(tmp_path / "state"), "--run-dir", str(tmp_path / "run")]
    with TrainingJob(ranks=1, workers=1) as job:
        before, kernel = job_state(job), snapshot()
        out = hostd(
            "run", "--once", "--policy", str(POLICY), "--scope-pid", str(job.launcher), *dirs
        )
        assert "Traceback" not in out.stderr, out.stderr

        rank = thread_state(job.ranks[0])
        assert rank[1] == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK and rank[2] == 10
        (own,) = rank[0]  # confined to one CPU of its own
        worker = thread_state(job.workers[0])
        assert worker[1] == os.SCHED_BATCH and worker[3] == 5
        after = snapshot()
        irqs = [irq for irq, aff in after["irqs"].items() if aff != kernel["irqs"][irq]]
        assert irqs, "no IRQ left the rank's CPU"
        assert all(
            str(own) not in (read(f"/proc/irq/{irq}/smp_affinity_list") or "") for irq in irqs
        )

        out = hostd("restore", *dirs)
        assert job_state(job) == before, out.stdout

"""Stand-in nodes as real processes (root, live kernel): hostd reads each process's parentage,
environment, uid, session, cgroup, command line, thread names and accelerator fds from /proc
and places every thread as the pure stand-in of tests/standin.py says (the same job model, the
same default policy). GPU device files are character devices in a mount namespace of the node's
own (tests/standin_live.py); the only fake is the driver table's name for their major. The test
checks that every process it started is gone and every cgroup it made removed."""

from __future__ import annotations

import os

import pytest

from hostd.classify import Classifier
from hostd.model.jobs import JOB_VARS
from hostd.policy import load_default
from hostd.tasks import scan
from tests.standin import Proc, activity, build, pytorch_job, services
from tests.standin_live import LiveNode, driver_host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: setuid, cgroups, mounts")


def without_rdma(procs: list[Proc]) -> list[Proc]:
    """The node less its threads that wait for an RDMA device's events (none here)."""
    for p in procs:
        p.threads = [t for t in p.threads if activity(t[4:]) != "rdma-events"]
    return procs


NODES = {
    "ddp-py314-slurm": lambda: pytorch_job(python="3.14", ranks=2, workers=2) + services(),
    "ddp-py311-k8s": lambda: pytorch_job(layout="k8s", ranks=2, workers=1) + services(k8s=True),
}


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_live_stand_in_node_is_classified_as_its_model(node):
    procs = without_rdma(NODES[node]())
    # thread kind and what it does -> the layers the pure model puts it in (threads that carry
    # their process's name are one kind here, whatever the model's reason for each)
    model: dict[str, set[str]] = {}
    classifier = Classifier(load_default())
    for t in build(procs):
        kind = f"{t.kind} [{t.task.activity}]"
        model.setdefault(kind, set()).add(classifier.classify(t.task).name)
    assert any("[polls]" in k for k in model)
    assert any("[feeds]" in k for k in model) == ("py311" in node)  # 3.14 names its feeders
    key_of = {}
    with LiveNode(procs) as live:
        if live.mount is None:
            pytest.skip("no cgroup hierarchy to make the node's cgroups in")
        key_of = {pid: key for key, pid in live.pids.items()}
        made = list(live.made)
        spec = {p.key: p for p in procs}
        # a thread that was not yet in its system call when scanned is "runs": scan again
        for _ in range(100):
            tasks = scan(driver_host(live.runtime), pids=sorted(live.pids.values()))
            if not any(t.activity == "runs" for t in tasks):
                break
        seen: dict[str, set[str]] = {}
        for task in tasks:
            proc = spec[key_of[task.pid]]
            # the reader saw what the node is
            assert task.process.comm == proc.comm
            assert task.uid == proc.uid
            assert task.process.cgroup == proc.cgroup, (proc.key, task.process.cgroup)
            want = tuple(sorted((k, v) for k, v in proc.env.items() if k in JOB_VARS))
            assert task.process.env == want, proc.key
            assert set(task.process.gpu_devices) == set(proc.fds), proc.key
            if task.tid == task.pid:
                kind = f"{proc.comm} (main)"
            else:
                assert any((r[0] or proc.comm) == task.comm for r in proc.threads), task.comm
                kind = f"{proc.comm} / {task.comm}"
            seen.setdefault(f"{kind} [{task.activity}]", set()).add(classifier.classify(task).name)
        assert seen == model
        job = {t.pid: t.process.job for t in tasks}
        assert all(job[pid] is not None for key, pid in live.pids.items() if key.startswith("rank"))
    assert not live.tagged()
    assert not [p for p in made if p.exists()]

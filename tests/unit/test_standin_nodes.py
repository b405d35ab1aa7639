"""The default policy on stand-in nodes of real training jobs (tests/standin.py): each thread
kind's expert layer, with the reason, and the goals of issue 17.

Goals: no GPU service's or other user's thread in a protected layer; no job thread in the
system layer; no thread in a layer with weaker protection than its expert's; 95 % of threads
in their expert's layer on every node. A thread nobody named (NCCL's without
NCCL_SET_THREAD_NAME=1, Python 3.11's queue feeders) carries its rank's name: hostd knows it by
what it does (``activity``: NCCL's service threads wait in poll(2), its InfiniBand thread on the
device's events, a feeder on a lock after writing to a pipe). NCCL's proxy progress thread,
idle on a condition variable, looks like any other thread of the rank: it stays with its rank,
with the rank's protection, and ``hostd explain`` calls it "unnamed thread of rank N".
"""

from __future__ import annotations

import pytest

from hostd.classify import Classifier
from hostd.doctor import job_findings
from hostd.policy import load_default
from tests.standin import NODES, build, score

CLASSIFIER = Classifier(load_default())


@pytest.mark.parametrize("node", sorted(NODES))
def test_the_gates_hold_on_every_node(node):
    threads = build(NODES[node]())
    s = score(node, threads, CLASSIFIER)
    assert s.outsiders_protected == 0
    assert s.job_in_system == 0
    assert s.weaker == 0, s.misses
    for (kind, expert, got), _count in s.misses.items():
        # the only miss: NCCL's unnamed progress thread, kept with its rank
        assert (kind, expert, got) == ("python3 / python3", "comms", "trainer"), (kind, expert, got)
    progress = [t for t in threads if t.reason == "an NCCL thread: proxy progress"]
    assert sum(s.misses.values()) == sum(t.task.unnamed for t in progress)
    unnamed = [t for t in threads if t.task.process.job and t.task.unnamed]
    assert all(
        t.task.job_line().startswith("unnamed thread of rank ")
        for t in unnamed
        if t.task.process.job.role == "rank"
    )


@pytest.mark.parametrize("node", sorted(NODES))
def test_every_layer_gets_its_threads(node):
    s = score(node, build(NODES[node]()), CLASSIFIER)
    assert s.strict >= 0.95, s.misses
    # GPU services, the launcher, data workers (forked or from a forkserver), compile
    # workers and ptxas, and the system's daemons: all in their expert's layer, every node
    for layer in ("gpu-services", "helpers", "compile", "system", "rest"):
        if layer in s.per_layer:
            threads, strict, _ = s.per_layer[layer]
            assert strict == threads, (layer, s.misses)


def test_the_thread_kinds_and_their_reasons():
    threads = build(NODES["ddp-py314-slurm"]())
    by_kind = {t.kind: (CLASSIFIER.classify(t.task).name, t.expert, t.reason) for t in threads}
    assert by_kind["pt_data_worker (main)"] == ("data", "data", "a DataLoader worker")
    assert by_kind["python3 / QueueFeederThre"][:2] == ("data", "data")
    assert by_kind["python3 / Thread-2 (_serv"][:2] == ("helpers", "helpers")
    assert by_kind["ptxas (main)"][:2] == ("compile", "compile")
    assert by_kind["nv-hostengine (main)"][:2] == ("gpu-services", "gpu-services")
    assert by_kind["slurmstepd (main)"][:2] == ("system", "system")
    assert by_kind["pt_elastic (main)"][:2] == ("helpers", "helpers")


def test_a_job_lands_alike_in_every_layout():
    """Slurm (v1 and v2), Kubernetes (systemd and cgroupfs drivers), Docker, a bare ssh
    session: the same job's threads, kind by kind, in the same layers."""

    def layers(node: str) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for t in build(NODES[node]()):
            if t.task.process.job is not None:
                out.setdefault((t.kind, t.reason), set()).add(CLASSIFIER.classify(t.task).name)
        return out

    first = layers("ddp-py311-slurm-nccl-named")
    assert all(len(v) == 1 for v in first.values()), first
    for node in ("ddp-py311-slurm-v1", "ddp-py311-k8s-cgroupfs", "ddp-py311-docker"):
        assert layers(node) == first, node
    ssh = layers("ddp-py311-ssh")
    assert ssh == first


def test_doctor_names_the_jobs_that_could_name_their_threads():
    unnamed = job_findings(t.task for t in build(NODES["ddp-py311-slurm"]()))
    assert [(f.feature, f.ok) for f in unnamed] == [("job threads", False)]
    # 5 NCCL threads and 4 queue feeders in each of 8 ranks
    assert "72 threads of 8 ranks" in unnamed[0].detail
    # NCCL's service, UDS, RAS and IB threads and the feeders are known by what they do
    assert "64 are known by what they do" in unnamed[0].detail
    assert "the other 8 stay with their rank" in unnamed[0].detail
    assert "set NCCL_SET_THREAD_NAME=1" in unnamed[0].detail
    named = job_findings(t.task for t in build(NODES["fsdp-py314-k8s-nccl-named"]()))
    assert [(f.feature, f.ok) for f in named] == [("job threads", True)]

"""Sidecar scope in the host's PID namespace, on a fixture /proc: the processes of the cgroup
subtree hostd's own cgroup belongs to (its pod), and a clear refusal where that is the host."""

from __future__ import annotations

import pytest

from hostd import sidecar
from hostd.host import Host

POD = "/kubepods.slice/kubepods-pod1.slice"


def proc_tree(tmp_path, own: str, others: dict[int, str]):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(f"0::{own}\n")
    for pid, path in others.items():
        (tmp_path / f"proc/{pid}").mkdir()
        (tmp_path / f"proc/{pid}/cgroup").write_text(f"0::{path}\n")
    return Host(tmp_path)


def test_scope_is_the_pods_cgroup_subtree(tmp_path):
    host = proc_tree(
        tmp_path,
        f"{POD}/cri-containerd-hostd.scope",
        {
            10: f"{POD}/cri-containerd-trainer.scope",
            11: f"{POD}/cri-containerd-trainer.scope/hostd.trainer",  # placed by hostd
            12: "/kubepods.slice/kubepods-pod2.slice/cri-containerd-x.scope",  # another pod
            13: "/system.slice/kubelet.service",
            14: f"{POD}x/cri-containerd-y.scope",  # a sibling whose name only starts the same
        },
    )
    assert sidecar.in_host_pid_namespace(host)  # no ns file in the fixture: the host's
    assert sidecar.pod_cgroup(host) == POD
    assert sidecar.scope(host) == [10, 11]


def test_a_sidecar_whose_pod_is_the_whole_host_refuses(tmp_path):
    host = proc_tree(tmp_path, "/", {10: "/system.slice/a.service"})
    with pytest.raises(sidecar.SidecarError, match="its pod's cgroup is the whole host"):
        sidecar.scope(host)

"""The node model: each layout that systemd, the container runtimes, the kubelet and Slurm make
(v1 and v2, both cgroup drivers) is placed as what it is; names made below a delegation
boundary (a user's manager, a container) are their owner's, whatever they look like; the
managers' records (OCI specs, logind sessions) give a pod's namespace and a login's service."""

from __future__ import annotations

import json

import pytest

from hostd.host import Host
from hostd.host.parsers import parse_logind_session, parse_pod_spec
from hostd.model.node import CAP_SYS_ADMIN, KINDS, Place, host_access, place
from hostd.tasks import node_of

C = "0123456789abcdef" * 4  # a container id (64 hex)
UID = "1b2c3d4e-0000-1111-2222-333344445555"
SUID = UID.replace("-", "_")  # the kubelet's systemd driver writes the pod uid so

LAYOUTS = [
    ("/", Place("root")),
    ("/hostd.demoted", Place("root")),
    ("/init.scope", Place("init", "init.scope")),
    # systemd's services, templated units, other slices, a delegated service's own cgroups
    ("/system.slice/ssh.service", Place("service", "ssh.service")),
    ("/system.slice/system-getty.slice/getty@tty1.service", Place("service", "getty@tty1.service")),
    ("/system.slice/containerd.service/sub", Place("service", "containerd.service")),
    ("/system.slice/kubelet.service", Place("service", "kubelet.service")),
    ("/gpu.slice/nv-hostengine.service", Place("service", "nv-hostengine.service")),
    ("/system.slice/slurmd.service", Place("service", "slurmd.service")),
    ("/system.slice/slurmstepd.scope/system", Place("service", "slurmstepd.scope")),
    # systemd-run
    ("/system.slice/run-u42.service", Place("transient", "run-u42.service")),
    ("/system.slice/run-r8f3a.scope", Place("transient", "run-r8f3a.scope")),
    ("/system.slice/run-p1234-i5678.service", Place("transient", "run-p1234-i5678.service")),
    # logins and users' own managers
    ("/user.slice/user-1000.slice/session-3.scope", Place("login", "session-3.scope", uid=1000)),
    ("/user.slice/user-0.slice/session-c12.scope", Place("login", "session-c12.scope", uid=0)),
    (
        "/user.slice/user-1000.slice/user@1000.service/app.slice/x.service",
        Place("user", "user@1000.service", uid=1000),
    ),
    # a rootless container, and names a user made below its own manager: still the user's
    (
        f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{C}.scope",
        Place("user", "user@1000.service", uid=1000),
    ),
    (
        "/user.slice/user-1000.slice/user@1000.service/system.slice/kubelet.service",
        Place("user", "user@1000.service", uid=1000),
    ),
    # containers outside Kubernetes: systemd driver, cgroupfs driver, machined, LXC
    (f"/system.slice/docker-{C}.scope", Place("container", f"docker-{C}.scope", "docker", C)),
    (
        f"/system.slice/docker-{C}.scope/system.slice/ssh.service",
        Place("container", f"docker-{C}.scope", "docker", C),
    ),  # systemd inside the container
    (f"/docker/{C}", Place("container", runtime="docker", container=C)),
    (f"/machine.slice/libpod-{C}.scope", Place("container", f"libpod-{C}.scope", "podman", C)),
    (
        f"/machine.slice/libpod-conmon-{C}.scope",
        Place("container", f"libpod-conmon-{C}.scope", "podman", C),
    ),
    (f"/libpod_parent/libpod-{C}", Place("container", runtime="podman", container=C)),
    (f"/system.slice/nerdctl-{C}.scope", Place("container", f"nerdctl-{C}.scope", "nerdctl", C)),
    (f"/default/{C}", Place("container", runtime="containerd", container=C)),
    ("/machine.slice/machine-web.scope", Place("container", "machine-web.scope", "machined")),
    (
        "/machine.slice/systemd-nspawn@db.service",
        Place("container", "systemd-nspawn@db.service", "machined"),
    ),
    ("/lxc.payload.builder", Place("container", "builder", "lxc")),
    # Kubernetes, systemd driver: each QoS class, each runtime, a conmon, the pod slice itself
    (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/"
        f"cri-containerd-{C}.scope",
        Place("pod", runtime="containerd", container=C, pod_uid=UID, qos="burstable"),
    ),
    (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/"
        f"crio-{C}.scope",
        Place("pod", runtime="cri-o", container=C, pod_uid=UID, qos="besteffort"),
    ),
    (
        f"/kubepods.slice/kubepods-pod{SUID}.slice/docker-{C}.scope",
        Place("pod", runtime="docker", container=C, pod_uid=UID, qos="guaranteed"),
    ),
    (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/"
        f"crio-conmon-{C}.scope",
        Place("pod", runtime="cri-o", container=C, pod_uid=UID, qos="burstable"),
    ),
    (f"/kubepods.slice/kubepods-pod{SUID}.slice", Place("pod", pod_uid=UID, qos="guaranteed")),
    # Kubernetes, cgroupfs driver (v1 or v2)
    (f"/kubepods/burstable/pod{UID}/{C}", Place("pod", container=C, pod_uid=UID, qos="burstable")),
    (f"/kubepods/pod{UID}/{C}", Place("pod", container=C, pod_uid=UID, qos="guaranteed")),
    (
        f"/kubepods/besteffort/pod{UID}/{C}/x",
        Place("pod", container=C, pod_uid=UID, qos="besteffort"),
    ),
    # Slurm steps (v2 under slurmstepd.scope, v1 under /slurm/uid_U) and a step's stepd
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", Place("slurm", slurm="4242.0")),
    ("/system.slice/slurmstepd.scope/job_7/step_batch/user/x", Place("slurm", slurm="7.batch")),
    ("/slurm/uid_1000/job_7/step_3", Place("slurm", slurm="7.3")),
    (
        "/system.slice/slurmstepd.scope/job_7/step_0/slurm",
        Place("service", "slurmstepd.scope", slurm="7.0"),
    ),
    # what no row knows
    ("/user.slice/user-1000.slice", Place("other")),
    ("/custom", Place("other")),
    ("/kubepods.slice/odd", Place("other")),
]


@pytest.mark.parametrize(("cgroup", "want"), LAYOUTS, ids=[c for c, _ in LAYOUTS])
def test_each_layout_is_placed(cgroup: str, want: Place) -> None:
    assert place(cgroup) == want
    assert want.kind in KINDS
    assert place(cgroup).line()  # an explanation's line for every kind


def test_every_kind_but_kernel_has_a_layout() -> None:
    assert {want.kind for _, want in LAYOUTS} == set(KINDS) - {"kernel"}


@pytest.mark.parametrize(
    "forged",
    [
        # A user's own manager may name cgroups as it likes below itself: none of these is what
        # its name says, because the path is read from the root down.
        "/user.slice/user-1000.slice/user@1000.service/init.scope",
        f"/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}/{C}",
        "/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_1/step_0",
    ],
)
def test_names_below_a_users_manager_are_the_users(forged: str) -> None:
    assert place(forged).kind == "user"


CONTAINERD_SPEC = {
    "ociVersion": "1.1.0",
    "annotations": {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "calico-node",
        "io.kubernetes.cri.sandbox-name": "calico-node-x7",
        "io.kubernetes.cri.sandbox-namespace": "kube-system",
        "io.kubernetes.cri.sandbox-uid": UID,
    },
}
CRIO_SPEC = {
    "annotations": {
        "io.kubernetes.pod.namespace": "kube-system",
        "io.kubernetes.pod.name": "etcd-node1",
        "io.kubernetes.container.name": "etcd",
        "io.kubernetes.cri-o.Annotations": json.dumps(
            {"kubernetes.io/config.source": "file", "kubernetes.io/config.hash": "9f"}
        ),
    }
}
DOCKER_RECORD = {
    "Config": {
        "Labels": {
            "io.kubernetes.pod.namespace": "team-a",
            "io.kubernetes.pod.name": "train-0",
            "annotation.kubernetes.io/config.source": "api",
        }
    }
}


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        (CONTAINERD_SPEC, ("kube-system", "calico-node-x7", False)),
        (CRIO_SPEC, ("kube-system", "etcd-node1", True)),
        (DOCKER_RECORD, ("team-a", "train-0", False)),
        ({"annotations": {"org.opencontainers.image.title": "x"}}, None),  # a plain container
        ([], None),
    ],
    ids=["containerd", "cri-o static", "cri-dockerd", "no pod", "not a table"],
)
def test_a_pod_from_its_runtimes_record(doc: object, want: tuple | None) -> None:
    assert parse_pod_spec(json.dumps(doc)) == want


def test_a_garbled_record_says_no_pod() -> None:
    assert parse_pod_spec("{not json") is None


def test_a_login_from_logind() -> None:
    text = "# This is private data.\nUID=0\nUSER=root\nSERVICE=sshd\nTYPE=tty\nTTY=pts/0\n"
    assert parse_logind_session(text) == ("sshd", True, 0)
    assert parse_logind_session("UID=1000\nSERVICE=cron\nTYPE=unspecified\n") == (
        "cron", False, 1000
    )  # fmt: skip


def test_a_process_is_placed_with_its_managers_records(tmp_path) -> None:
    """On a tree: a pod's container gets its namespace from containerd's bundle, a login its
    service from logind; a record that is not there leaves what the path says."""
    bundle = tmp_path / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / C
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(CONTAINERD_SPEC))
    sessions = tmp_path / "run/systemd/sessions"
    sessions.mkdir(parents=True)
    (sessions / "3").write_text("UID=1000\nSERVICE=sshd\nTYPE=unspecified\n")
    host = Host(tmp_path)
    pod = node_of(
        host, f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/"
        f"cri-containerd-{C}.scope",
    )  # fmt: skip
    assert (pod.namespace, pod.pod, pod.static) == ("kube-system", "calico-node-x7", False)
    assert pod.line() == "pod kube-system/calico-node-x7 (burstable)"
    login = node_of(host, "/user.slice/user-1000.slice/session-3.scope")
    assert (login.login, login.login_tty) == ("sshd", False)
    other = node_of(host, "/user.slice/user-1000.slice/session-4.scope")
    assert other == place("/user.slice/user-1000.slice/session-4.scope")
    unknown = node_of(host, f"/kubepods/pod{UID}/{'e' * 64}")
    assert unknown.namespace == "" and unknown.kind == "pod"
    assert pod.host_access == "" and unknown.host_access == ""  # no namespaces in a tree


HOST, POD_NS, OWN = 4026531840, 4026532301, 4026532555  # namespace inodes
DEFAULT_SET, FULL_SET = 0x00000000A80425FB, 0x000001FFFFFFFFFF  # containerd's; every capability


@pytest.mark.parametrize(
    ("net", "user", "cap_bnd", "want"),
    [
        ((HOST, HOST), (HOST, HOST), DEFAULT_SET, "host network"),  # hostNetwork: kthreadd's
        ((POD_NS, HOST), (HOST, HOST), DEFAULT_SET, ""),  # containerd's default set
        ((POD_NS, HOST), (HOST, HOST), FULL_SET, "privileged"),  # every capability
        ((POD_NS, HOST), (HOST, HOST), 1 << CAP_SYS_ADMIN, "privileged"),  # SYS_ADMIN added
        # a workload's process that made a user namespace of its own (unshare -U): a full
        # bounding set there, over nothing of the host's
        ((POD_NS, HOST), (OWN, HOST), FULL_SET, ""),
        ((None, None), (None, None), FULL_SET, ""),  # a fixture tree: namespaces unknown
        ((None, HOST), (None, HOST), FULL_SET, ""),  # the process is gone
    ],
)
def test_a_pods_host_access_is_the_kernels(net, user, cap_bnd, want) -> None:
    assert host_access(net, user, cap_bnd) == want


def test_a_node_agents_pod_says_so() -> None:
    pod = place(f"/kubepods/burstable/pod{UID}/{'e' * 64}").with_pod("monitoring", "ne-x")
    assert pod.with_host_access("").line() == "pod monitoring/ne-x (burstable)"
    agent = pod.with_host_access("host network")
    assert agent.line() == "pod monitoring/ne-x (burstable, host network)"

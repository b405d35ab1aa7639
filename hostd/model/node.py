"""The node model: what each process is on the node, from what the kernel and the node's own
managers show root (DESIGN.md, "The node model").

``place(cgroup)`` reads a process's cgroup path (its home: hostd's own cpusets left out) with a
table of the layouts that systemd, the container runtimes (systemd and cgroupfs drivers, v1
and v2), the kubelet and Slurm make, and returns a ``Place``: a systemd service, a transient
unit, a login session, a user's own manager, a container, a Kubernetes pod's container (its
QoS class and pod uid), a Slurm step, the root cgroup. ``Place.with_pod`` and
``Place.with_login`` add what the managers' own state files say (the pod's namespace and name
from the container runtime's OCI bundle; the login's service and terminal from logind), read
by ``hostd.host``; ``Place.with_host_access`` what the kernel says of a pod's process
(``host_access``: it runs in the host's network namespace, or may hold CAP_SYS_ADMIN). Pure: no
I/O; the policy's ``node``, ``unit``, ``pod_namespace``, ``pod_qos``, ``static_pod`` and
``login_service`` predicates and ``[preempt] keep_*`` read it.

Why a user cannot forge it: only root, or the manager a subtree is delegated to, makes
cgroups, and a path is read from the root down. The first delegation boundary met decides: a
user's own manager (``user@UID.service``), a container, a pod's container or a Slurm step
owns everything below it, whatever names it made there (a rootless container, a
``system.slice`` inside a container, a ``kubepods`` below a user's manager). The state files
are root's, written by containerd, CRI-O, dockerd and logind; a pod's namespace is what the
Kubernetes API admitted. A pod's host access is the kernel's: a process in a pod's cgroup
shares the host's network namespace, or has CAP_SYS_ADMIN in its bounding set in the host's
user namespace, only where the pod was admitted with ``hostNetwork`` or ``privileged`` (what
Kubernetes' baseline Pod Security Standard forbids: the node's agents, CNI, kube-proxy,
exporters, device plugins, run so), or where a process already holding CAP_SYS_ADMIN on the
host moved it there (a user namespace of its own gives a process a full bounding set over
nothing of the host's: ``host_access``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

# Each kind, and what it is (``hostd policy show``, ``hostd explain``, docs/policy.md).
KINDS = {
    "kernel": "a kernel thread",
    "init": "the init system (PID 1 in /init.scope)",
    "service": "a system service: a systemd unit of a system slice (kubelet, containerd, sshd, "
    "slurmd, a log shipper)",
    "transient": "a transient unit that systemd-run made (run-*.service, run-*.scope)",
    "login": "a login session (logind's session-N.scope: ssh, a console, cron with pam_systemd)",
    "user": "a user's own service manager and what it runs (user@UID.service)",
    "container": "a container outside Kubernetes (Docker, Podman, containerd, LXC, a "
    "systemd-nspawn machine)",
    "pod": "a container of a Kubernetes pod (the kubelet's kubepods tree)",
    "slurm": "a Slurm job step",
    "root": "the root cgroup: no manager placed it (a host without systemd)",
    "other": "a cgroup of a layout hostd does not know",
}
QOS = ("guaranteed", "burstable", "besteffort")
HEX64 = re.compile(r"[0-9a-f]{64}")
CAP_SYS_ADMIN = 21
KTHREADD = 2  # the kernel's thread of threads: in the host's network and user namespaces
# hostd's own cgroup for demoted processes of the root cgroup (``hostd.sched.group``): its
# processes are the root cgroup's.
DEMOTED_HOME = "/hostd.demoted"


@dataclass(frozen=True, slots=True)
class Place:
    """Where a process is on the node. ``kind`` is one of ``KINDS``; the rest say which."""

    kind: str
    unit: str = ""  # the systemd unit: "ssh.service", "docker-<id>.scope", "session-4.scope"
    runtime: str = ""  # docker, podman, containerd, cri-o, nerdctl, lxc, machined
    container: str = ""  # a container's id (64 hex) where the path names one
    pod_uid: str = ""
    qos: str = ""  # a pod's QoS class (QOS)
    slurm: str = ""  # "JOB.STEP" of a Slurm step
    uid: int | None = None  # the user of user-UID.slice (a login, a user's manager)
    # From the managers' state files, not the path (``hostd.host``):
    namespace: str = ""  # a pod's Kubernetes namespace
    pod: str = ""  # a pod's name
    static: bool = False  # a static pod (the kubelet's manifests, config.source "file")
    login: str = ""  # the PAM service of a login ("sshd", "cron", "login", ...)
    login_tty: bool = False  # logind gave the login a terminal
    # From the kernel (``host_access``): what makes a pod's container one of the node's agents
    host_access: str = ""  # "host network", "privileged" or ""

    def with_pod(self, namespace: str, pod: str, static: bool = False) -> Place:
        return replace(self, namespace=namespace, pod=pod, static=static)

    def with_host_access(self, access: str) -> Place:
        return replace(self, host_access=access) if access else self

    def with_login(self, service: str, tty: bool) -> Place:
        return replace(self, login=service, login_tty=tty)

    def line(self) -> str:
        """One line for ``hostd explain``: "pod kube-system/calico-node-x (burstable)"."""
        if self.kind == "pod":
            who = f"{self.namespace}/{self.pod}" if self.namespace else f"uid {self.pod_uid}"
            extra = (", static" if self.static else "") + (
                f", {self.host_access}" if self.host_access else ""
            )
            return f"pod {who} ({self.qos}{extra})"
        if self.kind == "container":
            return f"container of {self.runtime} {self.container[:12] or self.unit}"
        if self.kind == "login":
            how = f"{self.login or '?'}, {'a terminal' if self.login_tty else 'no terminal'}"
            return f"login {self.unit} of uid {self.uid} ({how})"
        if self.kind == "slurm":
            return f"Slurm step {self.slurm}"
        if self.kind == "user":
            return f"user {self.uid}'s own manager"
        return f"{self.kind} {self.unit}".rstrip()


def host_access(
    net: tuple[int | None, int | None], user: tuple[int | None, int | None], cap_bnd: int
) -> str:
    """What a pod's process may reach of the host, as the kernel says: "host network" where its
    network namespace is the host's, "privileged" where it runs in the host's user namespace
    with CAP_SYS_ADMIN in its bounding set (a container's runtime drops it unless the pod is
    privileged or asked for it), else "". ``net`` and ``user``: the inodes of the process's
    namespace (/proc/PID/ns/KIND) and of kthreadd's (``KTHREADD``, which like every kernel
    thread runs in the host's; PID 1's may be unreadable, as in a micro-VM whose init is a
    sandbox). Capabilities count only in the host's user namespace: a process that makes a user
    namespace of its own (``unshare -U``, open to any process where seccomp allows it) gets a
    full bounding set there, over nothing of the host's. Unknown namespaces (a fixture tree)
    say nothing."""
    known = all(ino is not None for ino in (*net, *user))
    if known and net[0] == net[1]:
        return "host network"
    if known and user[0] == user[1] and cap_bnd >> CAP_SYS_ADMIN & 1:
        return "privileged"
    return ""


KERNEL = Place("kernel")
ROOT = Place("root")

# Kubernetes, systemd driver: /kubepods.slice/[kubepods-QOS.slice/]kubepods[-QOS]-pod<uid>.slice
# [/<runtime>-<id>.scope]; cgroupfs driver: /kubepods/[QOS/]pod<uid>[/<id>].
_K8S_SYSTEMD = re.compile(
    r"/kubepods\.slice(?:/kubepods-(burstable|besteffort)\.slice)?"
    r"/kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-f_]{1,64})\.slice"
    r"(?:/(?:(cri-containerd|crio|crio-conmon|docker)-([0-9a-f]{64})\.scope))?(?:/|$)"
)
_K8S_CGROUPFS = re.compile(
    r"/kubepods(?:/(burstable|besteffort))?/pod([0-9a-f-]{1,64})(?:/([0-9a-f]{64}))?(?:/|$)"
)
_RUNTIMES = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "crio-conmon": "cri-o",
    "docker": "docker",
    "libpod": "podman",
    "libpod-conmon": "podman",
    "nerdctl": "nerdctl",
}
# Containers outside Kubernetes: systemd driver (a scope of system.slice or machine.slice),
# cgroupfs driver (a top-level folder per runtime), machined's machines, LXC.
_CONTAINER_SCOPE = re.compile(
    r"/(?:system|machine)\.slice/(docker|libpod-conmon|libpod|nerdctl|cri-containerd|crio)"
    r"-([0-9a-f]{64})\.scope(?:/|$)"
)
_CONTAINER_DIR = re.compile(r"/(docker|default|moby)/([0-9a-f]{64})(?:/|$)")
_PODMAN_DIR = re.compile(
    r"/machine\.slice/libpod_parent/libpod-([0-9a-f]{64})(?:/|$)|/libpod_parent/libpod-([0-9a-f]{64})(?:/|$)"
)
_MACHINE = re.compile(
    r"/machine\.slice/((?:machine-[^/]+\.scope)|(?:systemd-nspawn@[^/]+\.service))(?:/|$)"
)
_LXC = re.compile(r"/(?:lxc\.payload\.|lxc/)([^/]+)(?:/|$)")
# Slurm: v2 under its slurmstepd.scope, v1 under /slurm[_NODE]/uid_U (hostd.model.jobs); a
# v2 step's own slurmstepd sits in its "slurm" child, the tasks in "user".
_SLURM = re.compile(
    r"(?:/system\.slice/slurmstepd\.scope|/slurm[^/]*/uid_\d+)/job_(\d+)/step_(\w+)"
    r"(/slurm$)?(?:/|$)"
)
# systemd: users, then units of any slice.
_USER_MANAGER = re.compile(r"/user\.slice/user-(\d+)\.slice/user@(\d+)\.service(?:/|$)")
_LOGIN = re.compile(r"/user\.slice/user-(\d+)\.slice/(session-[^/]+\.scope)(?:/|$)")
_UNIT = re.compile(r"/((?:[^/]+\.slice/)*)([^/]+\.(?:service|scope|socket|mount|swap))(?:/|$)")


@lru_cache(maxsize=4096)
def place(cgroup: str) -> Place:
    """Where a process whose (home) cgroup is ``cgroup`` is on the node, by its path alone."""
    path = cgroup.rstrip("/") or "/"
    if path in ("/", DEMOTED_HOME):
        return ROOT
    if path == "/init.scope":
        return Place("init", "init.scope")
    if m := _K8S_SYSTEMD.match(path):
        qos, uid, prefix, cid = m.groups()
        return Place(
            "pod", runtime=_RUNTIMES.get(prefix or "", ""), container=cid or "",
            pod_uid=uid.replace("_", "-"), qos=qos or "guaranteed",
        )  # fmt: skip
    if m := _K8S_CGROUPFS.match(path):
        qos, uid, cid = m.groups()
        return Place("pod", container=cid or "", pod_uid=uid, qos=qos or "guaranteed")
    if m := _SLURM.match(path):
        if m[3]:  # the step's own slurmstepd, Slurm's daemon
            return Place("service", "slurmstepd.scope", slurm=f"{m[1]}.{m[2]}")
        return Place("slurm", slurm=f"{m[1]}.{m[2]}")
    if m := _CONTAINER_SCOPE.match(path):
        return Place("container", f"{m[1]}-{m[2]}.scope", _RUNTIMES[m[1]], m[2])
    if m := _CONTAINER_DIR.match(path):
        return Place("container", runtime="docker" if m[1] == "docker" else "containerd",
                     container=m[2])  # fmt: skip
    if m := _PODMAN_DIR.match(path):
        return Place("container", runtime="podman", container=m[1] or m[2])
    if m := _MACHINE.match(path):
        return Place("container", m[1], "machined")
    if m := _LXC.match(path):
        return Place("container", runtime="lxc", unit=m[1])
    if m := _USER_MANAGER.match(path):
        return Place("user", f"user@{m[2]}.service", uid=int(m[1]))
    if m := _LOGIN.match(path):
        return Place("login", m[2], uid=int(m[1]))
    if path.startswith(("/user.slice/", "/kubepods", "/machine.slice/")):
        return Place("other")  # a layout of these trees not listed above
    if m := _UNIT.match(path):
        unit = m[2]
        if unit.startswith("run-"):
            return Place("transient", unit)
        return Place("service", unit)
    return Place("other")

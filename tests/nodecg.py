"""Real cgroups at the paths a real node has, and containerd's record of a pod's container, for
the tests and the benchmark of the node model (tests/privileged/test_node.py, bench/node.py).

``Cgroup(path)`` makes ``path`` in every hierarchy that matters here: the v2 tree (or v1's
unified one), where the node model reads a process's path, and v1's ``cpu``, where the CPU is
shared; ``join`` moves the calling process in (a child between fork and exec, as runc, logind
and slurmstepd place what they start); ``remove`` moves what is left to the hierarchy's root and
removes what it made, deepest first. ``bundle`` writes a container's OCI spec where containerd's
CRI plugin keeps it, with the pod's namespace; the caller makes sure no containerd keeps that
folder. ``contain`` gives the calling process what a pod's container gets from its runtime: a
network namespace of its own (unless the pod has the host's network) and containerd's default
capability bounding set (no CAP_SYS_ADMIN).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import time
import uuid
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
CONTAINERD = Path("/run/containerd/io.containerd.runtime.v2.task/k8s.io")


def hexid() -> str:
    """A container id as runtimes make them: 64 hex digits."""
    return uuid.uuid4().hex + uuid.uuid4().hex


def pod_path(qos: str, container: str) -> str:
    """The kubelet's (systemd driver) cgroup of a container of a new pod of QoS class ``qos``."""
    uid = str(uuid.uuid4()).replace("-", "_")
    return (
        f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/"
        f"cri-containerd-{container}.scope"
    )


# containerd's default capabilities (its oci.defaultUnixCaps): CHOWN, DAC_OVERRIDE, FOWNER,
# FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD,
# AUDIT_WRITE, SETFCAP
DEFAULT_CAPS = frozenset((0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31))
CLONE_NEWNET, CLONE_NEWUSER, PR_CAPBSET_DROP = 0x40000000, 0x10000000, 24


def contain(host_network: bool = False, own_user_ns: bool = False) -> None:
    """Make the calling process (a child between fork and exec) look as a pod's container does
    to the kernel: its own network namespace unless ``host_network`` (``hostNetwork: true``),
    and a bounding set of containerd's default capabilities only. ``own_user_ns``: then, as a
    workload may where seccomp allows it (``unshare -U``), a user namespace of its own, where
    its bounding set is full again."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not host_network and libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap not in DEFAULT_CAPS and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")
    if own_user_ns and libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")


def bundle(container: str, namespace: str, pod: str = "") -> Path:
    """containerd's record of a pod's container, as its CRI plugin writes it; its folder."""
    folder = CONTAINERD / container
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"ociVersion": "1.1.0", "annotations": {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-name": pod or f"{namespace}-pod-x7",
    }}))  # fmt: skip
    return folder


class Cgroup:
    """A cgroup at ``path`` in the v2 tree (or v1's unified one) and in v1's cpu hierarchy."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.made: list[Path] = []
        self.dirs: list[tuple[Path, Path]] = []  # (the hierarchy's root, the cgroup there)
        tops = [t for t in (CGROUP / "unified", CGROUP / "cpu") if (t / "cgroup.procs").exists()]
        for top in tops or [CGROUP]:
            here = top
            for part in path.strip("/").split("/"):
                here = here / part
                if not here.exists():
                    here.mkdir()
                    self.made.append(here)
            self.dirs.append((top, here))

    def join(self) -> None:
        """Move the calling process in."""
        for _, here in self.dirs:
            with open(here / "cgroup.procs", "w") as fh:
                fh.write("0")

    def weight(self) -> dict[str, str]:
        """What hostd would write to weigh it down: its cpu.idle, cpu.shares, cpu.weight and its
        quota (cpu.max, cpu.cfs_quota_us and cpu.cfs_period_us)."""
        found = {}
        for _, here in self.dirs:
            for name in (
                "cpu.idle", "cpu.shares", "cpu.weight", "cpu.max", "cpu.cfs_quota_us",
                "cpu.cfs_period_us",
            ):  # fmt: skip
                with contextlib.suppress(OSError):
                    found[f"{here}/{name}"] = (here / name).read_text().strip()
        return found

    def remove(self) -> None:
        for top, here in self.dirs:
            with contextlib.suppress(OSError):
                for pid in (here / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (top / "cgroup.procs").write_text(pid)
        for here in reversed(self.made):
            for _ in range(50):
                try:
                    here.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # a killed process still leaving it (EBUSY)

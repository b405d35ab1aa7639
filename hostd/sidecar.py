"""Sidecar mode (``hostd run --sidecar``): hostd inside a pod, managing only that pod.

What a sidecar may touch:

* **Its pod's tasks only.** In a pod with ``shareProcessNamespace: true`` and its own PID
  namespace, every process hostd sees is the pod's: the scope is everything visible. Where hostd
  shares the host's PID namespace (``hostPID``, or run straight on a host), the scope is the
  processes in the cgroup subtree its own cgroup belongs to (the parent of its own cgroup: the
  pod's cgroup under Kubernetes, the slice under systemd), looked up again at every rescan.
* **No host-wide knobs.** IRQ affinity, cpufreq (governor, floor, EPP) and the C-state limit act
  on the whole host, which a sidecar does not own: they are off, and ``hostd doctor --sidecar``
  and the agent's log say so.

The proc connector works only in the host's PID namespace; elsewhere the agent polls (its
subscription is never acknowledged, which the agent already treats as "no connector").
"""

from __future__ import annotations

import os

from hostd.host import Host, paths
from hostd.host.parsers import primary_cgroup
from hostd.knobkinds import kinds
from hostd.model.cpus import home_of

# The initial namespaces have fixed inode numbers (include/linux/proc_ns.h: PROC_PID_INIT_INO).
INIT_PID_NS_INODE = 0xEFFFFFFC

HOST_WIDE_KINDS = kinds(host_wide=True)
HOST_WIDE = "IRQ affinity, CPU frequency governors, floors and EPP, the C-state limit"


def in_host_pid_namespace(host: Host) -> bool:
    """Whether hostd shares the host's PID namespace (it then sees every process of the host)."""
    try:
        return os.stat(host.path(paths.SELF_PID_NS)).st_ino == INIT_PID_NS_INODE
    except OSError:
        return True  # no namespace file (an old kernel): assume the host's


def own_cgroup(host: Host, pid: int | str = "self") -> str:
    """The cgroup ``pid`` lives in, as policies see it (hostd's own cpuset children stripped)."""
    return home_of(primary_cgroup(host.cgroups(pid) or {}))


def pod_cgroup(host: Host) -> str:
    """The cgroup subtree a sidecar manages: the parent of its own cgroup ("/" at the top)."""
    return os.path.dirname(own_cgroup(host).rstrip("/")) or "/"


class SidecarError(Exception):
    """A sidecar that cannot tell which tasks are its pod's."""


def scope(host: Host) -> list[int] | None:
    """The pids a sidecar manages, or None when its PID namespace shows only its pod."""
    if not in_host_pid_namespace(host):
        return None
    pod = pod_cgroup(host)
    if pod == "/":
        raise SidecarError(
            f"sidecar: hostd's own cgroup is {own_cgroup(host)!r}, so its pod's cgroup is the "
            "whole host; run it in the pod's PID namespace (shareProcessNamespace, no hostPID) "
            "or in a cgroup of its own below the pod's"
        )
    prefix = pod.rstrip("/") + "/"
    me = os.getpid()
    pids = []
    for entry in host.listdir("proc"):
        if entry.isdigit() and int(entry) != me:
            path = own_cgroup(host, entry)
            if path.startswith(prefix):
                pids.append(int(entry))
    return sorted(pids)


def describe(host: Host) -> list[tuple[str, bool, str]]:
    """(feature, ok, detail) lines for ``hostd doctor --sidecar``."""
    lines = [("sidecar", True, f"host-wide knobs are off: {HOST_WIDE}")]
    if in_host_pid_namespace(host):
        lines.append(
            (
                "sidecar scope",
                True,
                f"the host's PID namespace: manages the processes in cgroup {pod_cgroup(host)} "
                "and below (found again at every rescan)",
            )
        )
    else:
        lines.append(
            (
                "sidecar scope",
                True,
                "a PID namespace of its own: manages every process it sees (with "
                "shareProcessNamespace, its pod's); the proc connector does not work here, so "
                "it polls every [agent] interval",
            )
        )
    return lines

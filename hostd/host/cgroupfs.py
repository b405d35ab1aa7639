"""Which cgroup hierarchies this host mounts, and where: read from /proc/self/mountinfo.

Read by the topology, the cpuset actuator and the doctor.
"""

from __future__ import annotations

from hostd.host import Host, paths
from hostd.host.parsers import parse_mountinfo_cgroups
from hostd.model.topology import CgroupLayout


def read_cgroup_layout(host: Host) -> CgroupLayout:
    mounts = parse_mountinfo_cgroups(host.read_quiet(paths.SELF_MOUNTINFO) or "")
    v2 = next((m.mount_point for m in mounts if m.version == 2), None)
    v1 = tuple((c, m.mount_point) for m in mounts if m.version == 1 for c in m.controllers)
    v2_controllers: tuple[str, ...] = ()
    if v2 is not None:
        v2_controllers = tuple(
            (host.read_line(v2.lstrip("/") + "/cgroup.controllers") or "").split()
        )
    if v1 and v2:
        mode = "hybrid"
    elif v1:
        mode = "v1"
    elif v2:
        mode = "v2"
    else:
        mode = "none"
    if "cpuset" in dict(v1):
        cpuset = "v1"
    elif "cpuset" in v2_controllers:
        cpuset = "v2"
    else:
        cpuset = "none"
    return CgroupLayout(mode, v2, v2_controllers, v1, cpuset)

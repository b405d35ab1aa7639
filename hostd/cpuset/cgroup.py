"""cpuset cgroups for layers: the v1 backend (through cgroupspy) and the v2 file writer.

Mechanism (the planner's documented choice, see ``hostd.plan``): on a cgroup-v1 cpuset
hierarchy, hostd keeps its own cgroups ``/hostd/<layer>`` and moves threads that sit in the root
cpuset into them, thread by thread (v1's ``tasks`` file takes one tid per write). A v1 cpuset
hierarchy only places CPUs and memory, so moving a thread there changes nothing else about it;
threads already in someone else's cpuset (docker, kubelet) are left where they are. On cgroup
v2 a move would change every controller of the process (its memory limit too), so on v2 layers
are enforced by thread affinity; the v2 writer here serves hostd-owned subtrees (the VM tier).

Knobs: ``cgroup/cpuset/hostd[/<layer>]`` = ``{"cpus": "0-3", "mems": "0"}`` or None (absent);
``task/TID@START/cpuset`` = the thread's v1 cpuset path ("/" or "/hostd/trainer"). Restoring a
cgroup to None moves whatever is left in it back to the root cpuset, then removes it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os

from cgroupspy import trees

from hostd import knobs
from hostd.cpuset import format_cpulist, parse_cpulist
from hostd.host import Gone, Host, HostError
from hostd.host.errors import from_oserror
from hostd.host.parsers import parse_cgroup
from hostd.topology import read_cgroup_layout

HOSTD_GROUP = "hostd"


def _mount(host: Host) -> str:
    mount = _v1_cpuset_mount(host.root)
    if mount is None:
        raise HostError(errno.EOPNOTSUPP, "cpuset", "no cgroup v1 cpuset hierarchy")
    return mount.lstrip("/")


@functools.lru_cache(maxsize=16)
def _v1_cpuset_mount(root: str) -> str | None:
    """Where the v1 cpuset hierarchy is mounted (read once: a pass moves thousands of threads)."""
    return read_cgroup_layout(Host(root)).v1_mount("cpuset")


def _group_path(key: str) -> str:
    """ "cgroup/cpuset/hostd/trainer" -> "/hostd/trainer"."""
    return "/" + key.split("/", 2)[2]


def _node(host: Host, mount: str, path: str):
    """The cgroupspy node of a cpuset cgroup (or None when absent)."""
    full = host.path(mount)
    tree = trees.Tree(root_path=os.path.dirname(full), groups=[os.path.basename(full)])
    wanted = os.path.basename(full) + path.rstrip("/")
    try:
        return tree.get_node_by_path("/" + wanted.strip("/") + "/")
    except Exception:  # cgroupspy raises plain errors for missing paths
        return None


def _read_group(host: Host, key: str) -> dict | None:
    mount = _mount(host)
    path = _group_path(key)
    if not host.exists(f"{mount}{path}"):
        return None
    cpus = host.read_line(f"{mount}{path}/cpuset.cpus")
    mems = host.read_line(f"{mount}{path}/cpuset.mems")
    if cpus is None or mems is None:
        return None
    return {
        "cpus": format_cpulist(parse_cpulist(cpus)),
        "mems": format_cpulist(parse_cpulist(mems)),
    }


def _write_group(host: Host, key: str, value: object) -> None:
    mount = _mount(host)
    path = _group_path(key)
    parent, name = os.path.split(path)
    try:
        if value is None:
            _evacuate(host, mount, path)
            node = _node(host, mount, parent)
            if node is not None:
                node.delete_cgroup(name)
            return
        assert isinstance(value, dict)
        if not host.exists(f"{mount}{path}"):
            node = _node(host, mount, parent)
            if node is None:
                raise Gone(errno.ENOENT, key, f"parent cgroup {parent} is missing")
            node.create_cgroup(name)
        group = _node(host, mount, path)
        if group is None:
            raise Gone(errno.ENOENT, key, "cgroup vanished")
        # A v1 cpuset takes tasks only once both are set; mems first so cpus can follow.
        group.controller.mems = parse_cpulist(value["mems"])
        group.controller.cpus = parse_cpulist(value["cpus"])
    except OSError as exc:
        if isinstance(exc, HostError):
            raise
        raise from_oserror(exc, key) from None


def _evacuate(host: Host, mount: str, path: str) -> None:
    """Move every thread left in ``path`` (and below) back to the root cpuset."""
    for child in host.listdir(f"{mount}{path}"):
        if host.exists(f"{mount}{path}/{child}/tasks"):
            _evacuate(host, mount, f"{path}/{child}")
    for line in (host.read_quiet(f"{mount}{path}/tasks") or "").split():
        with contextlib.suppress(Gone):
            host.write(f"{mount}/tasks", line)


def _read_member(host: Host, key: str) -> str:
    tid = knobs.live_tid(host, key)
    text = host.read(f"proc/{tid}/cgroup")
    if text is None:
        raise Gone(errno.ESRCH, key, "the thread exited")
    return parse_cgroup(text).get("cpuset", "/")


def _write_member(host: Host, key: str, value: object) -> None:
    tid = knobs.live_tid(host, key)
    path = str(value).rstrip("/")
    host.write(f"{_mount(host)}{path}/tasks", str(tid))


GROUP = knobs.register(knobs.Knob("cgroup", _read_group, _write_group))
MEMBER = knobs.register(knobs.Knob("cpuset", _read_member, _write_member, per_task=True))


def group_key(layer: str | None = None) -> str:
    return f"cgroup/cpuset/{HOSTD_GROUP}" + (f"/{layer}" if layer else "")


# -- cgroup v2 ---------------------------------------------------------------------------------
def write_v2_cpuset(
    host: Host,
    group: str,
    cpus: frozenset[int],
    mems: frozenset[int],
    partition: str | None = None,
) -> None:
    """Write a v2 cgroup's ``cpuset.cpus``/``cpuset.mems`` (and ``cpuset.cpus.partition``).

    ``group`` is relative to the v2 mount, e.g. "hostd.slice/trainer". See
    Documentation/admin-guide/cgroup-v2.rst, "Cpuset Interface Files".
    """
    layout = read_cgroup_layout(host)
    if layout.v2_mount is None or "cpuset" not in layout.v2_controllers:
        raise HostError(errno.EOPNOTSUPP, group, "no cgroup v2 cpuset controller")
    base = f"{layout.v2_mount.strip('/')}/{group.strip('/')}"
    host.write(f"{base}/cpuset.mems", format_cpulist(mems))
    host.write(f"{base}/cpuset.cpus", format_cpulist(cpus))
    if partition is not None:
        host.write(f"{base}/cpuset.cpus.partition", partition)

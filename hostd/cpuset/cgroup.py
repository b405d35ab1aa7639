"""cpuset cgroups for layers: v1 and v2, written through ``Host`` (unbuffered, errno mapped once).

Mechanism (the planner's documented choice, see ``hostd.plan``): hostd never moves a process
out of the cgroup it lives in, because on v2 that would change every controller of the process
(its memory limit, its io weight) and confuse whoever manages it (systemd, a container runtime).
It only changes which cpuset a *thread* is in. (The one process hostd moves is a demoted one
of the root cpu cgroup, into ``/hostd.demoted`` and back: ``hostd.sched.group``.)

* **v1**: hostd keeps its own cgroups ``/hostd/<layer>`` in the cpuset hierarchy and moves
  threads that sit in the root cpuset into them, thread by thread (v1's ``tasks`` file takes one
  tid per write). A v1 cpuset hierarchy only places CPUs and memory, so the move changes nothing
  else; threads in someone else's cpuset (docker, kubelet) are left where they are.
* **v2**: a *threaded subtree* inside the job's own cgroup G: ``G/hostd.<layer>``, of
  ``cgroup.type`` threaded, with the layer's CPUs and memory nodes. G becomes the thread root
  and keeps every domain controller (memory, io, pids) of its processes; only the cpuset of
  the moved threads changes, so one process's threads can be split between layers. hostd
  enables ``cpuset`` in ``cgroup.subtree_control`` from the root down to G where it is not on
  (each of those writes is journaled). hostd leaves alone a G that has child cgroups of its own
  (someone's delegated subtree), and the kernel refuses a threaded child where G cannot be a
  thread root (domain controllers enabled for its children): either is reported, and those
  threads keep their thread affinity, which applies everywhere.
  Partitions are not used: a partition root must be the child of a partition root, so it could
  only hold processes moved out of their cgroups.

Knobs: ``cgroup/cpuset/<path>`` = ``{"cpus": "0-3", "mems": "0"}`` or None (absent), for
``/hostd``, ``/hostd/<layer>`` (v1) and ``G/hostd.<layer>`` (v2); ``cgroup/subtree/<path>`` =
whether ``cpuset`` is enabled in that v2 cgroup's ``cgroup.subtree_control``;
``task/TID@START/cpuset`` = the thread's cpuset cgroup path. Removing a cgroup (None) first
moves whatever is left in it back to its home (the v1 root cpuset, or G on v2).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os

from hostd import knobs
from hostd.host import Gone, Host, HostError
from hostd.host.cgroupfs import read_cgroup_layout
from hostd.model.cpus import CPUSET_ROOT, V2_PREFIX, format_cpulist, home_of, parse_cpulist


def cpuset_key(path: str) -> str:
    """The knob of a hostd-owned cpuset cgroup at ``path`` ("/hostd/trainer", "/a/hostd.x")."""
    return "cgroup/cpuset" + path


def subtree_key(path: str) -> str:
    """The knob "cpuset is enabled for the children of v2 cgroup ``path``" ("/" is the root)."""
    return "cgroup/subtree" + path


def group_key(layer: str | None = None) -> str:
    """The knob of v1's ``/hostd`` (no layer) or ``/hostd/<layer>``."""
    return cpuset_key(CPUSET_ROOT + (f"/{layer}" if layer else ""))


@functools.lru_cache(maxsize=16)
def _hierarchy(root: str) -> tuple[str, str] | None:
    """("v1" or "v2", its mount point relative to ``root``) of the cpuset controller, read once
    (a pass moves thousands of threads)."""
    layout = read_cgroup_layout(Host(root))
    if layout.cpuset == "v1":
        return "v1", str(layout.v1_mount("cpuset")).lstrip("/")
    if layout.cpuset == "v2" and layout.v2_mount is not None:
        return "v2", layout.v2_mount.lstrip("/")
    return None


def _where(host: Host, key: str) -> tuple[str, str]:
    found = _hierarchy(host.root)
    if found is None:
        raise HostError(errno.EOPNOTSUPP, key, "no cpuset controller (cgroup v1 or v2)")
    return found


def _group_path(key: str) -> str:
    """ "cgroup/cpuset/hostd/trainer" -> "/hostd/trainer", "cgroup/subtree" + "/" -> "/"."""
    return knobs.parse_key(key).ident


def _read_group(host: Host, key: str) -> dict | None:
    _, mount = _where(host, key)
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
    version, mount = _where(host, key)
    path = _group_path(key)
    if version == "v2":
        _write_group_v2(host, key, mount, path, value)
        return
    base = f"{mount}{path.rstrip('/')}"
    if value is None:
        _evacuate(host, mount, path)
        host.rmdir(base)
        return
    assert isinstance(value, dict)
    parent = os.path.dirname(path.rstrip("/"))
    if not host.exists(f"{mount}{parent}"):
        raise Gone(errno.ENOENT, key, f"parent cgroup {parent} is missing")
    host.mkdir(base)
    # A v1 cpuset takes tasks only once both are set; mems first so cpus can follow.
    host.write(f"{base}/cpuset.mems", value["mems"])
    host.write(f"{base}/cpuset.cpus", value["cpus"])


def _write_group_v2(host: Host, key: str, mount: str, path: str, value: object) -> None:
    base = f"{mount}{path}"
    if value is None:
        if host.exists(base):
            home = home_of(path)
            for tid in (host.read_quiet(f"{base}/cgroup.threads") or "").split():
                with contextlib.suppress(Gone):
                    host.write(f"{mount}{home.rstrip('/')}/cgroup.threads", tid)
            host.rmdir(base)
        return
    assert isinstance(value, dict)
    home = os.path.dirname(base)
    if not host.exists(home):
        raise Gone(errno.ENOENT, key, f"its home cgroup {home_of(path)} is gone")
    if not host.exists(base):
        # A cgroup that has children of its own is someone's subtree (a delegated service, a
        # container runtime): hostd leaves it alone rather than make it a thread root.
        others = [
            name
            for name in host.listdir(home)
            if not name.startswith(V2_PREFIX) and host.exists(f"{home}/{name}/cgroup.type")
        ]
        if others:
            raise HostError(
                errno.EOPNOTSUPP,
                key,
                f"{home_of(path)} has child cgroups of its own ({', '.join(sorted(others)[:3])}):"
                " hostd does not make it a thread root",
            )
    if host.mkdir(base):
        try:
            host.write(f"{base}/cgroup.type", "threaded")
        except HostError as exc:
            host.rmdir(base)
            raise HostError(
                exc.errno,
                key,
                f"{home_of(path)} cannot hold threaded children ({exc.strerror}): it has "
                "child cgroups with processes, or domain controllers enabled for its children",
            ) from None
    host.write(f"{base}/cpuset.mems", value["mems"])
    host.write(f"{base}/cpuset.cpus", value["cpus"])


def _evacuate(host: Host, mount: str, path: str) -> None:
    """Move every thread left in v1 ``path`` (and below) back to the root cpuset."""
    for child in host.listdir(f"{mount}{path}"):
        if host.exists(f"{mount}{path}/{child}/tasks"):
            _evacuate(host, mount, f"{path}/{child}")
    for line in (host.read_quiet(f"{mount}{path}/tasks") or "").split():
        with contextlib.suppress(Gone):
            host.write(f"{mount}/tasks", line)


def _read_subtree(host: Host, key: str) -> bool:
    _, mount = _where(host, key)
    text = host.read(f"{mount}{_group_path(key).rstrip('/')}/cgroup.subtree_control")
    if text is None:
        raise Gone(errno.ENOENT, key, "the cgroup is gone")
    return "cpuset" in text.split()


def _write_subtree(host: Host, key: str, value: object) -> None:
    _, mount = _where(host, key)
    path = _group_path(key).rstrip("/")
    try:
        host.write(f"{mount}{path}/cgroup.subtree_control", "+cpuset" if value else "-cpuset")
    except HostError as exc:
        if value or exc.errno != errno.EBUSY:
            raise
        # Someone else's cgroups below now use the controller hostd turned on: it stays on for
        # them, and hostd's record of it is closed (as for a knob that is gone).
        raise Gone(errno.EBUSY, key, "cpuset is in use below by other cgroups: left on") from None


def _read_member(host: Host, key: str) -> str:
    version, _ = _where(host, key)
    tid = knobs.live_tid(host, key)
    cgroups = host.cgroups(tid, strict=True)
    if cgroups is None:
        raise Gone(errno.ESRCH, key, "the thread exited")
    return cgroups.get("cpuset" if version == "v1" else "", "/")


def _write_member(host: Host, key: str, value: object) -> None:
    version, mount = _where(host, key)
    tid = knobs.live_tid(host, key)
    path = str(value).rstrip("/")
    host.write(f"{mount}{path}/{'tasks' if version == 'v1' else 'cgroup.threads'}", str(tid))


def _check_group(value: object) -> str | None:
    """None (hostd created the cgroup) or {"cpus": CPU list, "mems": node list}."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"cpus", "mems"}:
        return f"{value!r} is not a cpuset (cpus, mems)"
    return knobs.CHECKS["cpulist"](value["cpus"]) or knobs.CHECKS["cpulist"](value["mems"])


def _check_subtree(value: object) -> str | None:
    return None if type(value) is bool else f"{value!r} is not true or false"


def _check_group_key(key: knobs.KnobKey) -> str | None:
    """cpuset groups are hostd's own: /hostd[/LAYER] (v1), .../hostd.LAYER (v2)."""
    names = [n for n in key.ident.split("/") if n]
    if names and (names[0] == "hostd" or names[-1].startswith("hostd.")):
        return None
    return "not a cgroup hostd creates"


SUBTREE = knobs.Spec(
    "subtree",
    "cgroup/subtree/PATH",
    _read_subtree,
    _write_subtree,
    _check_subtree,
    noun="cpuset controller enabled below a v2 cgroup",
    apply_order=-1,  # the controller before the cgroups
    restore_phase=3,  # disabled last, from the deepest cgroup up
    needs="cpuset",
)
GROUP = knobs.Spec(
    "cgroup",
    "cgroup/cpuset/PATH",
    _read_group,
    _write_group,
    _check_group,
    noun="hostd's cpuset cgroup",
    apply_order=0,  # the cgroups before the threads that go in them
    restore_phase=2,  # removed once empty
    needs="cpuset",
    check_key=_check_group_key,
)
MEMBER = knobs.Spec(
    "cpuset",
    "task/TID@START/cpuset",
    _read_member,
    _write_member,
    knobs.cgroup_path_problem,
    noun="thread cpuset cgroup",
    apply_order=1,  # membership before affinity (joining a cpuset resets affinity)
    restore_phase=0,  # threads rejoin their cgroup before their affinity is restored
    per_task=True,
    needs="cpuset",
)


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

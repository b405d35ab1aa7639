"""The CPU weight of a whole cgroup: the knob of preemptible work that lives in a cgroup of its own.

CFS shares the CPUs between sibling cgroups by the cgroups' weights first, and only then between
the threads inside each (BENCHMARKS.md, "Which mechanism makes busy work yield"): a SCHED_IDLE
thread or a session's autogroup weight acts only inside its cgroup, so busy work in another
scope, container or Slurm step keeps its cgroup's full share against the job. Its cgroup's own
weight is what reaches it: ``cpu.idle = 1`` (kernel 5.15+, v2 and v1 alike: the whole group
competes as SCHED_IDLE; it measured best on both), else the least ``cpu.weight`` (1, v2) or
``cpu.shares`` (2, v1).

Key ``cgroup/cpu/<path>``: ``<path>`` is the cgroup in the hierarchy of the cpu controller (the
v1 ``cpu`` mount, else the v2 one). Value ``{"ino": N, "file": "cpu.idle", "value": 0}``: the
cgroup's inode is the kernel's identity of it, so a write (a restore too) goes only to the very
cgroup whose value was read, never to one made again under the same path. ``hostd.agent.weights``
decides which cgroups (``hostd.preempt.why_group_kept``) and journals them; it moves no process
out of its cgroup, except out of the root into hostd's own ``/hostd.demoted`` (below).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import time

from hostd import knobs
from hostd.host import Gone, Host, HostError, paths
from hostd.host.parsers import parse_mountinfo_cgroups

PREFIX = "cgroup/cpu"
# file -> (the value that makes a group yield, the range a value of it may hold)
SETTINGS = {
    "cpu.idle": (1, (0, 1)),
    "cpu.weight": (1, (1, 10000)),
    "cpu.shares": (2, (2, 262144)),
}


def key_of(path: str) -> str:
    """The knob of cgroup ``path`` ("/user.slice/x.scope") in the cpu controller's hierarchy."""
    return PREFIX + path


@functools.lru_cache(maxsize=16)
def mount(root: str) -> tuple[int, str] | None:
    """(cgroup version, mount point relative to ``root``) of the cpu controller, read once."""
    mounts = parse_mountinfo_cgroups(Host(root).read_quiet(paths.SELF_MOUNTINFO) or "")
    for m in mounts:
        if m.version == 1 and "cpu" in m.controllers:
            return 1, m.mount_point.lstrip("/")
    for m in mounts:
        if m.version == 2:
            return 2, m.mount_point.lstrip("/")
    return None


def _dir(host: Host, key: str) -> tuple[int, str]:
    found = mount(host.root)
    if found is None:
        raise HostError(errno.EOPNOTSUPP, key, "no cpu controller (cgroup v1 or v2)")
    version, where = found
    return version, f"{where}/{knobs.parse_key(key).ident.strip('/')}"


def _file(host: Host, key: str, version: int, rel: str) -> str:
    names = ("cpu.idle", "cpu.shares") if version == 1 else ("cpu.idle", "cpu.weight")
    for name in names:
        if host.exists(f"{rel}/{name}"):
            return name
    raise HostError(errno.EOPNOTSUPP, key, "the cpu controller is not enabled for this cgroup")


def read(host: Host, key: str) -> dict:
    version, rel = _dir(host, key)
    ino = host.inode(rel)
    if ino is None:
        raise Gone(errno.ENOENT, key, "the cgroup is gone")
    name = _file(host, key, version, rel)
    text = host.read_line(f"{rel}/{name}")
    if text is None:
        raise Gone(errno.ENOENT, key, "the cgroup is gone")
    try:
        return {"ino": ino, "file": name, "value": int(text)}
    except ValueError:
        raise HostError(errno.EINVAL, key, f"unexpected {name} value {text!r}") from None


def yielding(current: dict) -> dict:
    """The value of a cgroup that yields to every other (same cgroup, same file)."""
    return {**current, "value": SETTINGS[current["file"]][0]}


def _target(host: Host, key: str, value: object, problem: str | None) -> tuple[int, str]:
    """(cgroup version, the cgroup's folder) to write checked ``value`` to: only the very
    cgroup whose inode the value carries."""
    if problem:
        raise HostError(errno.EINVAL, key, problem)
    assert isinstance(value, dict)
    version, rel = _dir(host, key)
    if host.inode(rel) != value["ino"]:
        raise Gone(errno.ENOENT, key, "the cgroup is gone (or was made again: another cgroup)")
    return version, rel


def write(host: Host, key: str, value: object) -> None:
    _, rel = _target(host, key, value, check(value))
    assert isinstance(value, dict)
    host.write(f"{rel}/{value['file']}", str(value["value"]))


def check(value: object) -> str | None:
    if not isinstance(value, dict) or set(value) != {"ino", "file", "value"}:
        return f"{value!r} is not a cgroup CPU weight (ino, file, value)"
    setting = SETTINGS.get(value["file"])  # type: ignore[call-overload]
    ino, number = value["ino"], value["value"]
    if setting is None:
        return f"{value['file']!r} is not one of {', '.join(SETTINGS)}"
    lo, hi = setting[1]
    if type(ino) is not int or ino < 0 or type(number) is not int or not lo <= number <= hi:
        return f"{value!r}: an inode number and a {value['file']} value in {lo}..{hi}"
    return None


def _check_key(key: knobs.KnobKey) -> str | None:
    return "hostd never weighs the root cgroup" if key.ident.strip("/") == "" else None


GROUP_CPU = knobs.Spec(
    "group_cpu",
    "cgroup/cpu/PATH",
    read,
    write,
    check,
    noun="CPU weight of a demoted cgroup",
    apply_order=99,  # the agent writes it (hostd.agent.weights), never a pass
    agent_owned=True,
    check_key=_check_key,
)


# -- the most a demoted cgroup may take: its CFS bandwidth -----------------------------------
# ``cpu.idle`` makes a cgroup yield to its siblings only: a container under system.slice still
# takes system.slice's whole share against a job in the root cgroup (BENCHMARKS.md, "A node
# with its infrastructure"), and only a weight on the job's side (its sessions' autogroup)
# outweighs it, which every other slice then pays for, the node's own included. A quota acts
# wherever the cgroup sits: ``cpu.max`` (v2) or ``cpu.cfs_quota_us`` (v1) caps what the cgroup
# and everything below it run per period, so a capped cgroup needs no one outweighed.
# Key ``cgroup/cpumax/<path>``; value ``{"ino": N, "quota": Q, "period": P}`` in microseconds,
# Q -1 for "max" (no cap).
MAX_PREFIX = "cgroup/cpumax"


def max_key(path: str) -> str:
    """The cap knob of cgroup ``path`` in the cpu controller's hierarchy."""
    return MAX_PREFIX + path


def _max_files(version: int) -> tuple[str, str]:
    return ("cpu.max", "cpu.max") if version == 2 else ("cpu.cfs_quota_us", "cpu.cfs_period_us")


def read_max(host: Host, key: str) -> dict:
    version, rel = _dir(host, key)
    ino = host.inode(rel)
    if ino is None:
        raise Gone(errno.ENOENT, key, "the cgroup is gone")
    quota_file, period_file = _max_files(version)
    if not host.exists(f"{rel}/{quota_file}"):
        raise HostError(errno.EOPNOTSUPP, key, "no CPU bandwidth control for this cgroup")
    quota_text, period_text = host.read_line(f"{rel}/{quota_file}"), None
    if quota_text is not None and version == 2:
        quota_text, _, period_text = quota_text.partition(" ")
    elif quota_text is not None:
        period_text = host.read_line(f"{rel}/{period_file}")
    if quota_text is None or period_text is None:
        raise Gone(errno.ENOENT, key, "the cgroup is gone")
    try:
        quota = -1 if quota_text == "max" else int(quota_text)
        return {"ino": ino, "quota": quota, "period": int(period_text)}
    except ValueError:
        raise HostError(
            errno.EINVAL, key, f"unexpected quota {quota_text!r} {period_text!r}"
        ) from None


def capped(current: dict, cpus: float) -> dict:
    """The same cgroup's value that lets it run ``cpus`` CPUs at most (its period kept), or the
    current one where that is already less."""
    quota = max(1000, round(cpus * current["period"]))
    if 0 <= current["quota"] <= quota:
        return dict(current)
    return {**current, "quota": quota}


def write_max(host: Host, key: str, value: object) -> None:
    version, rel = _target(host, key, value, check_max(value))
    assert isinstance(value, dict)
    quota = "max" if value["quota"] < 0 else str(value["quota"])
    if version == 2:
        host.write(f"{rel}/cpu.max", f"{quota} {value['period']}")
        return
    host.write(f"{rel}/cpu.cfs_quota_us", "-1")  # a period below the quota is refused: first
    host.write(f"{rel}/cpu.cfs_period_us", str(value["period"]))
    if value["quota"] >= 0:
        host.write(f"{rel}/cpu.cfs_quota_us", quota)


def check_max(value: object) -> str | None:
    if not isinstance(value, dict) or set(value) != {"ino", "quota", "period"}:
        return f"{value!r} is not a cgroup CPU quota (ino, quota, period)"
    ino, quota, period = value["ino"], value["quota"], value["period"]
    if any(type(v) is not int for v in (ino, quota, period)) or ino < 0:
        return f"{value!r}: an inode number, a quota and a period in microseconds"
    if not 1000 <= period <= 1_000_000 or not (quota == -1 or quota >= 1000):
        return f"{value!r}: a period of 1000..1000000 us and a quota of -1 (max) or 1000 us up"
    return None


GROUP_MAX = knobs.Spec(
    "group_max",
    "cgroup/cpumax/PATH",
    read_max,
    write_max,
    check_max,
    noun="CPU quota of a demoted cgroup",
    apply_order=99,  # the agent writes it (hostd.agent.weights), never a pass
    agent_owned=True,
    check_key=_check_key,
)

# -- hostd's own cgroup for demoted work that sits in the root cgroup ---------------------------
# Autogroups (a session's weight) apply only in the root cpu cgroup, and an autogroup never
# competes as idle: a job thread that wakes waits for a demoted session's slice to end
# (measured: wake-up p99 0.61 ms, p99.9 3.5 ms against busy loops, against 0.12 and 0.47 ms with
# the loops in a cgroup with cpu.idle = 1; BENCHMARKS.md, "The I/O cell"). So a demoted
# session's processes that sit in the root cpu cgroup are moved into one cgroup of hostd's own,
# /hostd.demoted, with ``cpu.idle = 1`` (else the least weight). Only processes of the root
# are ever moved into it, so the root is where every process in it goes back: removing it (a
# release, a stop, ``hostd restore`` after a crash) first moves every process left in it,
# children born in it included, back to the root.
HOME = "/hostd.demoted"
HOME_PREFIX = "cgroup/cpuhome"
HOME_KEY = HOME_PREFIX + HOME


def home_dir(host: Host) -> tuple[int, str, str]:
    """(cgroup version, the cpu hierarchy's mount, hostd's cgroup in it), relative to root."""
    version, rel = _dir(host, HOME_KEY)
    return version, rel[: -len(HOME)], rel


def _read_home(host: Host, key: str) -> bool | None:
    _, _, rel = home_dir(host)
    return True if host.inode(rel) is not None else None


def _write_home(host: Host, key: str, value: object) -> None:
    version, mount, rel = home_dir(host)
    if value is None:
        if host.inode(rel) is None:
            return
        # A process may fork while it is moved, and one that is exiting keeps the cgroup busy
        # (EBUSY) for a moment after it has left cgroup.procs: empty it until it can go.
        for attempt in range(40):
            for pid in (host.read_quiet(f"{rel}/cgroup.procs") or "").split():
                with contextlib.suppress(Gone):
                    host.write(f"{mount}/cgroup.procs", pid)
            try:
                host.rmdir(rel)
                return
            except HostError as exc:
                if exc.errno != errno.EBUSY or attempt == 39:
                    raise
                time.sleep(0.025)
        return
    if value is not True:
        raise HostError(errno.EINVAL, key, f"{value!r} is not true or none")
    made = host.mkdir(rel)
    try:
        name = _file(host, key, version, rel)
        host.write(f"{rel}/{name}", str(SETTINGS[name][0]))
    except HostError:
        if made:
            with contextlib.suppress(HostError):
                host.rmdir(rel)
        raise


def _check_home(value: object) -> str | None:
    return None if value is None or value is True else f"{value!r} is not true or none"


def _check_home_key(key: knobs.KnobKey) -> str | None:
    return None if key.ident == HOME else f"hostd's cgroup for demoted work is {HOME}"


DEMOTED_HOME = knobs.Spec(
    "demoted_home",
    HOME_PREFIX + "/PATH",
    _read_home,
    _write_home,
    _check_home,
    noun="hostd's cgroup (cpu.idle) for demoted processes of the root cgroup",
    apply_order=99,  # the agent writes it (hostd.agent.weights), never a pass
    restore_phase=2,  # after the threads' and sessions' own records
    agent_owned=True,
    host_wide=True,  # a cgroup at the root of the host's hierarchy: never from a sidecar
    check_key=_check_home_key,
)

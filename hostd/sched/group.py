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
decides which cgroups (``hostd.preempt.why_group_kept``) and journals them; it never moves a
process out of its cgroup.
"""

from __future__ import annotations

import errno
import functools

from hostd import knobs
from hostd.host import Gone, Host, HostError
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
    mounts = parse_mountinfo_cgroups(Host(root).read_quiet("proc/self/mountinfo") or "")
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


def write(host: Host, key: str, value: object) -> None:
    problem = check(value)
    if problem:
        raise HostError(errno.EINVAL, key, problem)
    assert isinstance(value, dict)
    _, rel = _dir(host, key)
    if host.inode(rel) != value["ino"]:
        raise Gone(errno.ENOENT, key, "the cgroup is gone (or was made again: another cgroup)")
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

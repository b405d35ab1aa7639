"""Pure parsers for /proc and /sys file contents; no I/O here.

Each function takes the text of one kernel file and returns plain values. Formats follow
proc(5) (``/proc/stat``, ``/proc/PID/cgroup``, ``mountinfo``, ``interrupts``), PSI files and
the sysfs ABI documents under Documentation/ABI; also the node's managers' records that the
node model reads (a container runtime's OCI spec, a logind session). A thread's own files
(``/proc/PID/task/TID/stat``, ``status``, ``schedstat``, ``syscall``, ``io``) are parsed in
``taskparsers.py`` and re-exported here. Called by ``hostd.host.Host`` readers, by the
topology and task snapshot builders and by ``hostd.stats``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple

from hostd.host import paths
from hostd.host.taskparsers import PF_KTHREAD as PF_KTHREAD
from hostd.host.taskparsers import Schedstat as Schedstat
from hostd.host.taskparsers import Stat as Stat
from hostd.host.taskparsers import Status as Status
from hostd.host.taskparsers import parse_involuntary as parse_involuntary
from hostd.host.taskparsers import parse_io_writes as parse_io_writes
from hostd.host.taskparsers import parse_schedstat as parse_schedstat
from hostd.host.taskparsers import parse_stat as parse_stat
from hostd.host.taskparsers import parse_status as parse_status
from hostd.host.taskparsers import parse_syscall as parse_syscall
from hostd.host.taskparsers import split_stat as split_stat


def parse_cpu_times(text: str) -> dict[int, tuple[int, int]]:
    """Each CPU's (busy, total) ticks since boot from /proc/stat's ``cpuN`` lines: busy is
    user, nice, system, irq and softirq; total adds idle, iowait and steal (time a hypervisor
    took is not the CPU's work)."""
    out = {}
    for line in text.split("\n", 4096):
        if not line.startswith("cpu"):
            if out:
                break  # the cpuN lines come first, together
            continue
        fields = line.split(None, 9)
        if len(fields) < 9 or fields[0] == "cpu":
            continue
        try:
            cpu = int(fields[0][3:])
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
        except ValueError:
            continue
        busy = user + nice + system + irq + softirq
        out[cpu] = (busy, busy + idle + iowait + steal)
    return out


def parse_pressure(text: str) -> tuple[int, int] | None:
    """(some, full) ``total=`` microseconds of a PSI file (``cpu.pressure``); None if neither."""
    got = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            if field.startswith("total=") and field[6:].isdigit():
                got[kind] = int(field[6:])
    if not got:
        return None
    return got.get("some", 0), got.get("full", 0)


def parse_cgroup(text: str) -> dict[str, str]:
    """Parse /proc/PID/cgroup into {controller-or-hierarchy: path}.

    v1 lines look like ``4:memory:/a`` or ``9:name=systemd:/a`` (one key per controller); the v2
    line is ``0::/a`` and is returned under the key ``""``.
    """
    result: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            result[""] = path
            continue
        for name in controllers.split(","):
            result[name] = path
    return result


def primary_cgroup(cgroups: dict[str, str]) -> str:
    """The one cgroup path that policies match on.

    The v2 path when it says anything (pure v2, or hybrid with systemd using the unified tree);
    else systemd's named v1 hierarchy; else the v1 cpuset, cpu or memory path; else "/".
    """
    for key in ("", "name=systemd", "cpuset", "cpu", "memory"):
        path = cgroups.get(key)
        if path and path != "/":
            return path
    for path in cgroups.values():
        if path and path != "/":
            return path
    return "/"


@dataclass(frozen=True, slots=True)
class CgroupMount:
    """One cgroup filesystem mount from /proc/self/mountinfo."""

    mount_point: str  # absolute path as the kernel shows it
    version: int  # 1 or 2
    controllers: tuple[str, ...]  # v1: the controllers bound there; v2: empty here


_MOUNT_OPTIONS = {
    "rw",
    "ro",
    "relatime",
    "noatime",
    "nosuid",
    "nodev",
    "noexec",
    "xattr",
    "noprefix",
    "clone_children",
    "cpuset_v2_mode",
    "nsdelegate",
    "memory_recursiveprot",
    "favordynmods",
}


def parse_mountinfo_cgroups(text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts listed in /proc/PID/mountinfo (proc(5))."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype, options = rfields[0], rfields[2]
        # mountinfo octal-escapes space, tab, newline and backslash (proc(5)).
        mount_point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if fstype == "cgroup2":
            mounts.append(CgroupMount(mount_point, 2, ()))
        elif fstype == "cgroup":
            ctrls = tuple(
                o
                for o in options.split(",")
                if o not in _MOUNT_OPTIONS and not o.startswith("release_agent=")
            )
            mounts.append(CgroupMount(mount_point, 1, ctrls))
    return mounts


@dataclass(frozen=True, slots=True)
class InterruptLine:
    """One numbered IRQ line of /proc/interrupts."""

    irq: int
    counts: tuple[int, ...]  # per CPU column
    chip: str
    name: str  # the rest of the line: hwirq, trigger and action names


def parse_interrupts(text: str) -> list[InterruptLine]:
    """Parse /proc/interrupts; named per-CPU rows (NMI, LOC, ...) are skipped."""
    lines = text.splitlines()
    if not lines:
        return []
    ncpus = len(lines[0].split())
    result: list[InterruptLine] = []
    for line in lines[1:]:
        label, sep, rest = line.partition(":")
        label = label.strip()
        if not sep or not label.isdigit():
            continue
        fields = rest.split()
        counts = []
        for field in fields[:ncpus]:
            if not field.isdigit():
                break
            counts.append(int(field))
        tail = fields[len(counts) :]
        chip = tail[0] if tail else ""
        name = " ".join(tail[1:])
        result.append(InterruptLine(int(label), tuple(counts), chip, name))
    return result


_MINOR_RE = re.compile(r"^Device Minor:\s*(\d+)", re.MULTILINE)


def parse_nvidia_minor(text: str) -> int | None:
    """The "Device Minor" line of /proc/driver/nvidia/gpus/ADDR/information."""
    match = _MINOR_RE.search(text)
    return int(match.group(1)) if match else None


def parse_int(text: str | None, default: int | None = None) -> int | None:
    """An integer sysfs value ("-1", "0x10de", "42"), or ``default`` when absent or malformed."""
    if text is None:
        return default
    text = text.strip()
    try:
        return int(text, 0)
    except ValueError:
        return default


def parse_distance(text: str) -> tuple[int, ...]:
    """A NUMA node's ``distance`` file: one integer per node."""
    return tuple(int(x) for x in text.split())


PREEMPT_MODELS = ("none", "voluntary", "full", "lazy", "rt")
_PREEMPT_CONFIG = (  # the kernel config's choice of model (kernel/Kconfig.preempt)
    ("CONFIG_PREEMPT_RT", "rt"),
    ("CONFIG_PREEMPT_LAZY", "lazy"),
    ("CONFIG_PREEMPT", "full"),
    ("CONFIG_PREEMPT_VOLUNTARY", "voluntary"),
    ("CONFIG_PREEMPT_NONE", "none"),
)


class Preemption(NamedTuple):
    """The kernel's preemption model and where it was read."""

    model: str | None  # one of PREEMPT_MODELS; None: not known
    dynamic: bool  # PREEMPT_DYNAMIC: the model can be changed at run time (debugfs)
    source: str


def parse_preemption(
    debugfs: str | None, cmdline: str | None, config: str | None, version: str | None
) -> Preemption:
    """The preemption model, from the best source at hand: debugfs ``sched/preempt`` ("none
    voluntary (full) lazy": the current one in parentheses), the ``preempt=`` boot option, the
    kernel config (``/proc/config.gz``), or the kernel's version string ("PREEMPT_DYNAMIC",
    "PREEMPT_RT", "PREEMPT")."""
    settings = dict(
        line.split("=", 1) for line in (config or "").splitlines() if line.startswith("CONFIG_")
    )
    words = (version or "").split()
    dynamic = settings.get("CONFIG_PREEMPT_DYNAMIC") == "y" or "PREEMPT_DYNAMIC" in words
    if debugfs and (match := re.search(r"\((\w+)\)", debugfs)) and match[1] in PREEMPT_MODELS:
        return Preemption(match[1], True, "/" + paths.DEBUG_PREEMPT)
    if "PREEMPT_RT" in words or settings.get("CONFIG_PREEMPT_RT") == "y":
        return Preemption("rt", False, "the kernel config" if settings else "the kernel version")
    boot = re.search(r"(?:^|\s)preempt=(\w+)", cmdline or "")
    if dynamic and boot and boot[1] in PREEMPT_MODELS:
        return Preemption(boot[1], True, "the boot option preempt=")
    for key, model in _PREEMPT_CONFIG:
        if settings.get(key) == "y":
            return Preemption(model, dynamic, "the kernel config")
    if "PREEMPT" in words:
        return Preemption("full", False, "the kernel version")
    if version and not dynamic:
        return Preemption("none", False, "the kernel version (none or voluntary)")
    return Preemption(None, dynamic, "not readable here")


def parse_pod_spec(text: str) -> tuple[str, str, bool] | None:
    """(namespace, pod name, static) of a pod's container from its runtime's record: an OCI
    spec's ``annotations`` (containerd's CRI: ``io.kubernetes.cri.sandbox-*``; CRI-O:
    ``io.kubernetes.pod.*``, the pod's own annotations in ``io.kubernetes.cri-o.Annotations``)
    or dockerd's ``Config.Labels`` (cri-dockerd: ``io.kubernetes.pod.*``, the pod's annotations
    as ``annotation.*`` labels). A static pod is one whose ``kubernetes.io/config.source`` is
    ``file`` (the kubelet's manifests), where the runtime keeps the pod's annotations. None
    when the text says no pod."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    found: dict = {}
    for table in (doc.get("annotations"), (doc.get("Config") or {}).get("Labels")):
        if isinstance(table, dict):
            found.update({k: v for k, v in table.items() if isinstance(v, str)})
    namespace = found.get("io.kubernetes.cri.sandbox-namespace") or found.get(
        "io.kubernetes.pod.namespace", ""
    )
    name = found.get("io.kubernetes.cri.sandbox-name") or found.get("io.kubernetes.pod.name", "")
    if not namespace:
        return None
    source = found.get("annotation.kubernetes.io/config.source", "")
    if not source and found.get("io.kubernetes.cri-o.Annotations"):
        try:
            pod = json.loads(found["io.kubernetes.cri-o.Annotations"])
            source = pod.get("kubernetes.io/config.source", "") if isinstance(pod, dict) else ""
        except ValueError:
            source = ""
    return namespace, name, source == "file"


def parse_logind_session(text: str) -> tuple[str, bool, int | None]:
    """(PAM service, has a terminal, uid) of a logind session record (KEY=VALUE lines)."""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    uid = fields.get("UID", "")
    return fields.get("SERVICE", ""), bool(fields.get("TTY")), int(uid) if uid.isdigit() else None

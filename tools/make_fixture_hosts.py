#!/usr/bin/env python3
"""Generate the synthetic fixture host trees ``dgx-h100``, ``amd-mi300x``, ``gaudi2`` and ``trn1``.

Usage::

    python3 tools/make_fixture_hosts.py [OUT]     # OUT defaults to tests/fixtures/hosts

Each tree holds the same files, at the same relative paths, as one written by
``tools/capture_host.py`` from a live machine, so ``hostd.host.Host(tree)`` reads it like a
kernel. The machines are scaled down so that golden files stay readable:

- ``dgx-h100``: 2 sockets x 16 cores x 2 threads (x86 numbering: CPU i and i+32 are siblings),
  one L3 per socket, intel_pstate, 8 NVIDIA H100 (NVML snapshot in nvml.json) plus 4 NVSwitches
  and an ASPEED BMC, two ConnectX-7 NICs, pure cgroup v2, and a torchrun job with 2 ranks.
- ``amd-mi300x``: 2 sockets x 12 cores x 2 threads (CPU i and i+24), one L3 per 4-core CCX,
  amd-pstate-epp, 8 AMD Instinct MI300X (sysfs only), one Broadcom NIC, hybrid cgroups (v1
  controllers plus an empty v2 hierarchy at /sys/fs/cgroup/unified), and a ROCm training job in
  a Kubernetes pod (cgroupfs driver).
- ``gaudi2``: 2 x 8 x 2, 8 Intel Gaudi 2 through the kernel's accel subsystem, a Slurm job.
- ``trn1``: 2 x 8 x 2, 4 AWS Trainium devices (/dev/neuronN; the driver does not say which PCI
  device each is), a torchrun job in a Kubernetes pod (systemd driver).

The output is deterministic: running this twice gives byte-identical trees. File formats follow
proc(5) and the sysfs ABI documents; see tests/fixtures/hosts/README.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "hosts")

# /proc/PID/stat flags (include/linux/sched.h).
PF_FORKNOEXEC = 0x00000040
PF_SUPERPRIV = 0x00000100
PF_NOFREEZE = 0x00008000
PF_KTHREAD = 0x00200000
PF_RANDOMIZE = 0x00400000
PF_WQ_WORKER = 0x00000020
PF_NO_SETAFFINITY = 0x04000000
USER_FLAGS = PF_RANDOMIZE | PF_SUPERPRIV  # 4194560, as ps shows for a plain process
KTHREAD_FLAGS = PF_KTHREAD | PF_NOFREEZE | PF_FORKNOEXEC  # kthreadd: 2129984
PERCPU_KTHREAD_FLAGS = KTHREAD_FLAGS | PF_NO_SETAFFINITY  # ksoftirqd, migration: 69238848
WORKER_FLAGS = PERCPU_KTHREAD_FLAGS | PF_WQ_WORKER  # kworker/N:M: 69238880

SCHED_OTHER, SCHED_FIFO = 0, 1
ULONG_MAX = 18446744073709551615


# -- small helpers --------------------------------------------------------------------------------
def cpulist(cpus: Iterable[int]) -> str:
    """The kernel's list format ("0-15,32-47")."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def cpumask(cpus: Iterable[int], nbits: int) -> str:
    """The kernel's mask format: 32-bit hex words, most significant first ("ffffffff,ffffffff")."""
    value = sum(1 << c for c in set(cpus))
    words = max(1, (nbits + 31) // 32)
    return ",".join(f"{(value >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))


class Tree:
    """A fixture tree being written; ``rel`` paths are relative to its root."""

    def __init__(self, root: str) -> None:
        self.root = root
        if os.path.isdir(root):
            shutil.rmtree(root)
        os.makedirs(root)

    def _path(self, rel: str) -> str:
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def write(self, rel: str, text: str, newline: bool = True) -> None:
        with open(self._path(rel), "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text + ("\n" if newline else ""))

    def raw(self, rel: str, data: bytes) -> None:
        with open(self._path(rel), "wb") as fh:
            fh.write(data)

    def mark(self, rel: str) -> None:
        """A directory entry that hostd only lists (msi_irqs/N, drm/cardN): an empty file."""
        self.raw(rel, b"")

    def link(self, rel: str, target: str) -> None:
        os.symlink(target, self._path(rel))


# -- CPUs, caches, cpufreq, NUMA ------------------------------------------------------------------
@dataclass(frozen=True)
class CpuLayout:
    sockets: int
    cores_per_socket: int
    threads: int
    cores_per_llc: int

    @property
    def ncores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def ncpus(self) -> int:
        return self.ncores * self.threads

    def cpu(self, socket: int, core: int, thread: int) -> int:
        """x86 numbering: all first threads of every core, then all second threads."""
        return thread * self.ncores + socket * self.cores_per_socket + core

    def socket_cpus(self, socket: int) -> list[int]:
        return sorted(
            self.cpu(socket, c, t)
            for c in range(self.cores_per_socket)
            for t in range(self.threads)
        )

    @property
    def all_cpus(self) -> list[int]:
        return list(range(self.ncpus))


@dataclass(frozen=True)
class Freq:
    driver: str
    governor: str
    governors: str
    epp: str
    epps: str
    hw_min: int
    hw_max: int


def write_cpus(tree: Tree, layout: CpuLayout, freq: Freq) -> None:
    base = "sys/devices/system/cpu/"
    everything = cpulist(layout.all_cpus)
    for name in ("online", "possible", "present"):
        tree.write(base + name, everything)
    for socket in range(layout.sockets):
        for core in range(layout.cores_per_socket):
            siblings = [layout.cpu(socket, core, t) for t in range(layout.threads)]
            ccx = core // layout.cores_per_llc
            llc = [
                layout.cpu(socket, c, t)
                for c in range(ccx * layout.cores_per_llc, (ccx + 1) * layout.cores_per_llc)
                for t in range(layout.threads)
            ]
            for cpu in siblings:
                d = f"{base}cpu{cpu}/"
                tree.write(d + "topology/core_id", str(core))
                tree.write(d + "topology/physical_package_id", str(socket))
                tree.write(d + "topology/die_id", "0")
                tree.write(d + "topology/core_cpus_list", cpulist(siblings))
                tree.write(d + "topology/thread_siblings_list", cpulist(siblings))
                caches = (
                    (1, "Data", siblings),
                    (1, "Instruction", siblings),
                    (2, "Unified", siblings),
                    (3, "Unified", llc),
                )
                for index, (level, ctype, shared) in enumerate(caches):
                    tree.write(f"{d}cache/index{index}/level", str(level))
                    tree.write(f"{d}cache/index{index}/type", ctype)
                    tree.write(f"{d}cache/index{index}/shared_cpu_list", cpulist(shared))
                f = d + "cpufreq/"
                tree.write(f + "scaling_driver", freq.driver)
                tree.write(f + "scaling_governor", freq.governor)
                tree.write(f + "scaling_available_governors", freq.governors)
                tree.write(f + "scaling_min_freq", str(freq.hw_min))
                tree.write(f + "scaling_max_freq", str(freq.hw_max))
                tree.write(f + "cpuinfo_min_freq", str(freq.hw_min))
                tree.write(f + "cpuinfo_max_freq", str(freq.hw_max))
                tree.write(f + "energy_performance_preference", freq.epp)
                tree.write(f + "energy_performance_available_preferences", freq.epps + " ")


def write_nodes(
    tree: Tree, node_cpus: Sequence[Sequence[int]], distances: Sequence[str], mem_kb: int
) -> None:
    base = "sys/devices/system/node/"
    nodes = cpulist(range(len(node_cpus)))
    tree.write(base + "online", nodes)
    tree.write(base + "possible", nodes)
    for nid, cpus in enumerate(node_cpus):
        d = f"{base}node{nid}/"
        tree.write(d + "cpulist", cpulist(cpus))
        tree.write(d + "distance", distances[nid])
        free = mem_kb * 9 // 10 - nid * 1_048_576
        lines = [
            ("MemTotal", mem_kb),
            ("MemFree", free),
            ("MemUsed", mem_kb - free),
            ("SwapCached", 0),
            ("Active", 12_582_912 + nid * 4096),
            ("Inactive", 8_388_608 + nid * 4096),
            ("FilePages", 16_777_216),
            ("AnonPages", 4_194_304 + nid * 8192),
            ("HugePages_Total", 0),
            ("HugePages_Free", 0),
        ]
        text = "\n".join(
            f"Node {nid} {key + ':':<16}{value:>15}" + ("" if key.startswith("Huge") else " kB")
            for key, value in lines
        )
        tree.write(d + "meminfo", text)


# -- PCI, NICs, IRQs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pci:
    addr: str
    vendor: int
    device: int
    pci_class: int
    node: int  # -1: the firmware did not say
    local_cpus: Sequence[int]
    msi: Sequence[int] = ()
    drm: Sequence[str] = ()
    accel: Sequence[str] = ()  # the kernel's accel subsystem: accel/accelN


def write_pci(tree: Tree, dev: Pci) -> None:
    d = f"sys/bus/pci/devices/{dev.addr}/"
    tree.write(d + "vendor", f"0x{dev.vendor:04x}")
    tree.write(d + "device", f"0x{dev.device:04x}")
    tree.write(d + "class", f"0x{dev.pci_class:06x}")
    tree.write(d + "numa_node", str(dev.node))
    tree.write(d + "local_cpulist", cpulist(dev.local_cpus))
    for irq in dev.msi:
        tree.mark(f"{d}msi_irqs/{irq}")
    for entry in dev.drm:
        tree.mark(f"{d}drm/{entry}")
    for entry in dev.accel:
        tree.mark(f"{d}accel/{entry}")


def write_net(tree: Tree, iface: str, device_path: str | None) -> None:
    """sys/class/net/IF: a real NIC gets a relative ``device`` link into sys/devices/...;
    a virtual one is (as in sysfs) a link into sys/devices/virtual/net, with no device link."""
    if device_path is None:
        tree.link(f"sys/class/net/{iface}", f"../../devices/virtual/net/{iface}")
        return
    tree.link(f"sys/class/net/{iface}/device", "../../../" + device_path)


@dataclass(frozen=True)
class IrqSpec:
    irq: int
    chip: str
    hwirq: str  # "2-edge", "0-edge", "524288-edge"
    name: str
    affinity: Sequence[int]
    effective: Sequence[int]
    node: int
    count: int = 0


def write_irqs(tree: Tree, ncpus: int, irqs: Sequence[IrqSpec]) -> None:
    """proc/interrupts (one column per CPU, kernel/irq/proc.c layout) and proc/irq/N/*."""
    header = "     " + "".join(f"CPU{c:<8}" for c in range(ncpus))
    lines = [header.rstrip()]
    for spec in sorted(irqs, key=lambda s: s.irq):
        counts = [0] * ncpus
        if spec.effective:
            counts[min(spec.effective)] = spec.count
        cols = "".join(f"{n:10} " for n in counts)
        lines.append(f"{spec.irq:4}: {cols} {spec.chip:>8} {spec.hwirq:<12} {spec.name}")
        d = f"proc/irq/{spec.irq}/"
        tree.write(d + "smp_affinity_list", cpulist(spec.affinity))
        tree.write(d + "effective_affinity_list", cpulist(spec.effective))
        tree.write(d + "node", str(spec.node))
    for label, text in (
        ("NMI", "Non-maskable interrupts"),
        ("LOC", "Local timer interrupts"),
        ("RES", "Rescheduling interrupts"),
        ("CAL", "Function call interrupts"),
    ):
        cols = "".join(f"{1000 + 7 * c:10} " for c in range(ncpus))
        lines.append(f" {label}: {cols}  {text}")
    lines.append(f" ERR: {0:10}")
    lines.append(f" MIS: {0:10}")
    tree.write("proc/interrupts", "\n".join(lines))


# -- tasks ----------------------------------------------------------------------------------------
@dataclass
class Thread:
    tid: int
    comm: str
    start: int = 0  # 0: the process's start time
    state: str = "S"
    utime: int = 10
    stime: int = 5
    nice: int = 0
    policy: int = SCHED_OTHER
    rt_priority: int = 0
    affinity: Sequence[int] | None = None  # None: the process's
    processor: int | None = None
    voluntary: int = 100
    nonvoluntary: int = 3


@dataclass
class Proc:
    pid: int
    ppid: int
    comm: str
    start: int
    cmdline: Sequence[str] = ()
    exe: str | None = None
    cgroup: str = "0::/\n"
    uid: int = 0
    gid: int = 0
    kthread: bool = False
    flags: int = USER_FLAGS
    affinity: Sequence[int] = ()
    nice: int = 0
    state: str = "S"
    fds: dict[int, str] = field(default_factory=dict)
    threads: list[Thread] = field(default_factory=list)  # extra threads; the leader is implicit
    pgrp: int = 0
    session: int = 0
    vm_kb: int = 0
    leader: Thread | None = None  # overrides for the leader thread
    env: dict[str, str] = field(default_factory=dict)  # written as proc/PID/environ

    def all_threads(self) -> list[Thread]:
        leader = self.leader or Thread(self.pid, self.comm)
        leader.tid = self.pid
        if leader.state == "S" and self.state != "S":
            leader.state = self.state
        return [leader, *self.threads]


_STATE_NAMES = {
    "R": "R (running)",
    "S": "S (sleeping)",
    "D": "D (disk sleep)",
    "I": "I (idle)",
    "Z": "Z (zombie)",
    "T": "T (stopped)",
}


def _stat_line(proc: Proc, t: Thread, nthreads: int, ncpus: int) -> str:
    """/proc/PID/task/TID/stat: all 52 fields of proc(5)."""
    start = t.start or proc.start
    nice = t.nice if t.nice else proc.nice
    priority = -1 - t.rt_priority if t.policy in (SCHED_FIFO, 2) else 20 + nice
    affinity = t.affinity if t.affinity is not None else proc.affinity
    processor = t.processor if t.processor is not None else min(affinity) if affinity else 0
    flags = proc.flags if t.tid == proc.pid or proc.kthread else proc.flags | PF_FORKNOEXEC
    if t.state == "Z":
        flags |= 0x00000004  # PF_EXITING
    user = not proc.kthread and t.state != "Z"
    # kthreadd has none; other threads of a group (clone(CLONE_THREAD)) have -1.
    exit_signal = 0 if proc.pid == 2 else 17 if t.tid == proc.pid or proc.kthread else -1
    vsize = proc.vm_kb * 1024 if user else 0
    rss = proc.vm_kb // 16 // 4 if user else 0  # pages of 4 KiB; VmRSS is vm_kb // 16
    code = 94_000_000_000_000 + proc.pid * 4096 if user else 0
    stack = 140_720_000_000_000 + proc.pid * 4096 if user else 0
    fields: list[object] = [
        t.tid,  # (1) pid
        f"({t.comm})",  # (2) comm
        t.state,  # (3) state
        proc.ppid,  # (4) ppid
        proc.pgrp,  # (5) pgrp
        proc.session,  # (6) session
        0,  # (7) tty_nr
        -1,  # (8) tpgid
        flags,  # (9) flags
        200 + t.utime,  # (10) minflt
        0,  # (11) cminflt
        1 if user else 0,  # (12) majflt
        0,  # (13) cmajflt
        t.utime,  # (14) utime
        t.stime,  # (15) stime
        0,  # (16) cutime
        0,  # (17) cstime
        priority,  # (18) priority
        nice,  # (19) nice
        nthreads,  # (20) num_threads
        0,  # (21) itrealvalue
        start,  # (22) starttime
        vsize,  # (23) vsize
        rss,  # (24) rss
        ULONG_MAX,  # (25) rsslim
        code,  # (26) startcode
        code + 4_000_000 if user else 0,  # (27) endcode
        stack,  # (28) startstack
        0,  # (29) kstkesp
        0,  # (30) kstkeip
        0,  # (31) signal
        0,  # (32) blocked
        0 if user else 2147483647,  # (33) sigignore
        65536 if user else 0,  # (34) sigcatch
        1 if t.state in ("S", "I", "D") else 0,  # (35) wchan
        0,  # (36) nswap
        0,  # (37) cnswap
        exit_signal,  # (38) exit_signal
        processor,  # (39) processor
        t.rt_priority,  # (40) rt_priority
        t.policy,  # (41) policy
        0,  # (42) delayacct_blkio_ticks
        0,  # (43) guest_time
        0,  # (44) cguest_time
        code + 4_200_000 if user else 0,  # (45) start_data
        code + 4_300_000 if user else 0,  # (46) end_data
        code + 9_000_000 if user else 0,  # (47) start_brk
        stack + 3000 if user else 0,  # (48) arg_start
        stack + 3100 if user else 0,  # (49) arg_end
        stack + 3100 if user else 0,  # (50) env_start
        stack + 4000 if user else 0,  # (51) env_end
        0,  # (52) exit_code
    ]
    assert len(fields) == 52
    return " ".join(str(f) for f in fields)


def _status_text(proc: Proc, t: Thread, nthreads: int, ncpus: int, nnodes: int) -> str:
    """/proc/PID/task/TID/status, in the order the kernel prints it (fs/proc/array.c)."""
    affinity = t.affinity if t.affinity is not None else proc.affinity

    def ids(value: int) -> str:  # real, effective, saved, filesystem
        return "\t".join([str(value)] * 4)

    lines = [
        f"Name:\t{t.comm}",
        "Umask:\t0022",
        f"State:\t{_STATE_NAMES[t.state]}",
        f"Tgid:\t{proc.pid}",
        "Ngid:\t0",
        f"Pid:\t{t.tid}",
        f"PPid:\t{proc.ppid}",
        "TracerPid:\t0",
        f"Uid:\t{ids(proc.uid)}",
        f"Gid:\t{ids(proc.gid)}",
        "FDSize:\t64",
        "Groups:\t ",
        f"NStgid:\t{proc.pid}",
        f"NSpid:\t{t.tid}",
        f"NSpgid:\t{proc.pgrp}",
        f"NSsid:\t{proc.session}",
        f"Kthread:\t{int(proc.kthread)}",
    ]
    if not proc.kthread and t.state != "Z":
        lines += [
            f"VmPeak:\t{proc.vm_kb + 1024:8} kB",
            f"VmSize:\t{proc.vm_kb:8} kB",
            f"VmRSS:\t{proc.vm_kb // 16:8} kB",
            f"VmData:\t{proc.vm_kb // 2:8} kB",
            "VmSwap:\t       0 kB",
        ]
    lines += [
        f"Threads:\t{nthreads}",
        "SigQ:\t0/4127485",
        "SigPnd:\t0000000000000000",
        "ShdPnd:\t0000000000000000",
        "SigBlk:\t0000000000000000",
        f"SigIgn:\t{'ffffffffffffffff' if proc.kthread else '0000000000001000'}",
        f"SigCgt:\t{'0000000000000000' if proc.kthread else '0000000180000000'}",
        "CapInh:\t0000000000000000",
        f"CapPrm:\t{'000001ffffffffff' if proc.uid == 0 else '0000000000000000'}",
        f"CapEff:\t{'000001ffffffffff' if proc.uid == 0 else '0000000000000000'}",
        "CapBnd:\t000001ffffffffff",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t0",
        "Seccomp:\t0",
        "Seccomp_filters:\t0",
        "Speculation_Store_Bypass:\tthread vulnerable",
        "SpeculationIndirectBranch:\tconditional enabled",
        f"Cpus_allowed:\t{cpumask(affinity, ncpus)}",
        f"Cpus_allowed_list:\t{cpulist(affinity)}",
        f"Mems_allowed:\t{cpumask(range(nnodes), 32)}",
        f"Mems_allowed_list:\t{cpulist(range(nnodes))}",
        f"voluntary_ctxt_switches:\t{t.voluntary}",
        f"nonvoluntary_ctxt_switches:\t{t.nonvoluntary}",
    ]
    return "\n".join(lines)


def write_proc(tree: Tree, proc: Proc, ncpus: int, nnodes: int) -> None:
    d = f"proc/{proc.pid}/"
    threads = proc.all_threads()
    live = [t for t in threads if t.state != "Z"] or threads
    leader = threads[0]
    tree.write(d + "stat", _stat_line(proc, leader, len(live), ncpus))
    tree.write(d + "comm", proc.comm)
    tree.write(d + "cgroup", proc.cgroup, newline=False)
    args = "".join(a + "\0" for a in proc.cmdline)
    tree.raw(d + "cmdline", args.encode())
    if not proc.kthread:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **proc.env}
        tree.raw(d + "environ", "".join(f"{k}={v}\0" for k, v in env.items()).encode())
    if proc.exe is not None:
        tree.link(d + "exe", proc.exe)
    for fd, target in sorted(proc.fds.items()):
        tree.link(f"{d}fd/{fd}", target)
    for t in threads:
        tree.write(f"{d}task/{t.tid}/stat", _stat_line(proc, t, len(live), ncpus))
        tree.write(f"{d}task/{t.tid}/status", _status_text(proc, t, len(live), ncpus, nnodes))


def write_procs(tree: Tree, procs: Sequence[Proc], ncpus: int, nnodes: int) -> None:
    """All processes of a tree; thread ids must be unique and every parent present."""
    tids = [t.tid for proc in procs for t in proc.all_threads()]
    assert len(tids) == len(set(tids)), "duplicate thread ids"
    pids = {proc.pid for proc in procs}
    assert all(proc.ppid in pids for proc in procs if proc.ppid), "a parent is missing"
    for proc in procs:
        write_proc(tree, proc, ncpus, nnodes)


def v2_cgroup(path: str) -> str:
    return f"0::{path}\n"


V1_HIERARCHIES = (
    "misc",
    "rdma",
    "hugetlb",
    "net_cls,net_prio",
    "perf_event",
    "pids",
    "freezer",
    "devices",
    "blkio",
    "memory",
    "cpuset",
    "cpu,cpuacct",
    "name=systemd",
)


def hybrid_cgroup(systemd: str, cpuset: str = "/", v2: str | None = None) -> str:
    """/proc/PID/cgroup on a hybrid host: v1 lines (highest id first), then the v2 line."""
    lines = []
    n = len(V1_HIERARCHIES)
    for i, name in enumerate(V1_HIERARCHIES):
        if name == "cpuset":
            path = cpuset
        elif name in ("misc", "rdma", "hugetlb", "net_cls,net_prio", "perf_event", "freezer"):
            path = "/" if systemd.startswith(("/system.slice", "/user.slice", "/init")) else systemd
        else:
            path = systemd
        lines.append(f"{n - i}:{name}:{path}")
    lines.append(f"0::{systemd if v2 is None else v2}")
    return "\n".join(lines) + "\n"


def kthreads(
    specs: Sequence[tuple[int, str, int | None, dict]],
    all_cpus: Sequence[int],
    cgroup: str = "0::/\n",
) -> list[Proc]:
    """Kernel threads from (pid, comm, bound cpu or None, extra Thread fields)."""
    procs = []
    for pid, comm, cpu, extra in specs:
        affinity = [cpu] if cpu is not None else list(all_cpus)
        flags = KTHREAD_FLAGS
        if cpu is not None:
            flags = WORKER_FLAGS if comm.startswith("kworker/") else PERCPU_KTHREAD_FLAGS
        nice = extra.pop("nice", 0)
        procs.append(
            Proc(
                pid=pid,
                ppid=0 if pid == 2 else 2,
                comm=comm,
                start=extra.pop("start", 11 if pid < 100 else 400),
                cgroup=cgroup,
                kthread=True,
                flags=flags,
                affinity=affinity,
                nice=nice,
                leader=Thread(pid, comm, nice=nice, **extra),
            )
        )
    return procs


# -- mountinfo ------------------------------------------------------------------------------------
COMMON_MOUNTS = [
    "22 29 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
    "23 29 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw",
    "24 29 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=1056405400k,mode=755",
    "29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw",
    "30 24 0:25 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,inode64",
]
V2_MOUNTS = [
    "31 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot",
]


def hybrid_mounts() -> list[str]:
    lines = [
        "31 22 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755",
        "32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - "
        "cgroup2 cgroup2 rw,nsdelegate",
        "33 31 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - "
        "cgroup cgroup rw,xattr,name=systemd",
    ]
    for i, name in enumerate(reversed(V1_HIERARCHIES[:-1])):
        mid = 36 + i
        opts = "rw," + name
        lines.append(
            f"{mid} 31 0:{mid - 3} / /sys/fs/cgroup/{name} rw,nosuid,nodev,noexec,relatime "
            f"shared:{mid - 22} - cgroup cgroup {opts}"
        )
    return lines


# -- the DGX H100-like host ----------
DGX_GPUS = (
    ("0000:18:00.0", 0),
    ("0000:2a:00.0", 0),
    ("0000:3a:00.0", 0),
    ("0000:5d:00.0", 0),
    ("0000:9a:00.0", 1),
    ("0000:ab:00.0", 1),
    ("0000:ba:00.0", 1),
    ("0000:db:00.0", 1),
)
DGX_NVSWITCHES = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
DGX_NICS = (
    # name, pci, node, msi irqs, sysfs device path (below sys/)
    (
        "ens1f0np0",
        "0000:29:00.0",
        0,
        range(100, 116),
        "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:29:00.0",
    ),
    (
        "ens2f0np0",
        "0000:aa:00.0",
        1,
        range(200, 216),
        "devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:01.0/0000:aa:00.0",
    ),
)


def gpu_uuid(host: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"hostd-fixture:{host}:gpu{index}"))


def nvidia_information(model: str, pci: str, minor: int, irq: int, host: str) -> str:
    """proc/driver/nvidia/gpus/ADDR/information as the 5xx drivers write it."""
    return (
        f"Model: \t\t {model}\n"
        f"IRQ:   \t\t {irq}\n"
        f"GPU UUID: \t {gpu_uuid(host, minor)}\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {pci}\n"
        f"Device Minor: \t {minor}\n"
        "GPU Excluded:\t No"
    )


def intel_v2_host(
    root: str, host: str, cores: int, hw_max: int
) -> tuple[Tree, CpuLayout, list[int], list[list[int]]]:
    """The base of an Intel two-socket server on pure cgroup v2: CPUs (one L3 per socket),
    intel_pstate, two NUMA nodes, its name and mounts. Returns (tree, layout, CPUs, node CPUs)."""
    tree = Tree(root)
    layout = CpuLayout(sockets=2, cores_per_socket=cores, threads=2, cores_per_llc=cores)
    node_cpus = [layout.socket_cpus(0), layout.socket_cpus(1)]
    write_cpus(
        tree,
        layout,
        Freq(
            driver="intel_pstate",
            governor="powersave",
            governors="performance powersave",
            epp="balance_performance",
            epps="default performance balance_performance balance_power power",
            hw_min=800000,
            hw_max=hw_max,
        ),
    )
    write_nodes(tree, node_cpus, ["10 21", "21 10"], mem_kb=1_056_430_728)
    tree.write("proc/sys/kernel/hostname", host)
    tree.write("proc/self/mountinfo", "\n".join(COMMON_MOUNTS + V2_MOUNTS))
    tree.write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc")
    return tree, layout, layout.all_cpus, node_cpus


def make_dgx(root: str) -> None:
    host = "dgx-h100"
    tree, layout, cpus, node_cpus = intel_v2_host(root, host, 16, 3800000)

    # PCI: GPUs, NVSwitches, the BMC's VGA, NICs, storage.
    irqs: list[IrqSpec] = [
        IrqSpec(0, "IR-IO-APIC", "2-edge", "timer", cpus, [0], -1, count=41),
        IrqSpec(8, "IR-IO-APIC", "8-edge", "rtc0", cpus, [12], -1),
        IrqSpec(9, "IR-IO-APIC", "9-fasteoi", "acpi", cpus, [5], -1, count=2),
    ]
    for minor, (pci, node) in enumerate(DGX_GPUS):
        irq = 300 + minor
        write_pci(tree, Pci(pci, 0x10DE, 0x2330, 0x030200, node, node_cpus[node], msi=[irq]))
        tree.write(
            f"proc/driver/nvidia/gpus/{pci}/information",
            nvidia_information("NVIDIA H100 80GB HBM3", pci, minor, irq, host),
        )
        irqs.append(
            IrqSpec(
                irq,
                f"IR-PCI-MSI-{pci}",
                "0-edge",
                "nvidia",
                node_cpus[node],
                [16 * node + minor],
                node,
                90,
            )
        )
    for pci in DGX_NVSWITCHES:
        write_pci(tree, Pci(pci, 0x10DE, 0x22A3, 0x068000, 0, node_cpus[0]))
    write_pci(tree, Pci("0000:03:00.0", 0x1A03, 0x2000, 0x030000, 0, node_cpus[0]))
    for name, pci, node, msi, path in DGX_NICS:
        write_pci(tree, Pci(pci, 0x15B3, 0x1021, 0x020000, node, node_cpus[node], msi=msi))
        write_net(tree, name, path)
        for q, irq in enumerate(msi):
            action = f"mlx5_async{q}" if q == 0 else f"mlx5_comp{q - 1}"
            first = node_cpus[node][0]
            irqs.append(
                IrqSpec(
                    irq,
                    f"IR-PCI-MSIX-{pci}",
                    f"{q}-edge",
                    f"{action}@pci:{pci}",
                    node_cpus[node],
                    [first + q % 16],
                    node,
                    count=1000 + q,
                )
            )
    write_net(tree, "lo", None)
    write_net(tree, "docker0", None)
    write_pci(tree, Pci("0000:00:17.0", 0x8086, 0x1BF2, 0x010601, 0, node_cpus[0], msi=[40]))
    irqs.append(
        IrqSpec(40, "IR-PCI-MSI-0000:00:17.0", "0-edge", "ahci[0000:00:17.0]", cpus, [7], 0)
    )
    nvme = "0000:4c:00.0"
    write_pci(tree, Pci(nvme, 0x144D, 0xA80A, 0x010802, 0, node_cpus[0], msi=range(41, 46)))
    irqs.append(IrqSpec(41, f"IR-PCI-MSIX-{nvme}", "0-edge", "nvme0q0", cpus, [3], 0, 17))
    for q in range(1, 5):
        # managed queue IRQs: the kernel spreads them over fixed CPU ranges
        span = [c for c in cpus if (c % 32) // 8 == q - 1]
        irqs.append(
            IrqSpec(
                40 + q + 1,
                f"IR-PCI-MSIX-{nvme}",
                f"{q}-edge",
                f"nvme0q{q}",
                span,
                [min(span)],
                0,
                500,
            )
        )
    write_irqs(tree, layout.ncpus, irqs)

    # Tasks.
    procs: list[Proc] = [
        Proc(
            1,
            0,
            "systemd",
            11,
            ["/sbin/init"],
            "/usr/lib/systemd/systemd",
            v2_cgroup("/init.scope"),
            affinity=cpus,
            pgrp=1,
            session=1,
            vm_kb=168_000,
        ),
    ]
    procs += kthreads(
        [
            (2, "kthreadd", None, {}),
            (3, "pool_workqueue_release", None, {"state": "S"}),
            (14, "ksoftirqd/0", 0, {"utime": 0, "stime": 310}),
            (16, "migration/0", 0, {"policy": SCHED_FIFO, "rt_priority": 99, "stime": 40}),
            (17, "cpuhp/0", 0, {}),
            (19, "migration/1", 1, {"policy": SCHED_FIFO, "rt_priority": 99}),
            (96, "ksmd", None, {"nice": 5}),
            (97, "khugepaged", None, {"nice": 19}),
            (250, "kworker/3:1-events", 3, {"state": "I", "start": 612}),
            (251, "kworker/0:1H-kblockd", 0, {"state": "I", "nice": -20, "start": 615}),
            (900, "irq/300-nvidia", None, {"policy": SCHED_FIFO, "rt_priority": 50}),
            (901, "nvidia-modeset/kthread_q", None, {}),
        ],
        cpus,
    )
    sshd_cg = v2_cgroup("/system.slice/ssh.service")
    user_cg = v2_cgroup("/user.slice/user-1000.slice/user@1000.service/init.scope")
    session_cg = v2_cgroup("/user.slice/user-1000.slice/session-3.scope")
    train_cg = v2_cgroup("/system.slice/train.service")
    every_gpu = {10 + m: f"/dev/nvidia{m}" for m in range(8)}
    procs += [
        # GPU services: they hold GPU-driver files and are no job (issue 17).
        Proc(
            1300,
            1,
            "nvidia-persiste",
            900,
            ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"],
            "/usr/bin/nvidia-persistenced",
            v2_cgroup("/system.slice/nvidia-persistenced.service"),
            uid=118,
            gid=126,
            affinity=cpus,
            pgrp=1300,
            session=1300,
            vm_kb=5_200,
            fds={0: "/dev/null", 3: "/dev/nvidiactl", **every_gpu},
        ),
        Proc(
            1310,
            1,
            "nv-hostengine",
            910,
            ["/usr/bin/nv-hostengine", "-n", "--service-account", "nvidia-dcgm"],
            "/usr/bin/nv-hostengine",
            v2_cgroup("/system.slice/nvidia-dcgm.service"),
            affinity=cpus,
            pgrp=1310,
            session=1310,
            vm_kb=310_000,
            fds={0: "/dev/null", 3: "/dev/nvidiactl", **every_gpu},
            threads=[Thread(1311 + i, "nv-hostengine", start=915) for i in range(3)],
        ),
        Proc(
            1210,
            1,
            "sshd",
            950,
            ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"],
            "/usr/sbin/sshd",
            sshd_cg,
            affinity=cpus,
            pgrp=1210,
            session=1210,
            vm_kb=15_400,
        ),
        Proc(
            2100,
            1,
            "systemd",
            200_000,
            ["/lib/systemd/systemd", "--user"],
            "/usr/lib/systemd/systemd",
            user_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=2100,
            session=2100,
            vm_kb=17_000,
        ),
        Proc(
            2101,
            2100,
            "(sd-pam)",
            200_002,
            ["(sd-pam)"],
            "/usr/lib/systemd/systemd",
            user_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=2100,
            session=2100,
            vm_kb=104_000,
        ),
        # A user's tool that named one of its threads with spaces and parentheses.
        Proc(
            2400,
            1,
            "monitor.py",
            210_000,
            ["python3", "monitor.py"],
            "/usr/bin/python3.10",
            session_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=2400,
            session=2300,
            vm_kb=30_000,
            threads=[Thread(2405, "weird) (name", start=210_050)],
        ),
        # An exited child that its parent has not reaped yet: skipped by the scanner.
        Proc(
            2500,
            1210,
            "sh",
            300_000,
            (),
            None,
            sshd_cg,
            state="Z",
            affinity=cpus,
            pgrp=2500,
            session=2500,
        ),
    ]

    # The torchrun job: launcher, two ranks, their data workers, an Inductor compile worker.
    # Each rank leads a session of its own (torchrun starts it with start_new_session, as seen
    # on an H100 node); its data and compile workers are in it.
    job = ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"]
    rank_args = ["/usr/bin/python3", "-u", "train.py", "--config", "configs/llama-8b.yaml"]
    nv_common = {3: "/dev/nvidiactl", 4: "/dev/nvidia-uvm", 5: "/dev/nvidia-uvm-tools"}
    other_fds = {
        0: "/dev/null",
        1: "pipe:[73120]",
        2: "pipe:[73121]",
        8: "socket:[73201]",
        9: "/dev/shm/torch_4000_1834211_0",
        10: "anon_inode:[eventfd]",
    }
    procs.append(
        Proc(
            4000,
            1,
            "pt_elastic",
            360_000,
            job,
            "/usr/bin/python3.10",
            train_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=4000,
            session=4000,
            vm_kb=850_000,
            # As measured on an H100 node (torch 2.11): the launcher initializes CUDA too.
            fds={
                0: "/dev/null",
                1: "pipe:[73120]",
                2: "pipe:[73121]",
                **nv_common,
                6: "/dev/nvidia0",
                7: "/dev/nvidia0",
            },
            leader=Thread(4000, "pt_elastic", utime=412, stime=88),
            threads=[Thread(4001, "pt_tcpstore_uv", start=360_010, utime=35, stime=60)],
        )
    )
    ranks = ((4100, 0, 1000, "NCCL Progress 3"), (4200, 4, 0, "NCCL Progress 7"))
    for pid, minor, uid, nccl in ranks:
        # What torchrun gives each worker (torch.distributed.elastic); forked children inherit it.
        env = {
            "RANK": str(minor // 4),
            "LOCAL_RANK": str(minor // 4),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "dgx-job-17",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "NCCL_SET_THREAD_NAME": "1",
        }
        node = DGX_GPUS[minor][1]
        # fd 6 and 7 both hold the GPU: a device is listed once.
        fds = {**other_fds, **nv_common, 6: f"/dev/nvidia{minor}", 7: f"/dev/nvidia{minor}"}
        start = 360_150 + pid // 100
        omp = [
            Thread(
                pid + i,
                "python3",
                start=start + 90,
                utime=900 + i,
                stime=30,
                voluntary=50_000,
                nonvoluntary=900,
            )
            for i in range(1, 5)
        ]
        procs.append(
            Proc(
                pid,
                4000,
                "python3",
                start,
                rank_args,
                "/usr/bin/python3.10",
                train_cg,
                uid=uid,
                gid=uid,
                affinity=cpus,
                pgrp=pid,
                session=pid,
                vm_kb=48_000_000,
                fds=fds,
                env=env,
                leader=Thread(
                    pid,
                    "python3",
                    utime=182_000,
                    stime=9_100,
                    voluntary=1_200_000,
                    nonvoluntary=48_000,
                    processor=node_cpus[node][3],
                ),
                threads=[
                    *omp,
                    Thread(pid + 5, "pt_autograd_0", start=start + 400, utime=4_000),
                    Thread(pid + 6, "pt_nccl_watchdg", start=start + 300, utime=120),
                    Thread(pid + 7, "pt_nccl_heartbt", start=start + 300, utime=4),
                    Thread(pid + 8, "cuda-EvtHandlr", start=start + 200, utime=2),
                    Thread(pid + 9, nccl, start=start + 310, utime=31_000, stime=2_000),
                    Thread(pid + 10, "pt_data_pin", start=start + 700, utime=2_500),
                    Thread(pid + 11, "cuda0000A0000B", start=start + 201, utime=1),
                ],
            )
        )
        for w in range(2):
            wpid = pid + 50 + 10 * w
            wstart = start + 650 + w
            procs.append(
                Proc(
                    wpid,
                    pid,
                    "pt_data_worker",
                    wstart,
                    rank_args,
                    "/usr/bin/python3.10",
                    train_cg,
                    uid=uid,
                    gid=uid,
                    affinity=cpus,
                    pgrp=pid,
                    session=pid,
                    vm_kb=9_000_000,
                    fds={**nv_common, 6: f"/dev/nvidia{minor}", 20: "pipe:[7]"},
                    env=env,
                    leader=Thread(wpid, "pt_data_worker", utime=30_000, stime=4_000),
                    threads=[
                        Thread(wpid + 1 + i, "pt_data_worker", start=wstart + 2) for i in range(2)
                    ],
                )
            )
    rank0_env = {**env, "RANK": "0", "LOCAL_RANK": "0"}
    compile_args = [
        "/usr/bin/python3",
        "/usr/lib/python3/dist-packages/torch/_inductor/compile_worker/__main__.py",
        "--parent=4100",
        "--workers=8",
    ]
    procs += [
        Proc(
            4400,
            4100,
            "python3",
            360_500,
            compile_args,
            "/usr/bin/python3.10",
            train_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=4100,
            session=4100,
            vm_kb=900_000,
            leader=Thread(4400, "python3", utime=600),
            env=rank0_env,
            threads=[Thread(4401, "python3", start=360_520)],
        ),
        Proc(
            4450,
            4400,
            "cc1plus",
            361_500,
            [
                "/usr/lib/gcc/x86_64-linux-gnu/11/cc1plus",
                "-quiet",
                "-D_GNU_SOURCE",
                "/tmp/torchinductor_train/ab/cabcdef.cpp",
                "-O3",
                "-o",
                "/tmp/ccX1a2b3.s",
            ],
            "/usr/lib/gcc/x86_64-linux-gnu/11/cc1plus",
            train_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=4100,
            session=4100,
            vm_kb=220_000,
            leader=Thread(4450, "cc1plus", state="R", utime=150),
            env=rank0_env,
        ),
        # A background load in a user session.
        Proc(
            5000,
            2400,
            "stress-ng",
            400_000,
            ["stress-ng", "--cpu", "4"],
            "/usr/bin/stress-ng",
            session_cg,
            uid=1000,
            gid=1000,
            affinity=cpus,
            pgrp=5000,
            session=2300,
            vm_kb=50_000,
        ),
    ]
    for i in range(4):
        procs.append(
            Proc(
                5001 + i,
                5000,
                "stress-ng-cpu",
                400_003,
                ["stress-ng", "--cpu", "4"],
                "/usr/bin/stress-ng",
                session_cg,
                uid=1000,
                gid=1000,
                affinity=cpus,
                nice=0,
                pgrp=5000,
                session=2300,
                vm_kb=50_000,
                leader=Thread(
                    5001 + i, "stress-ng-cpu", state="R", utime=90_000 + i, nonvoluntary=70_000
                ),
            )
        )
    write_procs(tree, procs, layout.ncpus, 2)

    nvml = {
        "driver_version": "550.90.07",
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": gpu_uuid(host, i),
                "pci_bus_id": "0000" + pci.upper(),
                "minor": i,
            }
            for i, (pci, _node) in enumerate(DGX_GPUS)
        ],
        "processes": [{"pid": pid, "gpu": minor} for pid, minor, _uid, _n in ranks],
    }
    tree.write("nvml.json", json.dumps(nvml, indent=2, sort_keys=True))


# -- the AMD MI300X-like host ----------
MI300X_GPUS = (
    ("0000:0c:00.0", 0),
    ("0000:22:00.0", 0),
    ("0000:38:00.0", 0),
    ("0000:5c:00.0", 0),
    ("0000:9f:00.0", 1),
    ("0000:af:00.0", 1),
    ("0000:bf:00.0", 1),
    ("0000:df:00.0", 1),
)
AMD_NIC = (
    "ens21f0np0",
    "0000:c1:00.0",
    1,
    range(160, 168),
    "devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0",
)


def make_amd(root: str) -> None:
    host = "amd-mi300x"
    tree = Tree(root)
    layout = CpuLayout(sockets=2, cores_per_socket=12, threads=2, cores_per_llc=4)
    cpus = layout.all_cpus
    node_cpus = [layout.socket_cpus(0), layout.socket_cpus(1)]
    write_cpus(
        tree,
        layout,
        Freq(
            driver="amd-pstate-epp",
            governor="performance",
            governors="performance powersave",
            epp="performance",
            epps="default performance balance_performance balance_power power",
            hw_min=400000,
            hw_max=3700000,
        ),
    )
    write_nodes(tree, node_cpus, ["10 32", "32 10"], mem_kb=1_584_646_092)
    tree.write("proc/sys/kernel/hostname", host)
    tree.write("proc/self/mountinfo", "\n".join(COMMON_MOUNTS + hybrid_mounts()))
    tree.write("sys/fs/cgroup/unified/cgroup.controllers", "")

    # Older kernels name every MSI/MSI-X chip "IR-PCI-MSI" and show a numeric hwirq.
    irqs: list[IrqSpec] = [
        IrqSpec(0, "IR-IO-APIC", "2-edge", "timer", cpus, [0], -1, count=33),
        IrqSpec(9, "IR-IO-APIC", "9-fasteoi", "acpi", cpus, [1], -1),
    ]
    for n, (pci, node) in enumerate(MI300X_GPUS):
        irq = 400 + n
        drm = [f"card{n}", f"renderD{128 + n}"]
        write_pci(tree, Pci(pci, 0x1002, 0x74A1, 0x120000, node, node_cpus[node], [irq], drm))
        bus = int(pci[5:7], 16)
        irqs.append(
            IrqSpec(
                irq,
                "IR-PCI-MSI",
                f"{bus << 19}-edge",
                "amdgpu",
                node_cpus[node],
                [node_cpus[node][n % 4]],
                node,
                12,
            )
        )
    write_pci(tree, Pci("0000:c3:00.0", 0x1A03, 0x2000, 0x030000, 1, node_cpus[1]))
    # An AMD (0x1022) host bridge and PSP: not GPUs either.
    write_pci(tree, Pci("0000:00:00.0", 0x1022, 0x14A4, 0x060000, 0, node_cpus[0]))
    write_pci(tree, Pci("0000:01:00.1", 0x1022, 0x14CA, 0x108000, 0, node_cpus[0], msi=[30]))
    name, pci, node, msi, path = AMD_NIC
    write_pci(tree, Pci(pci, 0x14E4, 0x1750, 0x020000, node, node_cpus[node], msi=msi))
    write_net(tree, name, path)
    write_net(tree, "lo", None)
    bus = int(pci[5:7], 16)
    for q, irq in enumerate(msi):
        action = f"bnxt_qplib_creq@pci:{pci}" if q == 0 else f"{name}-TxRx-{q - 1}"
        irqs.append(
            IrqSpec(
                irq,
                "IR-PCI-MSI",
                f"{(bus << 19) + q}-edge",
                action,
                node_cpus[node],
                [node_cpus[node][q]],
                node,
                400 + q,
            )
        )
    irqs.append(IrqSpec(30, "IR-PCI-MSI", "526336-edge", "psp-1", cpus, [2], 0))
    write_irqs(tree, layout.ncpus, irqs)

    def hy(systemd: str, cpuset: str = "/", v2: str | None = None) -> str:
        return hybrid_cgroup(systemd, cpuset, v2)

    pod = "/kubepods/burstable/pod5b0e2c1a-7f4d-4e8a-9c3b-2d6f1e0a9b87"
    container = pod + "/" + "3f9c2a7e1b8d4c6a" * 4  # a 64-hex container id
    pod_cg = hy(container, cpuset=container, v2="/")
    kubelet_cg = hy("/system.slice/kubelet.service")
    procs: list[Proc] = [
        Proc(
            1,
            0,
            "systemd",
            9,
            ["/sbin/init", "splash"],
            "/usr/lib/systemd/systemd",
            hy("/init.scope"),
            affinity=cpus,
            pgrp=1,
            session=1,
            vm_kb=170_000,
        ),
    ]
    procs += kthreads(
        [
            (2, "kthreadd", None, {}),
            (15, "ksoftirqd/0", 0, {"stime": 80}),
            (16, "migration/0", 0, {"policy": SCHED_FIFO, "rt_priority": 99}),
            (180, "kworker/12:1H-kblockd", 12, {"state": "I", "nice": -20}),
            (181, "kworker/u97:2-events_unbound", None, {"state": "I"}),
        ],
        cpus,
        hy("/"),
    )
    procs += [
        Proc(
            1500,
            1,
            "sshd",
            800,
            ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"],
            "/usr/sbin/sshd",
            hy("/system.slice/ssh.service"),
            affinity=cpus,
            pgrp=1500,
            session=1500,
            vm_kb=15_000,
        ),
        Proc(
            1600,
            1,
            "kubelet",
            900,
            ["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml"],
            "/usr/bin/kubelet",
            kubelet_cg,
            affinity=cpus,
            pgrp=1600,
            session=1600,
            vm_kb=2_000_000,
            threads=[Thread(1601 + i, "kubelet") for i in range(3)],
        ),
        # A desktop-like program holding only render nodes: not a GPU compute process.
        Proc(
            3000,
            2990,
            "Xorg",
            1_200,
            ["/usr/lib/xorg/Xorg", "-core", ":0", "-auth", "x"],
            "/usr/lib/xorg/Xorg",
            hy("/system.slice/display-manager.service"),
            affinity=cpus,
            pgrp=3000,
            session=3000,
            vm_kb=300_000,
            fds={0: "/dev/null", 9: "/dev/dri/card0", 10: "/dev/dri/renderD128", 11: "/dev/tty7"},
            threads=[Thread(3001, "InputThread")],
        ),
        Proc(
            2990,
            1,
            "gdm3",
            1_100,
            ["/usr/sbin/gdm3"],
            "/usr/sbin/gdm3",
            hy("/system.slice/display-manager.service"),
            affinity=cpus,
            pgrp=2990,
            session=2990,
            vm_kb=250_000,
        ),
        # A process whose main thread called pthread_exit(): the leader is a zombie, the
        # other thread keeps running.
        Proc(
            3600,
            1,
            "gpu-exporter",
            5_000,
            ["/usr/local/bin/gpu-exporter", "--port=9400"],
            "/usr/local/bin/gpu-exporter",
            hy("/system.slice/gpu-exporter.service"),
            affinity=cpus,
            pgrp=3600,
            session=3600,
            vm_kb=80_000,
            leader=Thread(3600, "gpu-exporter", state="Z"),
            threads=[Thread(3601, "prom-http", start=5_010, state="S")],
        ),
    ]
    job = ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"]
    rank_args = ["/usr/bin/python3", "train.py"]
    procs.append(
        Proc(
            7000,
            6900,
            "pt_elastic",
            500_000,
            job,
            "/usr/bin/python3.10",
            pod_cg,
            affinity=cpus,
            pgrp=7000,
            session=7000,
            vm_kb=800_000,
            threads=[Thread(7001, "pt_tcpstore_uv", start=500_010)],
        )
    )
    procs.append(
        Proc(
            6900,
            1,
            "containerd-shim",
            499_000,
            [
                "/usr/bin/containerd-shim-runc-v2",
                "-namespace",
                "k8s.io",
                "-address",
                "/run/containerd/containerd.sock",
            ],
            "/usr/bin/containerd-shim-runc-v2",
            hy("/system.slice/containerd.service"),
            affinity=cpus,
            pgrp=6900,
            session=6900,
            vm_kb=720_000,
        )
    )
    for pid, n in ((7100, 2), (7200, 6)):
        start = 500_100 + pid // 100
        env = {
            "RANK": str(pid // 100 - 71),
            "LOCAL_RANK": str(pid // 100 - 71),
            "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "none",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        }
        fds = {
            0: "/dev/null",
            3: "/dev/kfd",
            4: f"/dev/dri/renderD{128 + n}",
            5: "anon_inode:[eventfd]",
            6: "socket:[90001]",
        }
        procs.append(
            Proc(
                pid,
                7000,
                "python3",
                start,
                rank_args,
                "/usr/bin/python3.10",
                pod_cg,
                affinity=cpus,
                pgrp=7000,
                session=7000,
                vm_kb=60_000_000,
                fds=fds,
                env=env,
                leader=Thread(pid, "python3", utime=150_000, stime=7_000),
                threads=[
                    Thread(pid + 1, "python3", start=start + 50, utime=800),
                    Thread(pid + 2, "pt_autograd_0", start=start + 300, utime=3_000),
                    Thread(pid + 3, "pt_nccl_watchdg", start=start + 250),
                    Thread(pid + 4, "pt_nccl_heartbt", start=start + 250),
                ],
            )
        )
        procs.append(
            Proc(
                pid + 50,
                pid,
                "pt_data_worker",
                start + 500,
                rank_args,
                "/usr/bin/python3.10",
                pod_cg,
                affinity=cpus,
                pgrp=7000,
                session=7000,
                vm_kb=8_000_000,
                fds={3: "/dev/kfd", 4: f"/dev/dri/renderD{128 + n}"},
                env=env,
                threads=[Thread(pid + 51, "pt_data_worker", start=start + 502)],
            )
        )
    write_procs(tree, procs, layout.ncpus, 2)


# Intel Gaudi 2 (HLS-Gaudi2): 8 HL-225 OAMs behind PCIe switches, 4 per socket.
GAUDI_ACCELS = (
    ("0000:19:00.0", 0), ("0000:1a:00.0", 0), ("0000:33:00.0", 0), ("0000:34:00.0", 0),
    ("0000:9a:00.0", 1), ("0000:9b:00.0", 1), ("0000:b3:00.0", 1), ("0000:b4:00.0", 1),
)  # fmt: skip


def make_gaudi(root: str) -> None:
    """An HLS-Gaudi2-like server, scaled down: 2 x 8 cores x 2 threads, pure cgroup v2, 8 Gaudi 2
    found only through sysfs (vendor 0x1da3, the accel subsystem's accel/accelN), a PyTorch job
    whose ranks hold /dev/accel/accelN and /dev/accel/accel_controlDN, and a metrics exporter
    (root, a system service) that holds every device."""
    host = "gaudi2"
    tree, layout, cpus, node_cpus = intel_v2_host(root, host, 8, 3400000)
    irqs: list[IrqSpec] = [
        IrqSpec(0, "IR-IO-APIC", "2-edge", "timer", cpus, [0], -1, count=41),
    ]
    for n, (pci, node) in enumerate(GAUDI_ACCELS):
        irq = 500 + n
        write_pci(
            tree,
            Pci(pci, 0x1DA3, 0x1020, 0x120000, node, node_cpus[node], [irq], (), [f"accel{n}"]),
        )
        irqs.append(
            IrqSpec(irq, f"IR-PCI-MSI-{pci}", "0-edge", "habanalabs", node_cpus[node],
                    [node_cpus[node][n % 4]], node, 20)
        )  # fmt: skip
    write_net(tree, "lo", None)
    write_irqs(tree, layout.ncpus, irqs)

    job_cg = v2_cgroup("/system.slice/slurmstepd.scope/job_88/step_0/user/task_0")
    procs: list[Proc] = [
        Proc(1, 0, "systemd", 9, ["/sbin/init"], "/usr/lib/systemd/systemd",
             v2_cgroup("/init.scope"), affinity=cpus, pgrp=1, session=1, vm_kb=170_000),
        Proc(1400, 1, "slurmstepd", 300_000, ["slurmstepd: [88.0]"], "/usr/sbin/slurmstepd",
             v2_cgroup("/system.slice/slurmstepd.scope/job_88/step_0/slurm"), affinity=cpus,
             pgrp=1400, session=1400, vm_kb=20_000),
        # A metrics exporter that opens every device to read its counters: a GPU service.
        Proc(1600, 1, "habana-metric-e", 1_000, ["/usr/bin/habana-metric-exporter"],
             "/usr/bin/habana-metric-exporter", v2_cgroup("/system.slice/habana-metrics.service"),
             affinity=cpus, pgrp=1600, session=1600, vm_kb=90_000,
             fds={3 + n: f"/dev/accel/accel{n}" for n in range(8)},
             threads=[Thread(1601 + i, "habana-metric-e", start=1_010) for i in range(3)]),
    ]  # fmt: skip
    procs += kthreads(
        [(2, "kthreadd", None, {}), (15, "ksoftirqd/0", 0, {}), (90, "irq/500-habanala", None, {})],
        cpus,
    )
    env_job = {"SLURM_JOB_ID": "88", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    procs.append(
        Proc(2000, 1400, "pt_elastic", 300_100,
             ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"],
             "/usr/bin/python3.10", job_cg, uid=1000, gid=1000, affinity=cpus, pgrp=2000,
             session=2000, vm_kb=800_000, env=env_job)
    )  # fmt: skip
    for r, (pid, n) in enumerate(((2100, 0), (2200, 5))):
        env = {**env_job, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
               "TORCHELASTIC_RUN_ID": "gaudi-17"}  # fmt: skip
        fds = {3: f"/dev/accel/accel{n}", 4: f"/dev/accel/accel_controlD{n}", 5: "socket:[7]"}
        start = 300_200 + r
        procs.append(
            Proc(pid, 2000, "python3", start, ["/usr/bin/python3", "train.py"],
                 "/usr/bin/python3.10", job_cg, uid=1000, gid=1000, affinity=cpus, pgrp=pid,
                 session=pid, vm_kb=30_000_000, fds=fds, env=env,
                 leader=Thread(pid, "python3", utime=90_000, stime=4_000),
                 threads=[Thread(pid + 1 + i, "python3", start=start + 40) for i in range(3)]
                 + [Thread(pid + 4, "pt_autograd_0", start=start + 300)])
        )  # fmt: skip
        procs.append(
            Proc(pid + 50, pid, "pt_data_worker", start + 500, ["/usr/bin/python3", "train.py"],
                 "/usr/bin/python3.10", job_cg, uid=1000, gid=1000, affinity=cpus, pgrp=pid,
                 session=pid, vm_kb=4_000_000, fds=fds, env=env)
        )  # fmt: skip
    write_procs(tree, procs, layout.ncpus, 2)


TRN1_DEVICES = (("0000:10:1c.0", 0), ("0000:10:1d.0", 0), ("0000:a0:1c.0", 1), ("0000:a0:1d.0", 1))


def make_trn1(root: str) -> None:
    """An AWS trn1-like server, scaled down: 2 x 8 cores x 2 threads, pure cgroup v2, 4 Trainium
    devices (vendor 0x1d0f, device 0x7164), two per node, with the driver's class devices
    (/sys/class/neuron_device/neuronN: virtual, no link to their PCI device), a Kubernetes pod
    whose torchrun ranks hold /dev/neuronN, and neuron-monitor (root, a system service) that holds
    every device."""
    host = "trn1"
    tree, layout, cpus, node_cpus = intel_v2_host(root, host, 8, 3500000)
    irqs: list[IrqSpec] = [
        IrqSpec(0, "IR-IO-APIC", "2-edge", "timer", cpus, [0], -1, count=41),
    ]
    for n, (pci, node) in enumerate(TRN1_DEVICES):
        irq = 600 + n
        write_pci(tree, Pci(pci, 0x1D0F, 0x7164, 0x120000, node, node_cpus[node], [irq]))
        irqs.append(
            IrqSpec(irq, f"IR-PCI-MSI-{pci}", "0-edge", "neuron", node_cpus[node],
                    [node_cpus[node][n % 4]], node, 20)
        )  # fmt: skip
        virtual = f"sys/devices/virtual/neuron_device/neuron{n}"
        tree.write(f"{virtual}/core_count", "2")
        tree.write(f"{virtual}/connected_devices", ", ".join(str(m) for m in range(4) if m != n))
        tree.write(f"{virtual}/dev", f"239:{n}")
        os.makedirs(tree._path("sys/class/neuron_device"), exist_ok=True)
        tree.link(f"sys/class/neuron_device/neuron{n}", f"../../{virtual[4:]}")
    write_net(tree, "lo", None)
    write_irqs(tree, layout.ncpus, irqs)

    pod = v2_cgroup("/kubepods.slice/kubepods-pod1a2b3c4d.slice/cri-containerd-5e6f.scope")
    monitor = "/opt/aws/neuron/bin/neuron-monitor"
    procs: list[Proc] = [
        Proc(1, 0, "systemd", 9, ["/sbin/init"], "/usr/lib/systemd/systemd",
             v2_cgroup("/init.scope"), affinity=cpus, pgrp=1, session=1, vm_kb=170_000),
        Proc(1300, 1, "neuron-monitor", 2_000, [monitor], monitor,
             v2_cgroup("/system.slice/neuron-monitor.service"),
             affinity=cpus, pgrp=1300, session=1300, vm_kb=60_000,
             fds={3 + n: f"/dev/neuron{n}" for n in range(4)},
             threads=[Thread(1301 + i, "neuron-monitor", start=2_010) for i in range(2)]),
        Proc(1500, 1, "containerd-shim", 200_000,
             ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "5e6f"],
             "/usr/bin/containerd-shim-runc-v2", v2_cgroup("/system.slice/containerd.service"),
             affinity=cpus, pgrp=1500, session=1500, vm_kb=700_000),
    ]  # fmt: skip
    procs += kthreads([(2, "kthreadd", None, {}), (15, "ksoftirqd/0", 0, {})], cpus)
    env_job = {"MASTER_ADDR": "trn1-0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "trn-7"}
    procs.append(
        Proc(2000, 1500, "pt_elastic", 200_100,
             ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"],
             "/usr/bin/python3.10", pod, uid=1000, gid=1000, affinity=cpus, pgrp=2000,
             session=1500, vm_kb=800_000, env=env_job)
    )  # fmt: skip
    for r, pid in enumerate((2100, 2200)):
        env = {**env_job, "RANK": str(r), "LOCAL_RANK": str(r),
               "NEURON_RT_VISIBLE_CORES": f"{4 * r}-{4 * r + 3}"}  # fmt: skip
        fds = {3: f"/dev/neuron{2 * r}", 4: f"/dev/neuron{2 * r + 1}", 5: "socket:[9]"}
        start = 200_200 + r
        procs.append(
            Proc(pid, 2000, "python3", start, ["/usr/bin/python3", "train.py"],
                 "/usr/bin/python3.10", pod, uid=1000, gid=1000, affinity=cpus, pgrp=pid,
                 session=pid, vm_kb=20_000_000, fds=fds, env=env,
                 leader=Thread(pid, "python3", utime=70_000, stime=3_000),
                 threads=[Thread(pid + 1 + i, "python3", start=start + 40) for i in range(3)])
        )  # fmt: skip
        procs.append(
            Proc(pid + 50, pid, "pt_data_worker", start + 500, ["/usr/bin/python3", "train.py"],
                 "/usr/bin/python3.10", pod, uid=1000, gid=1000, affinity=cpus, pgrp=pid,
                 session=pid, vm_kb=3_000_000, fds=fds, env=env)
        )  # fmt: skip
    write_procs(tree, procs, layout.ncpus, 2)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = os.path.abspath(args[0]) if args else DEFAULT_OUT
    make_dgx(os.path.join(out, "dgx-h100"))
    make_amd(os.path.join(out, "amd-mi300x"))
    make_gaudi(os.path.join(out, "gaudi2"))
    make_trn1(os.path.join(out, "trn1"))
    print(f"wrote {out}/dgx-h100, {out}/amd-mi300x, {out}/gaudi2 and {out}/trn1", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

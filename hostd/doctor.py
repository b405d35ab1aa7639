"""What this host allows hostd to do: probes, plain-language findings, and the feature switches.

``probe(host)`` checks each mechanism without leaving a trace (a forked child tries SCHED_FIFO
on itself; move_pages is asked where one of hostd's own pages is; the proc connector is subscribed
to, its acknowledgement checked, then released; IRQs are not written) and returns
``Capabilities``: what ``hostd run`` will use, feature by feature, and one ``Finding`` per probe
for ``hostd doctor``. The agent degrades by these switches instead of failing: no RT means RT
layers get nice -20; no cpuset means affinity only; no IRQ access or no cpufreq means those parts
of the plan are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from hostd.host import Host, HostError, paths
from hostd.host.cgroupfs import read_cgroup_layout
from hostd.host.connector import ProcConnector
from hostd.host.parsers import parse_preemption
from hostd.knobkinds import needing
from hostd.model.tasks import STICKY_ACTIVITIES, Task
from hostd.model.topology import Topology
from hostd.numa import private_pages

# Capability bits (include/uapi/linux/capability.h).
# What hostd uses (measured one by one with packaging/capcheck.py): SYS_NICE for affinity, RT
# and nice of other users' threads; SYS_PTRACE for their /proc/PID/fd and page moves;
# DAC_OVERRIDE to create cpuset cgroups; NET_ADMIN for the proc connector and its buffer.
CAPS = {"CAP_SYS_NICE": 23, "CAP_SYS_PTRACE": 19, "CAP_DAC_OVERRIDE": 1, "CAP_NET_ADMIN": 12}


@dataclass(frozen=True, slots=True)
class Finding:
    feature: str
    ok: bool
    detail: str


@dataclass
class Capabilities:
    affinity: bool = True
    sched: bool = True
    rt: bool = True
    cpuset: str = "none"  # "v1" | "v2" | "none"
    irqs: bool = True
    cpufreq: bool = False
    numa_nodes: int = 1
    move_pages: bool = False
    nvml: bool = False
    proc_connector: bool = False
    udev: bool = False
    findings: list[Finding] = field(default_factory=list)

    def disabled_kinds(self) -> set[str]:
        """Knob kinds ``hostd run`` must not write here."""
        lacking = {
            name
            for name, ok in (
                ("affinity", self.affinity),
                ("sched", self.sched),
                ("cpuset", self.cpuset in ("v1", "v2")),
                ("irqs", self.irqs),
                ("cpufreq", self.cpufreq),
            )
            if not ok
        }
        return set(needing(lacking))


def _cap_eff(host: Host) -> int:
    text = host.read_quiet(paths.SELF_STATUS) or ""
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _try_fifo() -> tuple[bool, str]:
    """Fork a child that asks for SCHED_FIFO 1 on itself; nothing else changes."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError as exc:
            code = exc.errno or 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return True, "SCHED_FIFO is allowed for hostd's threads' cgroup"
    return False, f"SCHED_FIFO refused: {os.strerror(code)}"


def probe(host: Host, topo: Topology | None = None) -> Capabilities:
    caps = Capabilities()
    f = caps.findings
    live = host.live
    eff = _cap_eff(host) if live else 0
    root = live and os.geteuid() == 0
    missing = [name for name, bit in CAPS.items() if not eff >> bit & 1]
    if live:
        f.append(
            Finding(
                "privileges",
                not missing,
                "root with every capability hostd uses"
                if not missing
                else f"missing {', '.join(missing)}: hostd can only change its own user's threads",
            )
        )
    caps.sched = caps.affinity = live
    layout = read_cgroup_layout(host)
    caps.cpuset = layout.cpuset if root else "none"
    if layout.cpuset == "v1":
        f.append(
            Finding(
                "cpusets",
                root,
                f"cgroup {layout.mode}: v1 cpuset hierarchy at "
                f"{layout.v1_mount('cpuset')}; hostd keeps its layers in /hostd/<layer>",
            )
        )
    elif layout.cpuset == "v2":
        f.append(
            Finding(
                "cpusets",
                root,
                f"cgroup v2 at {layout.v2_mount}: a layer's threads go to a threaded child "
                "G/hostd.<layer> of their own cgroup G (their process stays in G, with its "
                "memory and io controllers); where G cannot hold threaded children, thread "
                "affinity alone",
            )
        )
    else:
        f.append(Finding("cpusets", False, "no cpuset controller: thread affinity only"))
    mount = layout.v1_mount("cpuset") if layout.cpuset == "v1" else layout.v2_mount
    if caps.cpuset != "none" and mount and live and not os.access(host.path(mount), os.W_OK):
        caps.cpuset = "none"  # e.g. a container with /sys/fs/cgroup mounted read-only
        f.append(Finding("cpusets", False, f"{mount} is read-only here: thread affinity only"))

    runtime = host.read_line(paths.sysctl("kernel/sched_rt_runtime_us"))
    if runtime == "-1":
        caps.rt = False
        f.append(
            Finding(
                "real-time",
                False,
                "RT throttling is off (sched_rt_runtime_us = -1): "
                "hostd will not make threads real-time; RT layers get nice -20",
            )
        )
    elif live:
        ok, why = _try_fifo()
        caps.rt = ok
        group = host.exists(f"{paths.CGROUP_MOUNT}/cpu/cpu.rt_runtime_us")
        detail = f"{why}; RT throttling leaves {100 - int(runtime or 950000) // 10000}% to others"
        if group:
            detail += "; RT group scheduling is on (a cgroup with cpu.rt_runtime_us = 0 refuses RT)"
        f.append(Finding("real-time", ok, detail))
    else:
        caps.rt = False

    # No test write: rewriting an IRQ's mask can move its effective CPU, a change nobody asked
    # for. Kernel-managed IRQs show themselves on the agent's first write, and are remembered.
    irqs = [e for e in host.listdir(paths.IRQS) if e.isdigit()]
    caps.irqs = root and bool(irqs)
    detail = (
        f"{len(irqs)} IRQs; kernel-managed ones refuse on the first write and are then left alone"
        if root
        else "IRQ affinity needs root"
    )
    if caps.irqs and live and not os.access(host.path(paths.irq(irqs[0])), os.W_OK):
        caps.irqs = False  # e.g. a pod that is not privileged: /proc/irq is mounted read-only
        detail = "/proc/irq is read-only here: IRQs are left as they are"
    f.append(Finding("IRQs", caps.irqs, detail))

    cpu0 = paths.cpufreq(0, "scaling_governor")
    caps.cpufreq = host.exists(cpu0)
    govs = host.read_line(paths.cpufreq(0, "scaling_available_governors"))
    f.append(
        Finding(
            "cpufreq",
            caps.cpufreq,
            f"governors: {govs}"
            if caps.cpufreq
            else "no cpufreq driver: governors and frequency floors are skipped",
        )
    )

    nodes = [e for e in host.listdir(paths.NODES) if e.startswith("node")]
    caps.numa_nodes = max(1, len(nodes))
    if live:
        try:  # ask where one of our own pages is: a query, it moves nothing
            host.threads().move_pages(os.getpid(), private_pages(host, os.getpid())[:1], None)
            caps.move_pages = True
        except HostError as exc:
            caps.move_pages = False
            f.append(Finding("move_pages", False, str(exc)))
    f.append(
        Finding(
            "NUMA",
            True,
            f"{caps.numa_nodes} node(s)"
            + ("; pages can be moved" if caps.move_pages else "")
            + ("; NUMA placement is a no-op with one node" if caps.numa_nodes == 1 else ""),
        )
    )

    nvml, why = host.nvml()
    caps.nvml = nvml is not None
    f.append(
        Finding(
            "NVML",
            caps.nvml,
            f"{len(nvml.gpus)} GPU(s), driver {nvml.driver_version}"
            if nvml
            else f"{why}: GPUs are found through sysfs PCI",
        )
    )

    if live:
        try:
            with ProcConnector(rcvbuf=64 * 1024, timeout=0.3) as conn:
                caps.proc_connector = True
                detail = "subscribed and acknowledged: new and renamed threads are handled " + (
                    "within milliseconds (kernel event filter on)"
                    if conn.filtered
                    else "within milliseconds (no event filter before kernel 6.6)"
                )
        except OSError as exc:
            detail = f"{exc.strerror or exc}: hostd polls /proc every [agent] interval instead"
        f.append(Finding("proc connector", caps.proc_connector, detail))
        try:
            import pyudev  # noqa: F401

            caps.udev = True
            running = host.exists("run/udev/control")
            f.append(
                Finding(
                    "udev",
                    True,
                    "pyudev works; udevd "
                    + ("is running" if running else "is not running (kernel events only)"),
                )
            )
        except ImportError as exc:
            f.append(Finding("udev", False, f"pyudev unavailable: {exc}"))
    f.append(preemption_finding(host))
    if topo is not None and not topo.cpus:
        f.append(Finding("topology", False, "no online CPUs found"))
    return caps


def preemption_finding(host: Host) -> Finding:
    """The kernel's preemption model. Under ``none`` or ``voluntary`` a thread in a system call
    keeps its CPU until it reaches a rescheduling point, whatever hostd did to its priority:
    measured here (BENCHMARKS.md, "The I/O cell"), buffered writes to an ext4 file made a woken
    thread on the writer's CPU wait 2-4 ms at p99 with the writers SCHED_IDLE, in a session at
    nice 19 or in a ``cpu.idle`` cgroup alike."""
    p = parse_preemption(
        host.read_quiet(paths.DEBUG_PREEMPT),
        host.read_quiet(paths.CMDLINE),
        host.kernel_config(),
        host.read_line(paths.sysctl("kernel/version")),
    )
    if p.model in ("full", "lazy", "rt"):
        return Finding("preemption", True, f"kernel preemption model {p.model} ({p.source})")
    advice = "boot with preempt=full" + (
        " (or write full to /sys/kernel/debug/sched/preempt)" if p.dynamic else ""
    )
    if p.model is None:
        return Finding("preemption", False, f"kernel preemption model unknown: {p.source}")
    return Finding(
        "preemption",
        False,
        f"kernel preemption model {p.model} ({p.source}): a thread in a system call keeps its "
        "CPU until it reaches a rescheduling point, so a woken protected thread can wait "
        "milliseconds behind demoted work that is in the kernel (buffered file writes); where "
        f"the job's latency matters more than kernel throughput, {advice}",
    )


def job_findings(tasks: Iterable[Task]) -> list[Finding]:
    """GPU jobs whose threads hostd could place better if the job named them: threads of a rank
    other than its main thread that carry the rank's own name (NCCL's proxy, service, IB and RAS
    threads unless NCCL_SET_THREAD_NAME=1; OpenMP workers; Python < 3.14's threads). They stay
    with their rank, with its protection, rather than in comms, unless what they do tells them
    apart (``activity``: waiting in poll(2), on RDMA events, feeding a queue; tests/standin.py
    measures it)."""
    unnamed: dict[str, list[Task]] = {}
    named: dict[str, bool] = {}
    for t in tasks:
        job = t.process.job
        if job is None or job.role != "rank" or not t.process.job_gpu:
            continue
        named[job.id] = named.get(job.id, False) or job.thread_names
        if t.unnamed:
            unnamed.setdefault(job.id, []).append(t)
    out = []
    for job_id in sorted(named):
        threads = unnamed.get(job_id, [])
        ranks = len({t.pid for t in threads})
        if named[job_id] or not threads:
            out.append(Finding("job threads", True, f"job {job_id}: its threads are named"))
            continue
        known = sum(t.activity in STICKY_ACTIVITIES for t in threads)
        out.append(
            Finding(
                "job threads",
                False,
                f"job {job_id}: {len(threads)} threads of {ranks} ranks carry their rank's name "
                f"(NCCL names its threads only with NCCL_SET_THREAD_NAME=1): {known} are known "
                "by what they do (poll(2), RDMA events, a queue's pipe), the other "
                f"{len(threads) - known} stay with their rank; set NCCL_SET_THREAD_NAME=1 in "
                "the job's environment",
            )
        )
    return out

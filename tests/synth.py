"""Synthetic topologies and threads for table-driven tests of the pure core.

``topology("2x8x2", gpus=8)`` builds a Topology value directly (no files): N nodes x C cores x
T SMT threads, x86 numbering (cpu i and i + ncores are siblings), one LLC per node (or, with
``llc_cores=K``, one per K cores of a node, as AMD's CCXs: ``topology("1x32x2", llc_cores=4)``
has 8 LLCs of 4 cores), GPUs and NICs spread evenly over the nodes. ``thread()`` builds Task
values with their Process.
"""

from __future__ import annotations

import itertools

from hostd.model.tasks import Process, Task
from hostd.model.topology import CgroupLayout, Cpu, CpuFreq, Gpu, Irq, Nic, Node, Topology

_tids = itertools.count(10_000)


def topology(
    shape: str = "2x8x2",
    *,
    gpus: int = 0,
    nics: int = 0,
    irqs_per_nic: int = 4,
    cpufreq: bool = False,
    governors: tuple[str, ...] = ("performance", "powersave"),
    llc_cores: int | None = None,
) -> Topology:
    n_nodes, n_cores, smt = (int(x) for x in shape.split("x"))
    total_cores = n_nodes * n_cores
    freq = (
        CpuFreq("intel_pstate", "powersave", governors, 800_000, 3_800_000, 800_000, 3_800_000,
                "balance_performance", ("default", "performance", "balance_performance"))
        if cpufreq
        else None
    )  # fmt: skip
    cpus: dict[int, Cpu] = {}
    node_cpus: dict[int, set[int]] = {n: set() for n in range(n_nodes)}
    for core in range(total_cores):
        node = core // n_cores
        siblings = frozenset(core + t * total_cores for t in range(smt))
        for cpu in siblings:
            node_cpus[node].add(cpu)
    for core in range(total_cores):
        node = core // n_cores
        siblings = frozenset(core + t * total_cores for t in range(smt))
        # an LLC's id is the lowest CPU id sharing it: its first core's
        llc = min(node_cpus[node]) if llc_cores is None else core - core % n_cores % llc_cores
        for cpu in siblings:
            cpus[cpu] = Cpu(cpu, node, core, siblings, llc, node, freq)
    nodes = {
        n: Node(n, frozenset(c), tuple(10 if m == n else 21 for m in range(n_nodes)), 1 << 20)
        for n, c in node_cpus.items()
    }
    gpu_list = tuple(
        Gpu(i, "nvidia", "H100", f"0000:{0x18 + i:02x}:00.0", i * n_nodes // gpus if gpus else 0,
            nodes[i * n_nodes // gpus].cpus, i, "nvml")
        for i in range(gpus)
    )  # fmt: skip
    nic_list = []
    irq_list = []
    next_irq = 100
    for i in range(nics):
        node = i * n_nodes // nics
        irqs = tuple(range(next_irq, next_irq + irqs_per_nic))
        next_irq += irqs_per_nic
        nic_list.append(Nic(f"eth{i}", f"0000:{0x80 + i:02x}:00.0", node, nodes[node].cpus, irqs))
        for k, irq in enumerate(irqs):
            irq_list.append(
                Irq(irq, "IR-PCI-MSIX", f"mlx5_comp{k}", 0, frozenset(cpus), frozenset({0}), node)
            )
    irq_list.append(Irq(9, "IO-APIC", "acpi", 0, frozenset(cpus), frozenset({0}), None))
    return Topology(
        hostname="synth",
        cpus=dict(sorted(cpus.items())),
        nodes=nodes,
        gpus=gpu_list,
        nics=tuple(nic_list),
        irqs=tuple(sorted(irq_list, key=lambda i: i.irq)),
        cgroup=CgroupLayout("v2", "/sys/fs/cgroup", ("cpuset", "cpu"), (), "v2"),
        smt=smt > 1,
    )


def process(
    pid: int,
    comm: str = "python3",
    *,
    parent_comm: str = "bash",
    cgroup: str = "/",
    cmdline: str = "",
    exe: str | None = "/usr/bin/python3",
    gpu_devices: tuple[str, ...] = (),
    nvml: bool = False,
    kthread: bool = False,
    ppid: int = 1,
    session: int = 0,
) -> Process:
    return Process(
        pid, 1000 + pid, comm, ppid, parent_comm, cgroup, "/", cmdline or comm,
        None if kthread else exe, gpu_devices, nvml, kthread, session,
    )  # fmt: skip


def thread(
    proc: Process,
    comm: str | None = None,
    *,
    tid: int | None = None,
    uid: int = 0,
    gid: int = 0,
    nice: int = 0,
    policy: int = 0,
    affinity: frozenset[int] | None = None,
    online: frozenset[int] = frozenset(range(64)),
) -> Task:
    tid = proc.pid if tid is None else tid
    return Task(
        tid, 5000 + tid, comm or proc.comm, "S", uid, gid, nice, policy, 0,
        affinity if affinity is not None else online, 0, 0, 0, proc,
    )  # fmt: skip


def threads(proc: Process, n: int, comm: str | None = None, **kw) -> list[Task]:
    """The leader plus n - 1 more threads of ``proc``."""
    out = [thread(proc, comm, **kw)]
    out += [thread(proc, comm, tid=next(_tids), **kw) for _ in range(n - 1)]
    return out

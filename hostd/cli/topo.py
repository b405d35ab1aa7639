"""``hostd topo``: the host's CPUs, NUMA nodes, caches, GPUs, NICs and IRQs at a glance.

Renders ``hostd.model.topology.Topology``; ``--json`` prints the same facts as data. The GPU/NIC
matrix follows the spirit of ``nvidia-smi topo -m``: each device with its NUMA node and the CPUs
local to it.
"""

from __future__ import annotations

from rich.table import Table

from hostd.cli.common import JsonOpt, RootOpt, cpu_list, get_host, out, print_json, show, styled
from hostd.model.cpus import format_cpulist
from hostd.model.topology import Topology
from hostd.topology import read_topology


def topo_json(t: Topology) -> dict:
    return {
        "hostname": t.hostname,
        "online": cpu_list(t.online),
        "smt": t.smt,
        "cgroup": {
            "mode": t.cgroup.mode,
            "cpuset": t.cgroup.cpuset,
            "v2_mount": t.cgroup.v2_mount,
            "v2_controllers": list(t.cgroup.v2_controllers),
            "v1_mounts": dict(t.cgroup.v1_mounts),
        },
        "nodes": [
            {
                "id": n.id,
                "cpus": cpu_list(n.cpus),
                "distances": list(n.distances),
                "mem_total_kb": n.mem_total_kb,
            }
            for n in t.nodes.values()
        ],
        "cpus": [
            {
                "id": c.id,
                "package": c.package,
                "core": c.core,
                "siblings": cpu_list(c.siblings),
                "llc": c.llc,
                "node": c.node,
                "cpufreq": None
                if c.freq is None
                else {
                    "driver": c.freq.driver,
                    "governor": c.freq.governor,
                    "available_governors": list(c.freq.available_governors),
                    "min_freq": c.freq.min_freq,
                    "max_freq": c.freq.max_freq,
                    "hw_min_freq": c.freq.hw_min_freq,
                    "hw_max_freq": c.freq.hw_max_freq,
                    "epp": c.freq.epp,
                },
            }
            for c in t.cpus.values()
        ],
        "gpus": [
            {
                "index": g.index,
                "vendor": g.vendor,
                "name": g.name,
                "pci": g.pci,
                "node": g.node,
                "local_cpus": cpu_list(g.local_cpus),
                "minor": g.minor,
                "source": g.source,
            }
            for g in t.gpus
        ],
        "nvml": t.nvml or "ok",
        "nics": [
            {
                "name": n.name,
                "pci": n.pci,
                "node": n.node,
                "local_cpus": cpu_list(n.local_cpus),
                "irqs": list(n.irqs),
            }
            for n in t.nics
        ],
        "irqs": [
            {
                "irq": i.irq,
                "chip": i.chip,
                "name": i.name,
                "count": i.count,
                "affinity": cpu_list(i.affinity),
                "effective": cpu_list(i.effective),
                "node": i.node,
            }
            for i in t.irqs
        ],
        "notes": list(t.notes),
    }


def _node(n: int | None) -> str:
    return "?" if n is None else str(n)


def render(t: Topology) -> None:
    cores = t.cores()
    smt = max((len(c) for c in cores.values()), default=1)
    out.print(
        styled((t.hostname or "host", "bold")),
        f": {len(t.cpus)} CPUs online "
        f"({format_cpulist(t.online)}), {len(cores)} cores"
        f"{f', SMT x{smt}' if t.smt else ', no SMT'}, {len(t.nodes)} NUMA node"
        f"{'s' if len(t.nodes) != 1 else ''}, {len(t.llcs())} LLC group"
        f"{'s' if len(t.llcs()) != 1 else ''}; cgroups {t.cgroup.mode}"
        f" (cpusets: {t.cgroup.cpuset})",
        sep="",
    )

    nodes = Table(title="NUMA nodes", title_justify="left")
    for col in ("node", "CPUs", "LLC groups (CPUs)", "memory", "distances"):
        nodes.add_column(col)
    llcs = t.llcs()
    for n in t.nodes.values():
        groups = [format_cpulist(cpus) for llc, cpus in llcs.items() if t.cpus[llc].node == n.id]
        mem = f"{n.mem_total_kb / 2**20:.1f} GiB" if n.mem_total_kb else "?"
        nodes.add_row(
            str(n.id),
            format_cpulist(n.cpus),
            "  ".join(groups),
            mem,
            " ".join(map(str, n.distances)),
        )
    show(nodes)

    if t.smt:
        pairs = sorted({format_cpulist(c) for c in cores.values() if len(c) > 1})
        out.print("SMT siblings: " + "  ".join(pairs[:16]) + ("  ..." if len(pairs) > 16 else ""))

    freq = [c.freq for c in t.cpus.values() if c.freq]
    if freq:
        govs = sorted({f.governor for f in freq})
        f0 = freq[0]
        out.print(
            f"cpufreq: {f0.driver}, governor {'/'.join(govs)} (offers "
            f"{' '.join(f0.available_governors)}), {(f0.hw_min_freq or 0) // 1000}-"
            f"{(f0.hw_max_freq or 0) // 1000} MHz" + (f", EPP {f0.epp}" if f0.epp else "")
        )
    else:
        out.print("cpufreq: not available on this host")

    irq_of = {i.irq: i for i in t.irqs}
    dev = Table(title="Devices (in the spirit of nvidia-smi topo -m)", title_justify="left")
    for col in ("device", "kind", "PCI", "NUMA node", "local CPUs", "IRQs"):
        dev.add_column(col)
    for g in t.gpus:
        minor = "" if g.minor is None else f" (minor {g.minor})"
        dev.add_row(
            f"GPU{g.index}",
            f"{g.vendor} {g.name}{minor} [{g.source}]",
            g.pci,
            _node(g.node),
            format_cpulist(g.local_cpus),
            "",
        )
    for n in t.nics:
        where = sorted({format_cpulist(irq_of[i].affinity) for i in n.irqs if i in irq_of})
        irqs = f"{len(n.irqs)} ({format_cpulist(n.irqs)})" if n.irqs else "0"
        if where:
            irqs += " on CPUs " + "; ".join(where[:3]) + ("; ..." if len(where) > 3 else "")
        dev.add_row(n.name, "NIC", n.pci, _node(n.node), format_cpulist(n.local_cpus), irqs)
    if t.gpus or t.nics:
        show(dev)
    if not t.gpus:
        out.print(f"GPUs: none found (NVML: {t.nvml or 'ok'}; sysfs PCI: no GPU-class device)")
    elif t.nvml:
        out.print(f"NVML: {t.nvml} (GPUs found through sysfs PCI)")

    if len(t.gpus) > 1 and len(t.nodes) > 1:
        matrix = Table(title="GPU to NUMA node", title_justify="left")
        matrix.add_column("")
        for n in t.nodes.values():
            matrix.add_column(f"node{n.id}")
        for g in t.gpus:
            matrix.add_row(
                f"GPU{g.index}", *("X" if g.node == n.id else "." for n in t.nodes.values())
            )
        show(matrix)

    moved = [i for i in t.irqs if i.affinity != t.online]
    out.print(
        f"IRQs: {len(t.irqs)} numbered; {len(moved)} with affinity narrower than all CPUs"
        " (hostd topo --json lists each)"
    )
    for note in t.notes:
        out.print(f"note: {note}")


def topo(root: str = RootOpt, as_json: bool = JsonOpt) -> None:
    """Show CPUs, SMT, caches, NUMA nodes, GPUs, NICs and IRQs of this host."""
    t = read_topology(get_host(root))
    if as_json:
        print_json(topo_json(t))
    else:
        render(t)

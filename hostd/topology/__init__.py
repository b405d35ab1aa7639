"""The host's topology as one frozen value: CPUs, cores, SMT, LLCs, NUMA, GPUs, NICs, IRQs.

``read_topology(host)`` builds it through ``hostd.host.Host`` (so it works on fixture trees as
on the live kernel); the planner and ``hostd topo`` consume it. Sources:
Documentation/admin-guide/cputopology.rst (cpu*/topology), Documentation/ABI/testing/
sysfs-devices-system-cpu (cache, cpufreq), sysfs-bus-pci (numa_node, local_cpulist,
msi_irqs), proc(5) (/proc/interrupts) and core-api/irq/irq-affinity.rst (smp_affinity_list).
GPUs come from NVML where it answers, merged with sysfs PCI, and from sysfs PCI alone otherwise.
"""

from __future__ import annotations

import re

from hostd.host import Host, paths
from hostd.host.cgroupfs import read_cgroup_layout
from hostd.host.parsers import (
    parse_distance,
    parse_int,
    parse_interrupts,
    parse_nvidia_minor,
)
from hostd.model.cpus import EMPTY, parse_cpulist
from hostd.model.topology import Cpu, CpuFreq, Gpu, Irq, Nic, Node, Topology

GPU_VENDORS = {0x10DE: "nvidia", 0x1002: "amd"}
# Devices of the kernel's accel subsystem (/dev/accel/accelN, drivers/accel: Intel Gaudi
# through habanalabs, Intel NPU, AMD XDNA, ...), whatever their vendor: an ``accel/accelN``
# entry below the PCI device names their minor. Named vendors; others are "accel".
ACCEL_VENDORS = {0x1DA3: "habana", 0x8086: "intel", 0x1022: "amd"}
# AWS Neuron devices (Inferentia, Trainium: aws-neuronx-dkms, neuron_device.h), vendor Amazon:
# matched by device id, as Amazon's other devices (ENA, EFA, NVMe) share the vendor. The driver
# publishes no link from /dev/neuronN to its PCI device (its class devices have no parent), so a
# Neuron device's minor is unknown: hostd.plan.numa places a Neuron rank only where every Neuron
# device sits on one node.
AMAZON = 0x1D0F
NEURON_DEVICE_IDS = {0x7064, 0x7065, 0x7066, 0x7067, 0x7164, 0x7264, 0x7364, 0x7564, 0x7565}
# PCI class codes (upper 16 bits of the 24-bit class): VGA, 3D controller, other display
# controller (AMD Instinct MI100-MI250), processing accelerator (AMD MI300).
GPU_CLASSES = {0x0300, 0x0302, 0x0380, 0x1200}


# -- readers -----------------------------------------------------------------------------------
_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")


def _cpulist(host: Host, rel: str) -> frozenset[int]:
    text = host.read_line(rel)
    return parse_cpulist(text) if text else EMPTY


def _read_cpufreq(host: Host, cpu: int) -> CpuFreq | None:
    governor = host.read_line(paths.cpufreq(cpu, "scaling_governor"))
    if governor is None:
        return None

    def words(name: str) -> tuple[str, ...]:
        return tuple((host.read_line(paths.cpufreq(cpu, name)) or "").split())

    return CpuFreq(
        driver=host.read_line(paths.cpufreq(cpu, "scaling_driver")) or "",
        governor=governor,
        available_governors=words("scaling_available_governors"),
        min_freq=parse_int(host.read_line(paths.cpufreq(cpu, "scaling_min_freq"))),
        max_freq=parse_int(host.read_line(paths.cpufreq(cpu, "scaling_max_freq"))),
        hw_min_freq=parse_int(host.read_line(paths.cpufreq(cpu, "cpuinfo_min_freq"))),
        hw_max_freq=parse_int(host.read_line(paths.cpufreq(cpu, "cpuinfo_max_freq"))),
        epp=host.read_line(paths.cpufreq(cpu, "energy_performance_preference")),
        available_epp=words("energy_performance_available_preferences"),
    )


def _read_nodes(host: Host, online: frozenset[int]) -> dict[int, Node]:
    nodes: dict[int, Node] = {}
    for entry in host.listdir(paths.NODES):
        match = _NODE_DIR.match(entry)
        if not match:
            continue
        nid = int(match.group(1))
        meminfo = host.read_quiet(paths.node(nid, "meminfo")) or ""
        mem = re.search(r"MemTotal:\s+(\d+)", meminfo)
        nodes[nid] = Node(
            id=nid,
            cpus=_cpulist(host, paths.node(nid, "cpulist")) & online,
            distances=parse_distance(host.read_line(paths.node(nid, "distance")) or ""),
            mem_total_kb=int(mem.group(1)) if mem else None,
        )
    if not nodes:  # kernels without CONFIG_NUMA: one node holding everything
        nodes[0] = Node(0, online, (10,), None)
    return dict(sorted(nodes.items()))


def _read_cpus(host: Host, online: frozenset[int], nodes: dict[int, Node]) -> dict[int, Cpu]:
    node_of = {cpu: node.id for node in nodes.values() for cpu in node.cpus}
    cpus: dict[int, Cpu] = {}
    for cpu in sorted(online):
        siblings = (
            _cpulist(host, paths.cpu(cpu, "topology/core_cpus_list"))
            or _cpulist(host, paths.cpu(cpu, "topology/thread_siblings_list"))
            or frozenset({cpu})
        ) & online or frozenset({cpu})
        llc_cpus = frozenset({cpu})
        best_level = -1
        for index in host.listdir(paths.cpu(cpu, "cache")):
            if not index.startswith("index"):
                continue
            ctype = host.read_line(paths.cpu(cpu, f"cache/{index}/type"))
            level = parse_int(host.read_line(paths.cpu(cpu, f"cache/{index}/level")), -1)
            if ctype == "Instruction" or level is None or level <= best_level:
                continue
            shared = _cpulist(host, paths.cpu(cpu, f"cache/{index}/shared_cpu_list")) & online
            if shared:
                best_level, llc_cpus = level, shared
        cpus[cpu] = Cpu(
            id=cpu,
            package=parse_int(host.read_line(paths.cpu(cpu, "topology/physical_package_id")), 0)
            or 0,
            core=min(siblings),
            siblings=siblings,
            llc=min(llc_cpus),
            node=node_of.get(cpu, min(nodes)),
            freq=_read_cpufreq(host, cpu),
        )
    return cpus


def _pci_node(host: Host, pci: str) -> int | None:
    node = parse_int(host.read_line(paths.pci(pci, "numa_node")), -1)
    return None if node is None or node < 0 else node


def _pci_local_cpus(host: Host, pci: str, online: frozenset[int]) -> frozenset[int]:
    return _cpulist(host, paths.pci(pci, "local_cpulist")) & online or online


def _read_gpus(host: Host, online: frozenset[int]) -> tuple[tuple[Gpu, ...], str]:
    nvml, why = host.nvml()
    nvml_by_pci = {g.pci_bus_id: g for g in nvml.gpus} if nvml else {}
    found: list[tuple[str, str, int | None, str]] = []  # (pci, vendor, minor, name)
    for pci in sorted(host.listdir(paths.PCI_DEVICES)):
        vendor_id = parse_int(host.read_line(paths.pci(pci, "vendor")), 0) or 0
        vendor = GPU_VENDORS.get(vendor_id)
        pci_class = parse_int(host.read_line(paths.pci(pci, "class")), 0) or 0
        accels = sorted(
            int(d[len("accel") :])
            for d in host.listdir(paths.pci(pci, "accel"))
            if d.startswith("accel") and d[len("accel") :].isdigit()
        )
        minor: int | None = None
        name = ""
        device_id = parse_int(host.read_line(paths.pci(pci, "device")), 0) or 0
        if vendor_id == AMAZON and device_id in NEURON_DEVICE_IDS:
            found.append((pci, "neuron", None, "AWS Neuron device"))
            continue
        if accels:  # /dev/accel/accelN: its minor names it, whoever made it
            maker = ACCEL_VENDORS.get(vendor_id, "accel")
            found.append((pci, f"accel:{maker}", accels[0], f"{maker} accelerator"))
            continue
        if vendor is None or (pci_class >> 8) not in GPU_CLASSES:
            continue
        if vendor == "nvidia":
            info = host.read_quiet(paths.nvidia_gpu_information(pci)) or ""
            minor = parse_nvidia_minor(info)
            model = re.search(r"^Model:\s*(.+)$", info, re.MULTILINE)
            name = model.group(1).strip() if model else ""
        else:
            renders = sorted(
                d for d in host.listdir(paths.pci(pci, "drm")) if d.startswith("renderD")
            )
            minor = int(renders[0][len("renderD") :]) if renders else None
        found.append((pci, vendor, minor, name))
    gpus: list[Gpu] = []
    seen: set[str] = set()
    for g in nvml.gpus if nvml else ():
        seen.add(g.pci_bus_id)
        gpus.append(
            Gpu(
                index=g.index,
                vendor="nvidia",
                name=g.name,
                pci=g.pci_bus_id,
                node=_pci_node(host, g.pci_bus_id),
                local_cpus=_pci_local_cpus(host, g.pci_bus_id, online),
                minor=g.minor,
                source="nvml",
            )
        )
    for pci, vendor, minor, name in found:
        if pci in seen or pci in nvml_by_pci:
            continue
        gpus.append(
            Gpu(
                index=len(gpus),
                vendor=vendor,
                name=name or f"{vendor} GPU",
                pci=pci,
                node=_pci_node(host, pci),
                local_cpus=_pci_local_cpus(host, pci, online),
                minor=minor,
                source="sysfs",
            )
        )
    return tuple(gpus), why


def _read_nics(host: Host, online: frozenset[int]) -> tuple[Nic, ...]:
    nics: list[Nic] = []
    for name in sorted(host.listdir(paths.NET)):
        pci = host.pci_address_of(paths.net_device(name))
        if pci is None:
            continue  # virtual interface (lo, veth, bridges): no IRQs of its own
        irqs = sorted(int(i) for i in host.listdir(paths.pci(pci, "msi_irqs")) if i.isdigit())
        nics.append(
            Nic(
                name=name,
                pci=pci,
                node=_pci_node(host, pci),
                local_cpus=_pci_local_cpus(host, pci, online),
                irqs=tuple(irqs),
            )
        )
    return tuple(nics)


def _read_irqs(host: Host) -> tuple[Irq, ...]:
    irqs: list[Irq] = []
    for line in parse_interrupts(host.read_quiet(paths.INTERRUPTS) or ""):
        node = parse_int(host.read_line(paths.irq(line.irq, "node")), -1)
        irqs.append(
            Irq(
                irq=line.irq,
                chip=line.chip,
                name=line.name,
                count=sum(line.counts),
                affinity=_cpulist(host, paths.irq(line.irq, "smp_affinity_list")),
                effective=_cpulist(host, paths.irq(line.irq, "effective_affinity_list")),
                node=None if node is None or node < 0 else node,
            )
        )
    return tuple(irqs)


def read_topology(host: Host) -> Topology:
    """Snapshot the topology of ``host``. Missing files degrade to defaults, never raise."""
    online = _cpulist(host, paths.CPUS_ONLINE)
    notes: list[str] = []
    if not online:
        online = frozenset(
            int(m.group(1)) for e in host.listdir(paths.CPUS) if (m := _CPU_DIR.match(e))
        ) or frozenset({0})
        notes.append("no sys/devices/system/cpu/online: assumed every listed CPU is online")
    nodes = _read_nodes(host, online)
    cpus = _read_cpus(host, online, nodes)
    gpus, nvml_why = _read_gpus(host, online)
    return Topology(
        hostname=host.read_line(paths.sysctl("kernel/hostname")) or "",
        cpus=cpus,
        nodes=nodes,
        gpus=gpus,
        nics=_read_nics(host, online),
        irqs=_read_irqs(host),
        cgroup=read_cgroup_layout(host),
        smt=any(len(c.siblings) > 1 for c in cpus.values()),
        nvml=nvml_why,
        autogroup=host.read_line(paths.sysctl("kernel/sched_autogroup_enabled")) == "1",
        notes=tuple(notes),
    )

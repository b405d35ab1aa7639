"""The host's topology as one frozen value: CPUs, cores, SMT, LLCs, NUMA, GPUs, NICs, IRQs.

``hostd.topology.read_topology`` reads it (through ``Host``); this module only defines it, so
the pure core can plan over it without importing the kernel door.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CpuFreq:
    driver: str
    governor: str
    available_governors: tuple[str, ...]
    min_freq: int | None  # kHz, scaling_min_freq
    max_freq: int | None
    hw_min_freq: int | None  # cpuinfo_min_freq
    hw_max_freq: int | None
    epp: str | None  # energy_performance_preference (intel_pstate/amd-pstate active mode)
    available_epp: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Cpu:
    id: int
    package: int
    core: int  # the id of the core: the lowest CPU id among its SMT siblings
    siblings: frozenset[int]
    llc: int  # the id of its last-level cache group: the lowest CPU id sharing it
    node: int
    freq: CpuFreq | None = None


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    cpus: frozenset[int]
    distances: tuple[int, ...]
    mem_total_kb: int | None


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    vendor: str  # "nvidia" | "amd" | "accel:VENDOR" (the kernel's accel subsystem: "accel:habana")
    name: str
    pci: str
    node: int | None  # None when the firmware did not say (numa_node = -1)
    local_cpus: frozenset[int]
    minor: int | None  # /dev/nvidiaN for NVIDIA; the renderD minor for AMD; /dev/accel/accelN
    source: str  # "nvml" | "sysfs"


@dataclass(frozen=True, slots=True)
class Nic:
    name: str
    pci: str
    node: int | None
    local_cpus: frozenset[int]
    irqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Irq:
    irq: int
    chip: str
    name: str
    count: int
    affinity: frozenset[int]
    effective: frozenset[int]
    node: int | None


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    mode: str  # "v1" | "v2" | "hybrid" | "none"
    v2_mount: str | None  # absolute path as mounted on the host, e.g. "/sys/fs/cgroup"
    v2_controllers: tuple[str, ...]
    v1_mounts: tuple[tuple[str, str], ...]  # (controller, mount point)
    cpuset: str  # "v1" | "v2" | "none": where hostd would write cpusets

    def v1_mount(self, controller: str) -> str | None:
        return dict(self.v1_mounts).get(controller)


@dataclass(frozen=True, slots=True)
class Topology:
    hostname: str
    cpus: dict[int, Cpu]  # online CPUs by id
    nodes: dict[int, Node]
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    irqs: tuple[Irq, ...]
    cgroup: CgroupLayout
    smt: bool
    nvml: str = ""  # "" when NVML answered, else why not
    autogroup: bool = False  # kernel.sched_autogroup_enabled: CFS weighs sessions as groups
    notes: tuple[str, ...] = field(default=())

    @property
    def online(self) -> frozenset[int]:
        return frozenset(self.cpus)

    def node_of(self, cpu: int) -> int:
        return self.cpus[cpu].node

    def cores(self) -> dict[int, frozenset[int]]:
        """{core id: its online SMT siblings}."""
        result: dict[int, set[int]] = {}
        for cpu in self.cpus.values():
            result.setdefault(cpu.core, set()).add(cpu.id)
        return {core: frozenset(cpus) for core, cpus in sorted(result.items())}

    def llcs(self) -> dict[int, frozenset[int]]:
        result: dict[int, set[int]] = {}
        for cpu in self.cpus.values():
            result.setdefault(cpu.llc, set()).add(cpu.id)
        return {llc: frozenset(cpus) for llc, cpus in sorted(result.items())}

    def gpu_by_minor(self, vendor: str, minor: int) -> Gpu | None:
        for gpu in self.gpus:
            if gpu.vendor == vendor and gpu.minor == minor:
                return gpu
        return None

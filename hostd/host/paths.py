"""Where each kernel file hostd reads or writes lives, relative to a host's root.

Every ``/proc`` and ``/sys`` path hostd uses is named here and nowhere else, so that a reader
can see at one glance what hostd touches, and a fixture tree (``tests/fixtures/hosts/``) can be
checked against it. Callers pass these to ``Host`` (``host.read(paths.task(pid, tid,
"schedstat"))``); ``parsers.py`` beside this module turns their text into values. A cgroup's
own interface files (``cgroup.procs``, ``cpuset.cpus``, ``cpu.idle``) are named by the knob
kinds that own them, below the hierarchy's mount that ``cgroupfs.py`` finds.

References: proc(5), sysfs-devices-system-cpu (cpufreq, topology, cache), sysfs-bus-pci
(numa_node, local_cpulist, msi_irqs), core-api/irq/irq-affinity.rst (smp_affinity_list).
"""

from __future__ import annotations

# --- /proc: processes and threads (proc(5)) -------------------------------------------------

PROC = "proc"


def proc(pid: int | str, name: str = "") -> str:
    """``proc/PID`` or a file of it: ``stat``, ``cmdline``, ``exe``, ``comm``, ``cgroup``,
    ``autogroup``, ``maps``, ``numa_maps``, ``fd``, ``task``."""
    return f"proc/{pid}/{name}" if name else f"proc/{pid}"


def task(pid: int | str, tid: int | str, name: str = "") -> str:
    """``proc/PID/task/TID`` or a file of it: ``stat``, ``status``, ``schedstat``."""
    return f"proc/{pid}/task/{tid}/{name}" if name else f"proc/{pid}/task/{tid}"


def any_task(tid: int | str, name: str) -> str:
    """A glob for thread TID's file under whichever process holds it (fixture trees)."""
    return f"proc/[0-9]*/task/{tid}/{name}"


SELF_STATUS = "proc/self/status"


def own_fd(fd: int) -> str:
    """The agent's own ``/proc/self/fd/N``, absolute: it names a file the agent holds (an
    ``O_PATH`` descriptor to open for real), never a file below a host's root."""
    return f"/proc/self/fd/{fd}"


SELF_MOUNTINFO = "proc/self/mountinfo"
SELF_PID_NS = "proc/self/ns/pid"
UPTIME = "proc/uptime"
DEVICES = "proc/devices"
CMDLINE = "proc/cmdline"
CONFIG_GZ = "proc/config.gz"
INTERRUPTS = "proc/interrupts"
STAT = "proc/stat"  # per-CPU busy and idle ticks (self-sizing layers' utilisation)


def sysctl(name: str) -> str:
    """``proc/sys/NAME``, e.g. ``kernel/hostname``, ``kernel/random/boot_id``."""
    return f"proc/sys/{name}"


# --- IRQs (core-api/irq/irq-affinity.rst) ----------------------------------------------------

IRQS = "proc/irq"


def irq(number: int | str, name: str = "") -> str:
    """``proc/irq/N`` or a file of it: ``smp_affinity_list``, ``node``, ``effective_affinity``."""
    return f"proc/irq/{number}/{name}" if name else f"proc/irq/{number}"


def nvidia_gpu_information(pci: str) -> str:
    """The NVIDIA driver's description of the GPU at PCI address ``pci``."""
    return f"proc/driver/nvidia/gpus/{pci}/information"


# --- /sys: CPUs, NUMA nodes, PCI devices, NICs ------------------------------------------------

CPUS = "sys/devices/system/cpu"
CPUS_ONLINE = "sys/devices/system/cpu/online"
NODES = "sys/devices/system/node"
PCI_DEVICES = "sys/bus/pci/devices"
NET = "sys/class/net"
CGROUP_MOUNT = "sys/fs/cgroup"
DEBUG_PREEMPT = "sys/kernel/debug/sched/preempt"


def cpu(number: int | str, name: str = "") -> str:
    """``sys/devices/system/cpu/cpuN/`` or a file below it (``topology/core_id``,
    ``cache/index3/shared_cpu_list``)."""
    return f"{CPUS}/cpu{number}/{name}"


def cpufreq(number: int | str, name: str) -> str:
    """A cpufreq file of CPU N: ``scaling_governor``, ``scaling_available_governors``, ..."""
    return f"{CPUS}/cpu{number}/cpufreq/{name}"


def node(number: int | str, name: str = "") -> str:
    """``sys/devices/system/node/nodeN/`` or a file below it (``cpulist``, ``meminfo``)."""
    return f"{NODES}/node{number}/{name}"


def pci(address: str, name: str = "") -> str:
    """``sys/bus/pci/devices/ADDRESS/`` or a file below it (``class``, ``numa_node``, ...)."""
    return f"{PCI_DEVICES}/{address}/{name}"


def net_device(name: str) -> str:
    """The link from a network interface to its device (a PCI address for a PCI NIC)."""
    return f"{NET}/{name}/device"


CPU_DMA_LATENCY = "dev/cpu_dma_latency"  # PM QoS (admin-guide/pm/cpuidle.rst)


def boot_config(release: str) -> str:
    """The kernel's build configuration as distributions install it."""
    return f"boot/config-{release}"


# --- The node's managers' own state (read only, root's files): the node model -----------------


def containerd_bundle(container: str) -> str:
    """The OCI bundle's spec of a container of containerd's CRI (``k8s.io`` namespace): its
    annotations say the pod (``io.kubernetes.cri.sandbox-namespace``, ``-name``)."""
    return f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{container}/config.json"


def crio_bundle(container: str) -> str:
    """CRI-O's OCI spec of a container (``io.kubernetes.pod.namespace``, ``.name``, and the
    pod's own annotations in ``io.kubernetes.cri-o.Annotations``)."""
    return f"run/containers/storage/overlay-containers/{container}/userdata/config.json"


def docker_container(container: str) -> str:
    """dockerd's record of a container (cri-dockerd's pods: labels ``io.kubernetes.pod.*``)."""
    return f"var/lib/docker/containers/{container}/config.v2.json"


def logind_session(session: str) -> str:
    """logind's record of login session N (``SERVICE=``, ``TTY=``, ``UID=``)."""
    return f"run/systemd/sessions/{session}"

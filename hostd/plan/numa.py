"""NUMA targets: which node a process of a ``gpu-local`` layer belongs on (its GPUs' nodes)."""

from __future__ import annotations

from collections import Counter

from hostd.model.tasks import Process
from hostd.model.topology import Topology


def process_gpu_nodes(topo: Topology, proc: Process) -> tuple[int, ...]:
    """The NUMA nodes of the GPUs a process holds open (by /dev/nvidiaN, a renderD minor with
    /dev/kfd, or /dev/accel/accelN; /dev/neuronN: the node of every Neuron device, if one)."""
    nodes = []
    for minor in proc.nvidia_minors:
        gpu = topo.gpu_by_minor("nvidia", minor)
        if gpu is not None and gpu.node is not None:
            nodes.append(gpu.node)
    if "/dev/kfd" in proc.gpu_devices:
        for dev in proc.gpu_devices:
            if dev.startswith("/dev/dri/renderD") and dev[16:].isdigit():
                gpu = topo.gpu_by_minor("amd", int(dev[16:]))
                if gpu is not None and gpu.node is not None:
                    nodes.append(gpu.node)
    for dev in proc.gpu_devices:
        if dev.startswith("/dev/accel/accel") and dev[16:].isdigit():
            accel = int(dev[16:])
            gpu = next(
                (g for g in topo.gpus if g.vendor.startswith("accel") and g.minor == accel), None
            )
            if gpu is not None and gpu.node is not None:
                nodes.append(gpu.node)
    if any(dev.startswith("/dev/neuron") and dev[11:].isdigit() for dev in proc.gpu_devices):
        # which PCI device /dev/neuronN is, the driver does not say: only one node for all
        neuron = {g.node for g in topo.gpus if g.vendor == "neuron"}
        if len(neuron) == 1 and None not in neuron:
            nodes.append(neuron.pop())
    return tuple(nodes)


def _target_node(topo: Topology, proc: Process) -> int | None:
    """The node most of the process's GPUs sit on (lowest id on a tie)."""
    nodes = process_gpu_nodes(topo, proc)
    if not nodes:
        return None
    counts = Counter(nodes)
    return min(counts, key=lambda n: (-counts[n], n))

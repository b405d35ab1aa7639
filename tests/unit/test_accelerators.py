"""Accelerators beyond NVIDIA and AMD: devices of the kernel's accel subsystem (Intel Gaudi
through habanalabs, /dev/accel/accelN) found in sysfs with their NUMA node, and a process that
holds one placed on that node; AWS Neuron devices found by PCI id, a process that holds one
placed only where all of them share a node; Habana's older nodes count as accelerator files."""

from __future__ import annotations

from hostd.host import Host
from hostd.model.tasks import Process
from hostd.plan.numa import process_gpu_nodes
from hostd.topology import read_topology
from tests.fakes import host_copy

GAUDI = "0000:c1:00.0"


def _with_a_gaudi(tmp_path):
    tree = host_copy(tmp_path)
    dev = tree / "sys" / "bus" / "pci" / "devices" / GAUDI
    (dev / "accel" / "accel2").mkdir(parents=True)
    for name, text in (
        ("vendor", "0x1da3"),
        ("device", "0x1020"),
        ("class", "0x120000"),
        ("numa_node", "1"),
        ("local_cpulist", "16-31,48-63"),
    ):
        (dev / name).write_text(text + "\n")
    return tree


def _process(devices):
    return Process(1, 1, "python3", 0, "", "/", "/", "", None, tuple(devices), False, False)


def test_an_accel_device_is_found_with_its_node_and_minor(tmp_path):
    topo = read_topology(Host(_with_a_gaudi(tmp_path)))
    gaudi = next(g for g in topo.gpus if g.pci == GAUDI)
    assert (gaudi.vendor, gaudi.minor, gaudi.node, gaudi.source) == ("accel:habana", 2, 1, "sysfs")
    assert gaudi.local_cpus == frozenset([*range(16, 32), *range(48, 64)])
    # the eight H100s are still there, found by NVML
    assert sum(g.vendor == "nvidia" for g in topo.gpus) == 8
    assert process_gpu_nodes(topo, _process(["/dev/accel/accel2"])) == (1,)
    assert process_gpu_nodes(topo, _process(["/dev/accel/accel7"])) == ()


def test_every_accelerator_file_makes_a_gpu_process():
    for dev in ("/dev/nvidia0", "/dev/kfd", "/dev/accel/accel0", "/dev/hl0", "/dev/neuron3"):
        assert _process([dev]).gpu, dev
    assert not _process(["/dev/dri/renderD128"]).gpu  # a render node alone: desktops open them


def _with_neurons(tmp_path, nodes, device=0x7164):
    tree = host_copy(tmp_path)
    for n, node in enumerate(nodes):
        dev = tree / "sys" / "bus" / "pci" / "devices" / f"0000:{0x10 + n:02x}:1c.0"
        dev.mkdir(parents=True)
        for name, text in (("vendor", "0x1d0f"), ("device", f"0x{device:04x}"),
                           ("class", "0x120000"), ("numa_node", str(node))):  # fmt: skip
            (dev / name).write_text(text + "\n")
    return tree


def test_neuron_devices_and_where_their_ranks_go(tmp_path):
    one = read_topology(Host(_with_neurons(tmp_path / "a", [1, 1])))
    assert [(g.vendor, g.minor, g.node) for g in one.gpus if g.vendor == "neuron"] == [
        ("neuron", None, 1), ("neuron", None, 1)
    ]  # fmt: skip
    assert process_gpu_nodes(one, _process(["/dev/neuron1"])) == (1,)
    two = read_topology(Host(_with_neurons(tmp_path / "b", [0, 1])))
    assert process_gpu_nodes(two, _process(["/dev/neuron1"])) == ()  # which one is it?
    # Amazon's other devices (an ENA NIC: 0x1d0f:0xec20) are no accelerators
    nic = read_topology(Host(_with_neurons(tmp_path / "c", [0], device=0xEC20)))
    assert not [g for g in nic.gpus if g.vendor == "neuron"]

"""The VM's live topology as hostd reads it, and the planner's NUMA choices on it.

The kernel must show the shape tests/vm/vm.py asks QEMU for (``NUMA_NODES`` nodes of
``CPUS_PER_NODE`` CPUs, one socket each, numbered in order), and ``read_topology(Host())`` must
see the nodes sysfs lists (conftest's ``NODES``, read from ``nodeN/cpulist``) and a cgroup-v2
cpuset hierarchy; ``hostd topo --json`` and ``hostd plan --json`` must say the same from the
command line. The VM has no GPU, so one is added to the live topology as a value (a GPU on the
highest node, ``dataclasses.replace``), and a ``numa = "gpu-local"`` layer asking for as many
CPUs as that node has, holding a process that uses the GPU, must get exactly that node's CPUs
and a NUMA target of that node (threads built as tests/unit/test_plan.py does).
"""

from __future__ import annotations

import dataclasses
import json

from hostd.classify import Classifier
from hostd.model.topology import Gpu
from hostd.plan import plan
from hostd.policy import parse_policy
from hostd.topology import read_topology
from tests import synth
from tests.vm import vm
from tests.vm.inside.conftest import NODES, ONLINE, hostd_here

# {CPUS}: how many CPUs the layer asks for (min = max), the GPU's node's count in the test.
POLICY = """
version = 1

[[layer]]
name = "trainer"
comment = "processes holding a GPU"
match = [[{ gpu = true }]]
kind = "confined"
cpus = { min = {CPUS}, max = {CPUS} }
numa = "gpu-local"

[[layer]]
name = "rest"
comment = "everything else"
match = [[]]
kind = "open"
"""


def test_live_topology_has_the_vms_nodes_and_cgroup_v2_cpusets(host):
    # What vm.py asks QEMU for: node N holds CPUs N*CPUS_PER_NODE ... (N+1)*CPUS_PER_NODE-1.
    per = vm.CPUS_PER_NODE
    asked = {n: frozenset(range(n * per, (n + 1) * per)) for n in range(vm.NUMA_NODES)}
    assert asked == NODES  # what the kernel lists in sysfs
    assert frozenset(range(vm.VCPUS)) == ONLINE
    topo = read_topology(host)
    assert topo.online == ONLINE
    assert {nid: node.cpus for nid, node in topo.nodes.items()} == NODES
    assert {cpu.id: cpu.node for cpu in topo.cpus.values()} == {
        cpu: nid for nid, cpus in NODES.items() for cpu in cpus
    }
    # One socket per node: a node's CPUs share a package, no two nodes do.
    packages = {nid: {topo.cpus[cpu].package for cpu in cpus} for nid, cpus in NODES.items()}
    assert all(len(ids) == 1 for ids in packages.values()), packages
    assert len(set().union(*packages.values())) == len(NODES), packages
    for nid, node in topo.nodes.items():  # each node is nearest to itself
        assert len(node.distances) == len(NODES)
        local = node.distances[nid]
        assert all(local < d for other, d in enumerate(node.distances) if other != nid)
    # Each node's memory backend: all of it usable but what the kernel keeps for itself.
    assert all(0 < node.mem_total_kb <= vm.NODE_MEM_MIB * 1024 for node in topo.nodes.values())
    assert (topo.cgroup.mode, topo.cgroup.cpuset) == ("v2", "v2")
    assert topo.gpus == ()


def test_hostd_topo_and_plan_read_the_live_vm():
    topo = json.loads(hostd_here("topo", "--json").stdout)
    assert [(n["id"], n["cpus"]) for n in topo["nodes"]] == [
        (nid, sorted(cpus)) for nid, cpus in NODES.items()
    ]
    assert topo["online"] == sorted(ONLINE)
    assert topo["cgroup"]["mode"] == "v2" and topo["cgroup"]["cpuset"] == "v2"
    assert "cpuset" in topo["cgroup"]["v2_controllers"]
    plan_json = json.loads(hostd_here("plan", "--json").stdout)
    assert plan_json["online"] == sorted(ONLINE) and plan_json["schema"] == 2
    assert {layer["name"] for layer in plan_json["layers"]} >= {"trainer", "rest"}


def test_gpu_local_layer_gets_the_gpu_node_cpus(host):
    live = read_topology(host)
    node = max(live.nodes)  # the GPU sits on the highest node: not node 0, where CPU 0 is
    assert node != 0, "the VM has one NUMA node"
    local = live.nodes[node].cpus
    gpu = Gpu(0, "nvidia", "H100", "0000:00:1f.0", node, local, 0, "sysfs")
    topo = dataclasses.replace(live, gpus=(gpu,))
    online = topo.online
    devices = ("/dev/nvidiactl", "/dev/nvidia0")
    rank = synth.process(200, parent_comm="pt_elastic", gpu_devices=devices)
    other = synth.process(300, "stress-ng")
    tasks = synth.threads(rank, 4, online=online) + synth.threads(other, 2, online=online)
    # The layer asks for as many CPUs as the GPU's node has: it must get that node, whole.
    policy = parse_policy(POLICY.replace("{CPUS}", str(len(local))).encode(), "vm-test.toml")
    p = plan(topo, Classifier(policy).classify_all(tasks), policy)

    trainer = p.layer("trainer")
    assert trainer.cpus == local
    assert trainer.mems == {node}
    assert [(n.pid, n.node) for n in p.numa] == [(200, node)]
    # The only layer with CPUs of its own is the trainer: the pool is every other online CPU.
    assert p.pool == online - local
    by_tid = {t.tid: t for t in p.tasks}
    for task in tasks[:4]:
        assert by_tid[task.tid].affinity == local
    for task in tasks[4:]:
        planned = by_tid.get(task.tid)
        assert planned is None or planned.affinity in (None, online - local)

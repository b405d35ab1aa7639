"""The VM's live topology as hostd reads it, and the planner's NUMA choices on it.

``read_topology(Host())`` must see 2 nodes (CPUs 0-1 and 2-3) and a cgroup-v2 cpuset
hierarchy; ``hostd topo --json`` and ``hostd plan --json`` must say the same from the command
line. The VM has no GPU, so one is added to the live topology as a value (a GPU on node 1,
``dataclasses.replace``), and a ``numa = "gpu-local"`` layer holding a process that uses it must
get node 1's CPUs and a NUMA target of node 1 (threads built as tests/unit/test_plan.py does).
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
from tests.vm.inside.conftest import NODE0, NODE1, hostd_here

POLICY = b"""
version = 1

[[layer]]
name = "trainer"
comment = "processes holding a GPU"
match = [[{ gpu = true }]]
kind = "confined"
cpus = { min = 2, max = 2 }
numa = "gpu-local"

[[layer]]
name = "rest"
comment = "everything else"
match = [[]]
kind = "open"
"""


def test_live_topology_has_two_nodes_and_cgroup_v2_cpusets(host):
    topo = read_topology(host)
    assert topo.online == NODE0 | NODE1
    assert {nid: node.cpus for nid, node in topo.nodes.items()} == {0: NODE0, 1: NODE1}
    assert topo.nodes[0].distances[0] < topo.nodes[0].distances[1]
    assert all(node.mem_total_kb for node in topo.nodes.values())
    assert {cpu.id: cpu.node for cpu in topo.cpus.values()} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert (topo.cgroup.mode, topo.cgroup.cpuset) == ("v2", "v2")
    assert topo.gpus == ()


def test_hostd_topo_and_plan_read_the_live_vm():
    topo = json.loads(hostd_here("topo", "--json").stdout)
    assert [(n["id"], n["cpus"]) for n in topo["nodes"]] == [(0, [0, 1]), (1, [2, 3])]
    assert topo["cgroup"]["mode"] == "v2" and topo["cgroup"]["cpuset"] == "v2"
    assert "cpuset" in topo["cgroup"]["v2_controllers"]
    plan_json = json.loads(hostd_here("plan", "--json").stdout)
    assert plan_json["online"] == [0, 1, 2, 3] and plan_json["schema"] == 2
    assert {layer["name"] for layer in plan_json["layers"]} >= {"trainer", "rest"}


def test_gpu_local_layer_gets_the_gpu_node_cpus(host):
    live = read_topology(host)
    gpu = Gpu(0, "nvidia", "H100", "0000:00:1f.0", 1, live.nodes[1].cpus, 0, "sysfs")
    topo = dataclasses.replace(live, gpus=(gpu,))
    online = topo.online
    devices = ("/dev/nvidiactl", "/dev/nvidia0")
    rank = synth.process(200, parent_comm="pt_elastic", gpu_devices=devices)
    other = synth.process(300, "stress-ng")
    tasks = synth.threads(rank, 4, online=online) + synth.threads(other, 2, online=online)
    policy = parse_policy(POLICY, "vm-test.toml")
    p = plan(topo, Classifier(policy).classify_all(tasks), policy)

    trainer = p.layer("trainer")
    assert trainer.cpus == NODE1
    assert trainer.mems == {1}
    assert [(n.pid, n.node) for n in p.numa] == [(200, 1)]
    assert p.pool == NODE0
    by_tid = {t.tid: t for t in p.tasks}
    for task in tasks[:4]:
        assert by_tid[task.tid].affinity == NODE1
    for task in tasks[4:]:
        planned = by_tid.get(task.tid)
        assert planned is None or planned.affinity in (None, NODE0)

"""cgroup v2 cpusets on a real multi-node kernel, written through hostd's v2 writer and ``Host``.

The planner will use v2 cpusets for layers; this checks what the writer
(``hostd.cpuset.cgroup.write_v2_cpuset``) and the kernel do: a child on node 1 as a partition
root takes its CPUs away from the root cgroup, a process moved in is confined to them, and
taking it all away gives everything back. Documentation/admin-guide/cgroup-v2.rst, "Cpuset".
Node 1's CPUs, the other nodes' and every node id are read from the live kernel (conftest's
``NODE1``, ``ONLINE``, ``ALL_MEMS``), so the expectations hold for any VM shape with a node 1.
"""

from __future__ import annotations

import errno

import pytest

from hostd.cpuset.cgroup import write_v2_cpuset
from hostd.host.cgroupfs import read_cgroup_layout
from hostd.model.cpus import format_cpulist, parse_cpulist
from tests.vm.inside.conftest import ALL_MEMS, NODE1, ONLINE, cpus_allowed, status_field

GROUP = "hostd-vmtest"
ALL = ONLINE
REST = ALL - NODE1  # every online CPU not on node 1


def test_the_vm_has_cgroup_v2_with_the_cpuset_controller(host):
    layout = read_cgroup_layout(host)
    assert layout.mode == "v2"
    assert layout.v2_mount == "/sys/fs/cgroup"
    assert "cpuset" in layout.v2_controllers
    assert layout.cpuset == "v2"
    assert layout.v1_mounts == ()


def test_partition_root_on_node_1_takes_its_cpus_and_gives_them_back(host, v2, sleeper):
    assert parse_cpulist(v2.read("", "cpuset.cpus.effective")) == ALL
    assert cpus_allowed(sleeper.pid) == ALL
    v2.create(GROUP)
    write_v2_cpuset(host, GROUP, NODE1, frozenset({1}), partition="root")
    assert v2.read(GROUP, "cpuset.cpus.partition") == "root"
    assert parse_cpulist(v2.read(GROUP, "cpuset.cpus.effective")) == NODE1
    assert v2.read(GROUP, "cpuset.mems.effective") == "1"
    # An exclusive partition: the root cgroup (where everything else runs) lost node 1's CPUs.
    assert parse_cpulist(v2.read("", "cpuset.cpus.effective")) == REST

    v2.move(sleeper.pid, GROUP)
    assert cpus_allowed(sleeper.pid) == NODE1
    assert status_field(sleeper.pid, "Mems_allowed_list") == "1"
    assert str(sleeper.pid) in v2.read(GROUP, "cgroup.procs").split()

    # Take it away: the process back to the root, the partition back to a member, the group.
    v2.move(sleeper.pid)
    v2.write(GROUP, "cpuset.cpus.partition", "member")
    assert parse_cpulist(v2.read("", "cpuset.cpus.effective")) == ALL
    v2.cleanup()
    assert not host.exists(f"sys/fs/cgroup/{GROUP}")
    assert cpus_allowed(sleeper.pid) == ALL
    assert status_field(sleeper.pid, "Mems_allowed_list") == format_cpulist(ALL_MEMS)


def test_member_child_shares_its_cpus_with_the_root(host, v2, sleeper):
    v2.create(GROUP)
    write_v2_cpuset(host, GROUP, NODE1, frozenset({1}))
    assert v2.read(GROUP, "cpuset.cpus.partition") == "member"
    assert parse_cpulist(v2.read("", "cpuset.cpus.effective")) == ALL  # nothing taken away
    v2.move(sleeper.pid, GROUP)
    assert cpus_allowed(sleeper.pid) == NODE1
    # Widening the group's CPUs widens its processes' affinity (v2 recomputes it).
    write_v2_cpuset(host, GROUP, ALL, ALL_MEMS)
    assert cpus_allowed(sleeper.pid) == ALL
    assert status_field(sleeper.pid, "Mems_allowed_list") == format_cpulist(ALL_MEMS)
    write_v2_cpuset(host, GROUP, NODE1, frozenset({1}))
    assert cpus_allowed(sleeper.pid) == NODE1
    assert status_field(sleeper.pid, "Mems_allowed_list") == "1"


def test_affinity_outside_the_cpuset_is_refused(host, v2, sleeper):
    """Where a process's cpuset excludes a CPU, sched_setaffinity to it alone fails (EINVAL):
    on v2 hostd enforces layers by affinity, and must expect this from containers' cpusets."""
    v2.create(GROUP)
    write_v2_cpuset(host, GROUP, NODE1, frozenset({1}))
    v2.move(sleeper.pid, GROUP)
    calls = host.threads()
    outside, inside = min(REST), max(NODE1)  # a CPU off node 1 (CPU 0), one on it
    with pytest.raises(OSError) as err:
        calls.set_affinity(sleeper.pid, frozenset({outside}))
    assert err.value.errno == errno.EINVAL
    assert cpus_allowed(sleeper.pid) == NODE1
    calls.set_affinity(sleeper.pid, frozenset({inside}))  # inside the cpuset: fine
    assert cpus_allowed(sleeper.pid) == {inside}

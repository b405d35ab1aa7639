"""The v2 cpuset knobs against a fixture cgroup tree: what hostd refuses to do before writing.

The kernel's own behaviour (threaded children, cgroup.threads, subtree_control, restore) is
tested for real in the VM tier (tests/vm/inside/test_agent.py); these are the checks hostd
makes itself, which a fixture tree shows as well as a kernel.
"""

from __future__ import annotations

import errno

import pytest

import hostd.cpuset.cgroup  # noqa: F401  (registers the cgroup knobs)
from hostd import knobs
from hostd.cpuset import home_of, v2_group
from hostd.host import Host, HostError

MOUNTINFO = "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text(MOUNTINFO)
    cg = tmp_path / "sys/fs/cgroup"
    (cg / "svc.service").mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for group in (cg, cg / "svc.service"):
        (group / "cgroup.subtree_control").write_text("cpu memory\n")
        (group / "cgroup.type").write_text("domain\n")
    return tmp_path


def test_a_cgroup_with_children_of_its_own_is_left_alone(tree):
    child = tree / "sys/fs/cgroup/svc.service/payload"
    child.mkdir()
    (child / "cgroup.type").write_text("domain\n")
    key = "cgroup/cpuset" + v2_group("/svc.service", "trainer")
    with pytest.raises(HostError) as err:
        knobs.write(Host(tree), key, {"cpus": "3", "mems": "0"})
    assert "has child cgroups of its own (payload)" in str(err.value)
    assert not (tree / "sys/fs/cgroup/svc.service/hostd.trainer").exists()


def test_subtree_knob_reads_the_controller_and_a_missing_group_is_gone(tree):
    host = Host(tree)
    assert knobs.read(host, "cgroup/subtree/") is False
    assert knobs.read(host, "cgroup/subtree/svc.service") is False
    (tree / "sys/fs/cgroup/cgroup.subtree_control").write_text("cpuset cpu memory\n")
    assert knobs.read(host, "cgroup/subtree/") is True
    assert knobs.read(host, "cgroup/cpuset/svc.service/hostd.trainer") is None  # absent
    with pytest.raises(HostError) as err:
        knobs.read(host, "cgroup/subtree/gone.service")
    assert err.value.outcome == "gone"


@pytest.mark.parametrize(
    ("path", "home"),
    [
        ("/hostd/trainer", "/"),
        ("/hostd", "/"),
        ("/hostd.trainer", "/"),
        ("/a/b.service/hostd.comms", "/a/b.service"),
        ("/a/b.service", "/a/b.service"),
        ("/docker/abc", "/docker/abc"),
        ("/", "/"),
    ],
)
def test_home_of_hostds_groups(path, home):
    assert home_of(path) == home


def test_turning_cpuset_off_where_others_now_use_it_leaves_it_on(tree, monkeypatch):
    """EBUSY on ``-cpuset``: other cgroups below enabled it meanwhile; restore closes the record
    (outcome "gone") rather than fail every time."""
    host = Host(tree)

    def busy(rel, text):
        raise HostError(errno.EBUSY, rel, "Device or resource busy")

    monkeypatch.setattr(host, "write", busy)
    with pytest.raises(HostError) as err:
        knobs.write(host, "cgroup/subtree/", False)
    assert err.value.outcome == "gone" and "left on" in str(err.value)
    with pytest.raises(HostError) as err:
        knobs.write(host, "cgroup/subtree/", True)  # turning it on: a real failure
    assert err.value.outcome == "error"

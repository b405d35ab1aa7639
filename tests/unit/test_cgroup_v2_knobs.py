"""The v2 cpuset knobs against a fixture cgroup tree: what hostd refuses to do before writing.

The kernel's own behaviour (threaded children, cgroup.threads, subtree_control, restore) is
tested for real in the VM tier (tests/vm/inside/test_agent.py); these are the checks hostd
makes itself, which a fixture tree shows as well as a kernel.
"""

from __future__ import annotations

import errno
import shutil

import pytest

import hostd.cpuset.cgroup  # noqa: F401  (registers the cgroup knobs)
from hostd import knobkinds
from hostd.host import Host, HostError
from hostd.model.cpus import home_of, v2_group

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
        knobkinds.write(Host(tree), key, {"cpus": "3", "mems": "0"})
    assert "has child cgroups of its own (payload)" in str(err.value)
    assert not (tree / "sys/fs/cgroup/svc.service/hostd.trainer").exists()


def test_subtree_knob_reads_the_controller_and_a_missing_group_is_gone(tree):
    host = Host(tree)
    assert knobkinds.read(host, "cgroup/subtree/") is False
    assert knobkinds.read(host, "cgroup/subtree/svc.service") is False
    (tree / "sys/fs/cgroup/cgroup.subtree_control").write_text("cpuset cpu memory\n")
    assert knobkinds.read(host, "cgroup/subtree/") is True
    assert knobkinds.read(host, "cgroup/cpuset/svc.service/hostd.trainer") is None  # absent
    with pytest.raises(HostError) as err:
        knobkinds.read(host, "cgroup/subtree/gone.service")
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
        knobkinds.write(host, "cgroup/subtree/", False)
    assert err.value.outcome == "gone" and "left on" in str(err.value)
    with pytest.raises(HostError) as err:
        knobkinds.write(host, "cgroup/subtree/", True)  # turning it on: a real failure
    assert err.value.outcome == "error"


# -- the CPU weight of a demoted session's cgroup (hostd.sched.group) ---------------------------
def test_group_cpu_knob_reads_writes_and_never_writes_a_cgroup_made_again(tree):
    import hostd.sched.group as group

    group.mount.cache_clear()
    scope = tree / "sys/fs/cgroup/svc.service"
    (scope / "cpu.idle").write_text("0\n")
    (scope / "cpu.weight").write_text("100\n")
    host, key = Host(tree), group.key_of("/svc.service")
    assert knobkinds.kind_of(key) == "group_cpu" and knobkinds.check_key(key) is None
    orig = knobkinds.read(host, key)
    assert orig == {"ino": scope.stat().st_ino, "file": "cpu.idle", "value": 0}
    knobkinds.write(host, key, group.yielding(orig))
    assert (scope / "cpu.idle").read_text() == "1\n"
    # a value read from another cgroup of that path (one removed and made again): never written
    with pytest.raises(HostError) as err:
        knobkinds.write(host, key, {**orig, "ino": orig["ino"] + 1})
    assert err.value.outcome == "gone"
    assert (scope / "cpu.idle").read_text() == "1\n"
    knobkinds.write(host, key, orig)
    assert (scope / "cpu.idle").read_text() == "0\n"
    shutil.rmtree(scope)
    with pytest.raises(HostError) as err:
        knobkinds.read(host, key)
    assert err.value.outcome == "gone"
    group.mount.cache_clear()


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("cgroup/cpu/", None, "never weighs the root cgroup"),
        ("cgroup/cpu/a/../b", None, "is not a plain cgroup path"),
        ("cgroup/cpu/a.scope", {"ino": 3, "file": "cpu.max", "value": 1}, "is not one of"),
        ("cgroup/cpu/a.scope", {"ino": 3, "file": "cpu.shares", "value": 1}, "in 2..262144"),
        ("cgroup/cpu/a.scope", {"ino": -1, "file": "cpu.idle", "value": 1}, "an inode number"),
        ("cgroup/cpu/a.scope", {"file": "cpu.idle", "value": 1}, "is not a cgroup CPU weight"),
        ("cgroup/cpu/a.scope", {"ino": 3, "file": "cpu.weight", "value": 1}, None),
        # hostd's cgroup for demoted root processes: that one path, present or absent
        ("cgroup/cpuhome/hostd.demoted", True, None),
        ("cgroup/cpuhome/hostd.demoted", None, None),
        ("cgroup/cpuhome/hostd.demoted", {"file": "cpu.idle"}, "is not true or none"),
        ("cgroup/cpuhome/user.slice", True, "is /hostd.demoted"),
        ("cgroup/cpuhome/", True, "is /hostd.demoted"),
    ],
)
def test_group_cpu_journal_checks(key, value, problem):  # and demoted_home's
    import hostd.sched.group  # noqa: F401

    got = knobkinds.check_key(key) or knobkinds.check_value(key, value)
    assert (got is None) if problem is None else (problem in got), got


def test_group_max_caps_a_cgroup_wherever_it_sits_and_puts_its_quota_back(tree):
    """The cap of a demoted cgroup (``cpu.max``: quota and period in microseconds) is read with
    the cgroup's inode, keeps the period, never raises a lower quota, and is written back."""
    import hostd.sched.group as group

    group.mount.cache_clear()
    scope = tree / "sys/fs/cgroup/svc.service"
    (scope / "cpu.max").write_text("max 100000\n")
    host, key = Host(tree), group.max_key("/svc.service")
    assert knobkinds.kind_of(key) == "group_max" and knobkinds.check_key(key) is None
    orig = knobkinds.read(host, key)
    assert orig == {"ino": scope.stat().st_ino, "quota": -1, "period": 100000}
    want = group.capped(orig, 0.1)
    assert want == {**orig, "quota": 10000}
    knobkinds.write(host, key, want)
    assert (scope / "cpu.max").read_text() == "10000 100000\n"
    # already below the cap (the runtime's --cpus): left as it is
    assert group.capped({**orig, "quota": 5000}, 0.1)["quota"] == 5000
    assert group.capped({**orig, "period": 50000}, 3.0)["quota"] == 150000
    with pytest.raises(HostError) as err:
        knobkinds.write(host, key, {**want, "ino": want["ino"] + 1})
    assert err.value.outcome == "gone"
    knobkinds.write(host, key, orig)
    assert (scope / "cpu.max").read_text() == "max 100000\n"
    (scope / "cpu.max").unlink()  # a cgroup without CPU bandwidth control: an unsupported knob
    with pytest.raises(HostError) as err:
        knobkinds.read(host, key)
    assert "bandwidth" in str(err.value)
    group.mount.cache_clear()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"ino": 3, "quota": 10000, "period": 100000}, None),
        ({"ino": 3, "quota": -1, "period": 100000}, None),
        ({"ino": 3, "quota": 10, "period": 100000}, "1000 us up"),
        ({"ino": 3, "quota": 10000, "period": 10}, "a period of"),
        ({"ino": 3, "quota": "max", "period": 100000}, "an inode number, a quota"),
        ({"ino": 3, "file": "cpu.max", "value": 1}, "is not a cgroup CPU quota"),
    ],
)
def test_group_max_journal_checks(value, problem):
    import hostd.sched.group  # noqa: F401

    key = "cgroup/cpumax/a.scope"
    got = knobkinds.check_key(key) or knobkinds.check_value(key, value)
    assert (got is None) if problem is None else (problem in got), got
    assert knobkinds.check_key("cgroup/cpumax/") is not None


def test_demoted_home_is_made_idle_and_emptied_into_the_root_when_removed(tree):
    """On a fixture v2 tree (a plain folder: mkdir makes a plain directory, whose control files
    the test writes as the kernel would show them)."""
    import hostd.sched.group as group

    group.mount.cache_clear()
    host, home = Host(tree), tree / "sys/fs/cgroup/hostd.demoted"
    assert knobkinds.read(host, group.HOME_KEY) is None
    home.mkdir()
    (home / "cpu.idle").write_text("0\n")
    knobkinds.write(host, group.HOME_KEY, True)
    assert (home / "cpu.idle").read_text() == "1\n" and knobkinds.read(host, group.HOME_KEY)
    (home / "cpu.idle").unlink()  # (a plain folder: rmdir needs it empty, as a cgroup's is)
    knobkinds.write(host, group.HOME_KEY, None)  # nothing in it to move back: removed
    assert not home.exists() and knobkinds.read(host, group.HOME_KEY) is None
    # a cgroup without the cpu controller enabled: refused, and not left behind
    with pytest.raises(HostError) as err:
        knobkinds.write(host, group.HOME_KEY, True)
    assert "not enabled" in str(err.value) and not home.exists()
    group.mount.cache_clear()

"""Fixtures of the tests that run inside the VM, and the rule that each leaves the kernel as found.

These tests run only inside the VM that ``tests/vm/vm.py`` boots (it sets ``HOSTD_IN_VM=1``);
the outer run never collects this folder (``tests/vm/conftest.py``), and a direct run on some
other machine skips every test here. ``kernel_state`` (autouse) snapshots what these tests may
change (the cgroup tree and the root cgroup's cpuset files, online CPUs, IRQ affinities, NUMA
balancing and THP settings, mounts, this process's own placement) and asserts after each test
that it is the same again. The other fixtures create things and take them away: ``v2`` (child
cgroups of the root cgroup, with the cpuset controller enabled for them), ``sleeper`` (a process
to move around), ``hotplug`` (CPU offline/online, every CPU back online afterwards).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostd.host import Gone, Host
from hostd.model.cpus import parse_cpulist

IN_VM = os.environ.get("HOSTD_IN_VM") == "1"
CGROUP = Path("/sys/fs/cgroup")
CPUS = Path("/sys/devices/system/cpu")
NODES_DIR = Path("/sys/devices/system/node")


def read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def live_nodes() -> dict[int, frozenset[int]]:
    """{node id: its CPUs} as the kernel lists them now (``nodeN/cpulist``; offline CPUs leave
    it on x86). Empty where sysfs has no node folders (no CONFIG_NUMA, or outside a VM)."""
    nodes = {}
    for path in NODES_DIR.glob("node[0-9]*"):
        if path.name[4:].isdigit():
            nodes[int(path.name[4:])] = parse_cpulist(read(path / "cpulist") or "")
    return dict(sorted(nodes.items()))


# The VM's shape, read from the live kernel when the inner session starts (every CPU online:
# ``kernel_state`` checks that each test leaves them so), never written down here: ``NODES``
# {node id: its CPUs}, ``ONLINE`` the online CPUs, ``NODE0``/``NODE1`` the CPUs of nodes 0 and
# 1 (the tests move things from node 0 to node 1), ``ALL_MEMS`` every node id. vm.py says what
# shape it asks QEMU for; test_topology_plan.py checks that the kernel shows that shape.
NODES = live_nodes()
ONLINE = parse_cpulist(read(CPUS / "online") or "")
NODE0, NODE1 = NODES.get(0, frozenset()), NODES.get(1, frozenset())
ALL_MEMS = frozenset(NODES)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not IN_VM:
        pytest.skip("runs only inside the VM that tests/vm boots (HOSTD_IN_VM=1)")


def status_field(pid: int, field: str) -> str | None:
    """A field of /proc/PID/status (proc(5)), e.g. Cpus_allowed_list."""
    for line in (read(f"/proc/{pid}/status") or "").splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    return None


def cpus_allowed(pid: int) -> frozenset[int]:
    return parse_cpulist(status_field(pid, "Cpus_allowed_list") or "")


def hostd(*args: str) -> subprocess.CompletedProcess:
    """The ``hostd`` command line, run by this interpreter; it must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-c", "from hostd.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def hostd_here(*args: str):
    """A ``hostd`` command that reads or restores, run in this process: a new interpreter takes
    about 20 s to import hostd under software emulation. Never ``run`` (it renices itself)."""
    from typer.testing import CliRunner

    from hostd.cli import app

    assert args[0] != "run", "hostd run gets a process of its own: use hostd()"
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result


def snapshot() -> dict:
    """What the VM tests may change, as the kernel shows it."""
    groups = sorted(str(p.relative_to(CGROUP)) for p in CGROUP.rglob("*") if p.is_dir())
    root = {
        name: read(CGROUP / name)
        for name in ("cgroup.subtree_control", "cpuset.cpus.effective", "cpuset.mems.effective")
    }
    irqs = {
        irq: read(f"/proc/irq/{irq}/smp_affinity_list")
        for irq in sorted(os.listdir("/proc/irq"))
        if irq.isdigit()
    }
    me = (
        sorted(os.sched_getaffinity(0)),
        os.sched_getscheduler(0),
        os.getpriority(os.PRIO_PROCESS, 0),
        read("/proc/self/cgroup"),
    )
    mm = {
        name: read(path)
        for name, path in (
            ("numa_balancing", "/proc/sys/kernel/numa_balancing"),
            ("thp", "/sys/kernel/mm/transparent_hugepage/enabled"),
        )
    }
    return {
        "groups": groups,
        "mm": mm,
        "mounts": sorted(
            line.split()[4] for line in (read("/proc/self/mountinfo") or "").splitlines()
        ),
        "root": root,
        "online": read(CPUS / "online"),
        "irqs": irqs,
        "self": me,
    }


@pytest.fixture(autouse=True)
def kernel_state():
    """Every test leaves the kernel as it found it."""
    before = snapshot()
    yield before
    assert snapshot() == before


@pytest.fixture
def host() -> Host:
    return Host()


class V2:
    """Child cgroups of the root cgroup for one test, with the cpuset controller enabled.

    Paths are relative to the v2 mount ("" is the root cgroup). ``cleanup`` moves every process
    left in them back to the root, turns partitions back into members, removes them (deepest
    first) and disables the cpuset controller again if this enabled it.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.created: list[str] = []
        self.enabled = False

    def rel(self, group: str, name: str) -> str:
        return "/".join(p for p in ("sys/fs/cgroup", group.strip("/"), name) if p)

    def read(self, group: str, name: str) -> str | None:
        return self.host.read_line(self.rel(group, name))

    def write(self, group: str, name: str, value: str) -> None:
        self.host.write(self.rel(group, name), value)

    def enable_cpuset(self, group: str = "") -> None:
        if "cpuset" not in (self.read(group, "cgroup.subtree_control") or "").split():
            self.write(group, "cgroup.subtree_control", "+cpuset")
            self.enabled = True

    def create(self, group: str) -> str:
        self.enable_cpuset()
        if self.host.mkdir(self.rel(group, "")):
            self.created.append(group)
        return group

    def move(self, pid: int, group: str = "") -> None:
        self.write(group, "cgroup.procs", str(pid))

    def empty(self, group: str, timeout: float = 10.0) -> None:
        """Move every process left in ``group`` to the root and wait until none is left.

        A process killed just before is still in its cgroup until it has finished exiting
        (``cgroup.events`` says ``populated 1``, ``rmdir`` fails with EBUSY), so moving once
        is not enough: move what is listed until the cgroup is empty.
        """
        deadline = time.monotonic() + timeout
        while True:
            for pid in (self.read(group, "cgroup.procs") or "").split():
                with contextlib.suppress(Gone):
                    self.move(int(pid))
            if "populated 0" in (self.host.read(self.rel(group, "cgroup.events")) or ""):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cgroup {group} still has processes after {timeout} s")
            time.sleep(0.05)

    def cleanup(self) -> None:
        for group in reversed(self.created):
            if self.read(group, "cpuset.cpus.partition") not in (None, "member"):
                self.write(group, "cpuset.cpus.partition", "member")
            self.empty(group)
            self.host.rmdir(self.rel(group, ""))
        self.created.clear()
        if self.enabled:
            self.write("", "cgroup.subtree_control", "-cpuset")
            self.enabled = False


@pytest.fixture
def v2(host: Host):
    sandbox = V2(host)
    try:
        yield sandbox
    finally:
        sandbox.cleanup()


@pytest.fixture
def sleeper():
    """A process that sleeps until the test is over."""
    proc = subprocess.Popen(["sleep", "3600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


class Hotplug:
    """CPU offline/online through sysfs (Documentation/core-api/cpu_hotplug.rst)."""

    def __init__(self) -> None:
        self.touched: set[int] = set()

    def set(self, cpu: int, online: bool) -> None:
        self.touched.add(cpu)
        (CPUS / f"cpu{cpu}" / "online").write_text("1" if online else "0")
        want = "1" if online else "0"
        deadline = time.monotonic() + 30
        while read(CPUS / f"cpu{cpu}" / "online") != want and time.monotonic() < deadline:
            time.sleep(0.05)

    def online(self) -> frozenset[int]:
        return parse_cpulist(read(CPUS / "online") or "")

    def restore(self) -> None:
        for cpu in sorted(self.touched):
            if read(CPUS / f"cpu{cpu}" / "online") == "0":
                self.set(cpu, True)


@pytest.fixture
def hotplug():
    plug = Hotplug()
    try:
        yield plug
    finally:
        plug.restore()

"""NUMA placement on a real multi-node kernel: hostd moves a process's memory and threads to node 1.

A holder process, pinned to node 0's CPUs (conftest's ``NODE0``; ``NODE1``: node 1's, both
read from sysfs), fills 64 MiB page by page (first touch puts it on node 0). hostd's knobs
(``task/PID@START/numa`` from ``hostd.numa``, ``task/TID@START/affinity``) are applied through
``hostd.reconcile`` with a journal, as the agent applies a plan; then the journal is restored,
as ``hostd restore`` does. Every page of the buffer is checked with a ``move_pages(2)`` query
(nodes = NULL reports each page's node). Restore puts the numa knob back to its original, the
node that held most of the pages, by moving the pages there again.

Automatic NUMA balancing is off for these tests (``quiet_numa``), except in the one that is
about it: on this kernel (Debian's 6.1), a transparent huge page that the balancer has marked
PROT_NONE (its hinting scan) is invisible to ``move_pages(2)`` (query and move both answer
-EFAULT for each of its pages) until the process touches it again; ``migrate_pages(2)`` moves
it. A process that went quiet after filling its memory keeps such pages on node 0.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hostd import knobkinds, knobs
from hostd.journal import Journal, read_boot_id
from hostd.model.cpus import format_cpulist
from hostd.numa import PAGE, move_process, pages_by_node
from hostd.reconcile import reconcile, restore
from tests.vm.inside.conftest import NODE0, NODE1, cpus_allowed, read

SIZE = 64 << 20
# Fills SIZE bytes page by page on node 0's CPUs, then spins for SPIN seconds without touching
# them (time for the NUMA balancer's scan to mark them), then sleeps with a second thread.
_HOLDER = f"""
import ctypes, os, sys, threading, time
os.sched_setaffinity(0, {set(NODE0)!r})
buf = bytearray({SIZE})
for i in range(0, len(buf), {PAGE}):
    buf[i] = 1
addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print(addr, flush=True)
time.sleep(3600)
"""
SYSCTL = Path("/proc/sys/kernel/numa_balancing")
DEBUGFS = Path("/sys/kernel/debug")
BALANCER = DEBUGFS / "sched" / "numa_balancing"


@pytest.fixture
def start_holder():
    """start_holder(spin_s) -> (pid, the page addresses of its 64 MiB buffer), all on node 0."""
    procs = []

    def start(spin_s: float = 0.0) -> tuple[int, list[int]]:
        cmd = [sys.executable, "-c", _HOLDER, str(spin_s)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        addr = int(proc.stdout.readline())
        return proc.pid, list(range(addr - addr % PAGE, addr + SIZE, PAGE))

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.fixture
def quiet_numa():
    """Automatic NUMA balancing off (see the module docstring), as it was afterwards."""
    before = SYSCTL.read_text().strip()
    SYSCTL.write_text("0")
    try:
        yield
    finally:
        SYSCTL.write_text(before)


@pytest.fixture
def holder(quiet_numa, start_holder):
    """(pid, its 64 MiB buffer's pages), with the NUMA balancer off."""
    return start_holder()


@pytest.fixture
def eager_balancer():
    """Automatic NUMA balancing on and scanning at once, everything as it was afterwards
    (Documentation/admin-guide/sysctl/kernel.rst, numa_balancing; the scan knobs in debugfs)."""
    mounted = False
    if not BALANCER.exists():
        subprocess.run(["mount", "-t", "debugfs", "debugfs", str(DEBUGFS)], check=True)
        mounted = True
    knobs_ = {"scan_delay_ms": "0", "scan_period_min_ms": "100", "scan_size_mb": "1024"}
    saved = {name: (BALANCER / name).read_text().strip() for name in knobs_}
    sysctl = SYSCTL.read_text().strip()
    try:
        SYSCTL.write_text("1")
        for name, value in knobs_.items():
            (BALANCER / name).write_text(value)
        yield
    finally:
        SYSCTL.write_text(sysctl)
        for name, value in saved.items():
            (BALANCER / name).write_text(value)
        if mounted:
            subprocess.run(["umount", str(DEBUGFS)], check=True)


def where(host, pid: int, pages: list[int]) -> Counter[int]:
    """How many of ``pages`` sit on each node (negative: an errno, e.g. -ENOENT: not present)."""
    return Counter(host.threads().move_pages(pid, pages, None))


def tids(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def test_holder_starts_on_node_0(host, holder):
    pid, pages = holder
    assert where(host, pid, pages) == {0: len(pages)}
    assert all(cpus_allowed(t) == NODE0 for t in tids(pid))
    assert len(tids(pid)) == 2


@pytest.mark.parametrize("method", ["move_pages", "migrate_pages"])
def test_hostd_moves_memory_and_threads_to_node_1_and_restore_brings_them_back(
    host, holder, method, tmp_path
):
    pid, pages = holder
    numa_key = knobs.task_key(pid, host.start_time(pid), "numa")
    assert knobkinds.read(host, numa_key) == [0, None]
    threads = {t: host.start_time(t) for t in tids(pid)}
    # What the agent's reconcile gets from a plan that puts this process on node 1.
    want: dict[str, object] = {
        knobs.task_key(t, start, "affinity"): format_cpulist(NODE1) for t, start in threads.items()
    }
    want[numa_key] = [1, method]
    journal = Journal(tmp_path / "state", read_boot_id(host))
    report = reconcile(host, journal, want, {}, live_keys=set(threads.items()), unchangeable=set())
    assert report.counts == {"applied": len(want)}, report.results

    assert where(host, pid, pages) == {1: len(pages)}
    assert knobkinds.read(host, numa_key) == [1, None]
    by_node = pages_by_node(host, pid)
    assert by_node[1] > by_node[0]
    assert all(cpus_allowed(t) == NODE1 for t in threads)

    restored = restore(host, journal)
    assert {r.outcome for r in restored.results} == {"restored"}, restored.results
    assert where(host, pid, pages) == {0: len(pages)}
    assert knobkinds.read(host, numa_key) == [0, None]
    assert all(cpus_allowed(t) == NODE0 for t in threads)
    assert len(Journal(tmp_path / "state", read_boot_id(host))) == 0


def test_move_process_moves_every_page_in_time_boxed_batches(host, holder):
    pid, pages = holder
    report = move_process(host, pid, 1)
    # ``failed`` counts pages outside the buffer too: file-backed private pages still shared
    # with the page cache (not yet copied on write) answer -EACCES without MPOL_MF_MOVE_ALL.
    assert report.pages - report.failed >= len(pages)
    assert report.moved >= len(pages)
    assert report.batches > 1
    assert where(host, pid, pages) == {1: len(pages)}
    back = move_process(host, pid, 0)
    assert back.moved >= len(pages)
    assert where(host, pid, pages) == {0: len(pages)}


def _thp_always() -> bool:
    return "[always]" in (read("/sys/kernel/mm/transparent_hugepage/enabled") or "")


def _hidden_holder(host, start_holder) -> tuple[int, list[int], int]:
    """A holder whose buffer the balancer marked: (pid, pages, how many move_pages cannot see)."""
    if not _thp_always():
        pytest.skip("transparent huge pages are not 'always' here")
    pid, pages = start_holder(4.0)  # the balancer scans the buffer while it spins
    hidden = where(host, pid, pages)[-errno.EFAULT]
    if not hidden:
        pytest.skip("the balancer hid no page from move_pages: nothing to show on this kernel")
    return pid, pages, hidden


def test_balancer_marked_huge_pages_are_hidden_from_move_pages(host, eager_balancer, start_holder):
    """The kernel's behaviour (see the module docstring), and what does move such pages."""
    pid, pages, hidden = _hidden_holder(host, start_holder)
    assert hidden % 512 == 0  # whole 2 MiB huge pages
    status = Counter(host.threads().move_pages(pid, pages, 1))
    assert status[-errno.EFAULT] == hidden  # not moved
    assert pages_by_node(host, pid)[0] >= hidden
    host.threads().migrate_pages(pid, frozenset({0}), frozenset({1}))
    assert where(host, pid, pages) == {1: len(pages)}


def test_numa_knob_moves_huge_pages_the_balancer_marked(host, eager_balancer, start_holder):
    pid, pages, hidden = _hidden_holder(host, start_holder)
    knobkinds.write(host, knobs.task_key(pid, host.start_time(pid), "numa"), [1, "move_pages"])
    assert where(host, pid, pages) == {1: len(pages)}, f"{hidden} pages were hidden"

"""Live tests: the readers against this machine's real /proc and /sys (read-only)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hostd.classify import Classifier
from hostd.host import Host
from hostd.host.parsers import parse_stat
from hostd.model.cpus import parse_cpulist
from hostd.plan import plan
from hostd.policy import load_default
from hostd.tasks import scan
from hostd.topology import read_topology
from tests.workload import TrainingJob

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def _named_thread(name: str):
    """Start a thread, rename it through /proc (as prctl would), return (tid, stop event)."""
    ready, stop = threading.Event(), threading.Event()
    box = {}

    def run():
        box["tid"] = threading.get_native_id()
        with open(f"/proc/self/task/{box['tid']}/comm", "w") as fh:
            fh.write(name)
        ready.set()
        stop.wait()

    threading.Thread(target=run, daemon=True).start()
    ready.wait()
    return box["tid"], stop


def test_topology_matches_the_kernel():
    topo = read_topology(Host())
    with open("/sys/devices/system/cpu/online") as fh:
        online = parse_cpulist(fh.read())
    assert topo.online == online
    assert frozenset().union(*(n.cpus for n in topo.nodes.values())) == online
    for cpu in topo.cpus.values():
        assert cpu.id in cpu.siblings and cpu.siblings <= online
    mounts = Path("/proc/self/mountinfo").read_text()
    if " - cgroup cgroup " in mounts and ",cpuset" in mounts:
        assert topo.cgroup.cpuset == "v1"
    assert topo.cgroup.mode in ("v1", "v2", "hybrid")
    lines = Path("/proc/interrupts").read_text().splitlines()[1:]
    numbered = [ln for ln in lines if ln.split(":")[0].strip().isdigit()]
    assert len(topo.irqs) == len(numbered)


def test_ticks_now_is_the_clock_of_start_times():
    """Live, ``ticks_now`` reads CLOCK_BOOTTIME, not /proc/uptime: the two agree, and a thread
    born now has a start time of now (the inherit records compare the two)."""
    host = Host()
    with open("/proc/uptime") as fh:
        before = int(float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    tid, stop = _named_thread("hostd_tick")
    now, born = host.ticks_now(), host.start_time(tid)
    with open("/proc/uptime") as fh:
        after = int(float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    stop.set()
    assert before <= now <= after + 1
    assert born is not None and before <= born <= now


def test_scan_sees_this_process_and_its_named_threads():
    odd = "a) (b c"  # spaces and parentheses, as a hostile program may name a thread
    tid1, stop1 = _named_thread("pt_nccl_watchdg")
    tid2, stop2 = _named_thread(odd)
    try:
        tasks = {t.tid: t for t in scan(Host(), pids=[os.getpid()])}
    finally:
        stop1.set()
        stop2.set()
    me = tasks[os.getpid()]
    assert me.is_leader and not me.is_kthread
    assert me.uid == os.geteuid()
    assert me.affinity == frozenset(os.sched_getaffinity(0))
    assert me.process.exe == os.path.realpath(sys.executable)
    assert tasks[tid1].comm == "pt_nccl_watchdg" and not tasks[tid1].is_leader
    assert tasks[tid2].comm == odd
    assert tasks[tid1].process.comm == me.comm
    with open(f"/proc/{os.getppid()}/comm") as fh:
        assert me.process.parent_comm == fh.read().strip()
    assert tasks[tid1].start_time >= me.start_time


def test_thread_stats_agrees_with_reading_each_file():
    """The scan's hot path (one task folder fd, openat per thread) sees what the generic
    per-file reads see, and a gone process yields nothing."""
    tid, stop = _named_thread("hostd_probe")
    host, pid = Host(), os.getpid()

    def facts(text, cpus):  # what does not change between two reads of a live thread
        stat = parse_stat(text)
        return stat.comm, stat.start_time, cpus

    try:
        fast = {t: facts(text, cpus) for t, text, cpus in host.thread_stats(pid)}
        slow = {
            int(e): facts(host.read(f"proc/{pid}/task/{e}/stat"), host.affinity(pid, int(e)))
            for e in host.listdir(f"proc/{pid}/task")
        }
    finally:
        stop.set()
    assert fast == slow and fast[tid][0] == "hostd_probe"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert list(host.thread_stats(int(gone.stdout))) == []


def test_kernel_threads_are_flagged():
    tasks = scan(Host(), pids=[2])  # kthreadd
    if not tasks:
        pytest.skip("no kthreadd visible (a pid namespace?)")
    assert all(t.is_kthread for t in tasks)
    assert tasks[0].process.cmdline == ""


def test_scan_survives_tasks_vanishing_mid_read():
    stop = time.monotonic() + 2.0
    churn = subprocess.Popen(
        [sys.executable, "-c",
         "import threading,time\n"
         "end=time.monotonic()+2.5\n"
         "while time.monotonic()<end:\n"
         "    ts=[threading.Thread(target=time.sleep,args=(0.001,)) for _ in range(20)]\n"
         "    [t.start() for t in ts]; [t.join() for t in ts]\n"],
    )  # fmt: skip
    passes = 0
    try:
        while time.monotonic() < stop:
            for t in scan(Host()):
                assert t.tid > 0 and t.comm is not None and t.affinity
            passes += 1
    finally:
        churn.kill()
        churn.wait()
    assert passes > 0


def test_default_policy_classifies_a_real_torchrun_shaped_job():
    with TrainingJob(ranks=2, workers=1) as job:
        host = Host()
        tasks = scan(host, pids=job.pids)
        policy = load_default()
        classified = Classifier(policy).classify_all(tasks)
        layer = {(c.task.pid, c.task.comm): c.layer for c in classified}
        assert layer[(job.launcher, "pt_elastic")] == "helpers"
        assert layer[(job.launcher, "pt_tcpstore_uv")] == "helpers"
        for rank in job.ranks:
            if os.geteuid() == 0:  # the RT layers are gated on uid 0 for CPU-only jobs
                assert layer[(rank, "gloo_tcp_loop")] == "comms"
                assert layer[(rank, "pt_nccl_watchdg")] == "comms"
                assert layer[(rank, "python3")] == "trainer"
        for worker in job.workers:
            expected = "data" if os.geteuid() == 0 else "rest"
            assert layer[(worker, "pt_data_worker")] == expected
        p = plan(read_topology(host), classified, policy)
        if os.geteuid() == 0:
            trainer = p.layer("trainer")
            assert trainer.threads >= 2 * 2
            assert p.pool
            # Whole ranks are never real-time: each rank leads its session, whose weight
            # (autogroup nice -5) is the trainer's only scheduling decision here.
            trainer_plans = [tp for tp in p.tasks if tp.layer == "trainer"]
            assert all(tp.policy is None for tp in trainer_plans)
            if read_topology(host).autogroup:
                assert sorted(tp.tid for tp in trainer_plans if tp.group_nice == -5) == sorted(
                    job.ranks
                )


_IDLE_THREADS = """
import sys, threading
stop = threading.Event()
for n in range(3):
    threading.Thread(target=stop.wait, name=f"idle{n}").start()
print("ready", flush=True)
sys.stdin.readline()
stop.set()
"""


def test_a_full_pass_keeps_a_thread_whose_line_did_not_change():
    """Issue 48: a rescan keeps the thread objects whose stat line, affinity and credentials are
    as they were (pointing them at the new pass's process), and builds again every thread that
    changed: renice, new affinity, or a value hostd itself wrote into the cached thread since
    (``Incremental.note_applied``), which the kernel may have been given back meanwhile."""
    from hostd import knobs
    from hostd.agent.incremental import Incremental
    from hostd.reconcile import PassReport
    from hostd.reconcile.results import Result
    from hostd.tasks import TaskCache

    child = subprocess.Popen([sys.executable, "-c", _IDLE_THREADS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        cache = TaskCache(Host(), scope=[child.pid])
        first = {t.tid: t for t in cache.rescan()}
        idle = [tid for tid in first if tid != child.pid]
        assert len(idle) == 3
        second = {t.tid: t for t in cache.rescan()}
        for tid in idle:  # blocked on the event: nothing of their line changed
            assert second[tid] is first[tid]
            assert second[tid].process is cache.procs[child.pid]
        renice, pin, written = idle
        os.setpriority(os.PRIO_PROCESS, renice, 5)
        os.sched_setaffinity(pin, {min(os.sched_getaffinity(pin))})
        # hostd wrote nice 7 and noted it in the cache; the kernel's value is 0 again (a
        # drift, or a write that a restore undid): the next pass must see 0
        inc = Incremental(cache)
        task = cache.tasks[written]
        inc.note_applied(PassReport([Result(knobs.task_key(written, task.start_time, "nice"),
                                            "applied", 7)]))  # fmt: skip
        assert cache.tasks[written].nice == 7
        third = {t.tid: t for t in cache.rescan()}
        assert third[renice] is not second[renice] and third[renice].nice == 5
        assert third[pin] is not second[pin]
        assert third[pin].affinity == frozenset({min(os.sched_getaffinity(pin))})
        assert third[written].nice == 0
        assert third[written].line != 0  # read again from its line
        fourth = {t.tid: t for t in cache.rescan()}
        assert all(fourth[tid] is third[tid] for tid in idle)
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(10)

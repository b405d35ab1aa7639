"""What an unnamed thread does (``Task.activity``): the syscall file's parser, the words it
maps to, the live kernel's answer for real threads of this process, and the agent's cache that
looks again until a thread settles."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from hostd.host import Host
from hostd.host.parsers import parse_io_writes, parse_syscall
from hostd.model.tasks import ACTIVITIES, activity_of
from hostd.tasks import TaskCache
from tests.workload import SETTLES_INTO_POLL


@pytest.mark.parametrize(
    ("text", "machine", "want"),
    [
        ("running\n", "x86_64", ("running", None)),
        ("7 0x7fecdd60 0x1 0x1f4 0x0 0x0 0x0 0x7ffc 0x7fec\n", "x86_64", ("poll", 0x7FECDD60)),
        ("281 0x5 0x7f 0x40 0x1f4 0x0 0x8 0x7ffc 0x7fec\n", "x86_64", ("poll", 5)),
        ("202 0x7fec0df0 0x189 0x0 0x0 0x0 0xffffffff 0x1 0x2\n", "x86_64", ("futex", 0x7FEC0DF0)),
        ("0 0x7 0x55647f411e90 0x2000 0x0 0x0 0x0 0x1 0x2\n", "x86_64", ("read", 7)),
        ("1 0x3 0x1 0x1 0x0 0x0 0x0 0x1 0x2\n", "x86_64", ("write", 3)),
        ("230 0x0 0x0 0x7ffc 0x0 0x0 0x0 0x1 0x2\n", "x86_64", ("other", 0)),  # clock_nanosleep
        ("-1 0x7ffc0 0x7fec\n", "x86_64", ("other", None)),  # blocked outside a system call
        ("73 0xffff 0x1 0x0 0x0 0x0 0x0 0x1 0x2\n", "aarch64", ("poll", 0xFFFF)),
        ("98 0xffff 0x189 0x0 0x0 0x0 0x0 0x1 0x2\n", "aarch64", ("futex", 0xFFFF)),
        ("202 0xffff 0x189 0x0 0x0 0x0 0x0 0x1 0x2\n", "aarch64", ("other", 0xFFFF)),
        ("7 0x1 0x1 0x0 0x0 0x0 0x0 0x1 0x2\n", "riscv64", ("other", 1)),  # no table: other
    ],
)
def test_the_syscall_file(text, machine, want):
    assert parse_syscall(text, machine) == want


@pytest.mark.parametrize("text", ["", "x 0x1", "7 zz"])
def test_a_malformed_syscall_file_is_an_error(text):
    with pytest.raises(ValueError):
        parse_syscall(text, "x86_64")


def test_the_io_file():
    text = "rchar: 10\nwchar: 5\nsyscr: 2\nsyscw: 3\nread_bytes: 0\n"
    assert parse_io_writes(text) == 3
    with pytest.raises(ValueError):
        parse_io_writes("rchar: 1\n")


@pytest.mark.parametrize(
    ("call", "wrote", "target", "want"),
    [
        ("running", False, None, "runs"),
        ("poll", False, None, "polls"),
        ("read", False, "anon_inode:[infinibandevent]", "rdma-events"),
        ("read", False, "pipe:[1234]", "other"),
        ("read", False, "socket:[1234]", "other"),
        ("futex", True, None, "feeds"),
        ("write", True, None, "feeds"),  # a feeder blocked on a full pipe
        ("futex", False, None, "waits"),
        ("other", True, None, "other"),
    ],
)
def test_the_words(call, wrote, target, want):
    assert activity_of(call, wrote, target) == want
    assert want in ACTIVITIES


def settled(host: Host, pid: int, tid: int, want: str, timeout: float = 10.0) -> str:
    """The thread's activity once it is ``want`` (or the last seen, at the timeout)."""
    deadline = time.monotonic() + timeout
    got = host.thread_activity(pid, tid)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.02)
        got = host.thread_activity(pid, tid)
    return got


def test_real_threads_of_this_process():
    """Real threads, each doing what an NCCL or a multiprocessing thread does when idle."""
    host = Host()
    stop = threading.Event()
    a, b = socket.socketpair()
    r, w = os.pipe()  # read by "reads"
    fr, fw = os.pipe()  # written by "feeds"
    tids: dict[str, int] = {}
    started = threading.Barrier(6)

    def polls():
        tids["polls"] = threading.get_native_id()
        started.wait()
        poller = select.poll()
        poller.register(a, select.POLLIN)
        while not stop.is_set():
            poller.poll(100)  # NCCL's proxy service: poll(2) with a timeout, again and again

    def feeds():
        tids["feeds"] = threading.get_native_id()
        started.wait()
        os.write(fw, b"x")  # a queue feeder: writes to the pipe, then waits for more
        stop.wait()

    def waits():
        tids["waits"] = threading.get_native_id()
        started.wait()
        stop.wait()

    def runs():
        tids["runs"] = threading.get_native_id()
        started.wait()
        while not stop.is_set():
            pass

    def reads():
        tids["reads"] = threading.get_native_id()
        started.wait()
        os.read(r, 1)

    threads = [threading.Thread(target=f, daemon=True) for f in (polls, feeds, waits, runs, reads)]
    for t in threads:
        t.start()
    started.wait()
    pid = os.getpid()
    try:
        for what, want in (("polls", "polls"), ("feeds", "feeds"), ("waits", "waits"),
                           ("runs", "runs"), ("reads", "other")):  # fmt: skip
            assert settled(host, pid, tids[what], want) == want, what
        assert host.thread_activity(pid, 1 << 22) == ""  # no such thread
    finally:
        stop.set()
        os.write(w, b"y")
        for t in threads:
            t.join(5)
        for fd in (r, w, fr, fw):
            os.close(fd)
        a.close()
        b.close()


def test_the_cache_looks_again_until_a_thread_settles():
    """A rank's unnamed thread first waits, then settles into poll(2): ``relook`` finds the
    change, hands the thread back once, and then leaves it be."""
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"}
    child = subprocess.Popen(
        [sys.executable, "-c", SETTLES_INTO_POLL], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        host = Host()
        cache = TaskCache(host, scope=[child.pid])
        tasks = {t.tid: t for t in cache.rescan()}
        [service] = [t for t in tasks.values() if t.unnamed]
        assert service.process.job is not None and service.process.job.role == "rank"
        assert settled(host, child.pid, service.tid, "waits") == "waits"
        assert service.tid in cache.unsettled
        assert cache.relook() in ([], [service])  # it may have been running at the rescan
        child.stdin.write("go\n")
        child.stdin.flush()
        assert settled(host, child.pid, service.tid, "polls") == "polls"
        assert cache.relook() == [cache.tasks[service.tid]]
        assert cache.tasks[service.tid].activity == "polls"
        assert service.tid not in cache.unsettled  # settled: not looked at again
        assert cache.relook() == []

        # an event that names it reads it again, but not what it does: that stays
        def no_read(pid: int, tid: int) -> str:
            raise AssertionError("the event path read a thread's activity")

        cache.host.thread_activity = no_read  # type: ignore[method-assign]
        [again] = cache.refresh([(service.tid, child.pid)], set())
        assert again.activity == "polls" and service.tid not in cache.unsettled
        leader = cache.tasks[child.pid]
        assert leader.activity == ""  # the leader has its own name: never looked at

        # a full pass (an overflow's, a drift's) keeps it too (issue 48: not read again at
        # every pass), and it stays settled
        full = {t.tid: t for t in cache.rescan()}
        assert full[service.tid].activity == "polls" and service.tid not in cache.unsettled

        # a reused tid (another start time) is another thread: looked at afresh
        from dataclasses import replace

        from hostd.tasks import scan

        cache.host.thread_activity = lambda pid, tid: "feeds"  # type: ignore[method-assign]
        old = replace(full[service.tid], start_time=full[service.tid].start_time + 1)
        [fresh] = [t for t in scan(cache.host, pids=[child.pid], seen={service.tid: old})
                   if t.tid == service.tid]  # fmt: skip
        assert fresh.activity == "feeds"
    finally:
        child.kill()
        child.wait()


def test_a_relook_looks_at_a_bounded_number_of_threads_in_turn(monkeypatch):
    """Any user can start a process that claims a job and thousands of unnamed threads: each
    relook reads at most RELOOK_MAX of them, and the next goes on where it stopped."""
    from tests.unit.test_classify import rank

    cache = TaskCache(Host())
    looked: list[int] = []

    def activity(pid: int, tid: int) -> str:
        looked.append(tid)
        return "waits"

    monkeypatch.setattr(cache.host, "thread_activity", activity)
    monkeypatch.setattr(cache, "RELOOK_BUDGET_S", 3600.0)  # the count bound alone, not time
    n = cache.RELOOK_MAX * 2 + 88
    for i in range(n):
        task = rank(leader=False, tid=10_000 + i, uid=1000, activity="waits")
        cache.tasks[task.tid] = task
        cache.unsettled[task.tid] = time.monotonic()
    for _ in range(3):
        looked.clear()
        assert cache.relook() == []
        assert len(looked) == cache.RELOOK_MAX
    seen = set()
    for _ in range(3):
        looked.clear()
        cache.relook()
        seen |= set(looked)
    assert seen == set(cache.tasks)  # every thread in turn
    # two minutes after it was first seen, a thread is not looked at again
    for tid in cache.unsettled:
        cache.unsettled[tid] -= cache.RELOOK_FOR + 1
    looked.clear()
    for _ in range(3):
        cache.relook()
    assert looked == [] and not cache.unsettled


def test_a_relook_stops_at_its_time_budget_and_goes_on_next_time(monkeypatch):
    """Reading a thread's activity costs tens of microseconds: a relook stops once it spent
    RELOOK_BUDGET_S (a bound on the agent's own CPU at 100k threads), the next goes on."""
    from tests.unit.test_classify import rank

    cache = TaskCache(Host())
    looked: list[int] = []

    def slow(pid: int, tid: int) -> str:
        looked.append(tid)
        time.sleep(cache.RELOOK_BUDGET_S * 1.5)  # each read alone is over the budget
        return "waits"

    monkeypatch.setattr(cache.host, "thread_activity", slow)
    for i in range(20):
        task = rank(leader=False, tid=10_000 + i, uid=1000, activity="waits")
        cache.tasks[task.tid] = task
        cache.unsettled[task.tid] = time.monotonic()
    seen = []
    for _ in range(10):
        looked.clear()
        cache.relook()
        assert len(looked) == 1, looked  # one at least, then the budget is spent
        seen += looked
    assert len(set(seen)) == len(seen) == 10  # in turn, none twice
    assert len(cache.unsettled) == 20  # none dropped for lack of time

"""The proc connector on the real kernel (root): the subscription is acknowledged, and a new
thread, its rename, a new process, its exec and the exits arrive as events with the right ids."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from hostd.host.connector import Event, ProcConnector

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs CAP_NET_ADMIN (root)")


def _events_until(conn: ProcConnector, want, timeout: float = 10) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += [e for e in conn.read() if isinstance(e, Event)]
        if want(seen):
            return seen
        time.sleep(0.01)
    raise AssertionError(f"events not seen within {timeout}s: {seen[-20:]}")


def test_thread_and_process_events_arrive():
    me = os.getpid()
    with ProcConnector() as conn:
        assert conn.rcvbuf >= 1024 * 1024  # SO_RCVBUFFORCE as root
        tid = []

        def body() -> None:
            tid.append(threading.get_native_id())
            with open(f"/proc/self/task/{tid[0]}/comm", "w") as fh:
                fh.write("hostd_test_thr")

        t = threading.Thread(target=body)
        t.start()
        t.join()
        child = subprocess.Popen(["true"])
        child.wait()
        seen = _events_until(
            conn,
            lambda s: (
                any(e.kind == "exit" and e.tid == child.pid for e in s)
                and any(e.kind == "exit" and e.tid == tid[0] for e in s)
            ),
        )
    mine = [e._replace(ts=0) for e in seen if e.tid in (tid[0], child.pid)]
    # each stamped by the kernel (CLOCK_MONOTONIC ns: time.monotonic_ns())
    stamps = [e.ts for e in seen if e.tid in (tid[0], child.pid)]
    assert all(0 < ts <= time.monotonic_ns() for ts in stamps)
    assert Event("fork", tid[0], me, mine[0].parent_tgid) in mine
    assert Event("comm", tid[0], me, 0, "hostd_test_thr") in mine
    assert Event("exit", tid[0], me) in mine
    assert Event("fork", child.pid, child.pid, me) in mine
    assert Event("exec", child.pid, child.pid) in mine
    assert Event("exit", child.pid, child.pid) in mine
    if conn.filtered:  # kernel >= 6.6: only the four kinds hostd asked for
        assert {e.kind for e in seen} <= {"fork", "exec", "comm", "exit"}


def test_rename_events_can_be_muted_and_unmuted():
    """A rename storm's way out (issue 44.10): the kernel stops sending this socket's rename
    events while they are muted, and sends them again after; forks and exits go on."""

    def renamed(name: str) -> int:
        tid = []

        def body() -> None:
            tid.append(threading.get_native_id())
            with open(f"/proc/self/task/{tid[0]}/comm", "w") as fh:
                fh.write(name)

        t = threading.Thread(target=body)
        t.start()
        t.join()
        return tid[0]

    with ProcConnector() as conn:
        if not conn.filtered:
            pytest.skip("the kernel filters no event types (before 6.6): nothing to mute")
        assert conn.mute_renames(True)
        muted = renamed("hostd_mute_a")
        seen = _events_until(conn, lambda s: any(e.kind == "exit" and e.tid == muted for e in s))
        assert not [e for e in seen if e.kind == "comm" and e.tid == muted]
        assert conn.mute_renames(False)
        heard = renamed("hostd_mute_b")
        _events_until(conn, lambda s: any(e.kind == "comm" and e.tid == heard for e in s))

"""``hostd restore --wait SECONDS``: a restore that starts while an agent is still stopping (in
Kubernetes, a pod replacing the node's previous hostd pod of the other mode: deploy/k8s) waits for
the host lock, then restores; when the wait ends with the lock still held it fails in one line.

The lock here is a file in the test's temporary folder, never the host's /run/hostd.lock (an agent
on this host must not find it taken by a test), and time is a fake clock that only the waiting
moves: the tests assert what happened in which order, never how long it took.
"""

from __future__ import annotations

import fcntl
import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hostd.cli.agent as agent_cli
from hostd.agent.lock import PID_FILE, POLL_S, wait_for_host
from hostd.cli import app
from hostd.statedir import Locked, lock_host

root = pytest.mark.skipif(os.geteuid() != 0, reason="hostd restore needs root")


class Clock:
    """Time that passes only while the code under test sleeps. Each sleep is logged ("slept"),
    then ``on_sleep`` runs with the number of sleeps so far (the test's move: let go, or not)."""

    def __init__(self, events: list[str], on_sleep: Callable[[int], None] = lambda n: None):
        self.now = 0.0
        self.sleeps = 0
        self.events = events
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert 0 < seconds <= POLL_S
        self.now += seconds
        self.sleeps += 1
        self.events.append("slept")
        self.on_sleep(self.sleeps)


class Holder:
    """What a stopping agent holds: the host lock (a file here), or its pid file in the run dir
    (an agent in another container, whose host lock this one cannot see)."""

    def __init__(self, tmp_path: Path, what: str) -> None:
        self.what = what
        self.lock = str(tmp_path / "hostd.lock")
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir(mode=0o755)
        if what == "lock":
            self.fd: int | None = lock_host(self.lock)
        else:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            self.fd = os.open(self.run_dir / PID_FILE, flags, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(self.fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.fixture(params=["lock", "pid file"])
def holder(request, tmp_path):
    held = Holder(tmp_path, request.param)
    yield held
    held.release()


def wait(holder: Holder, seconds: float, clock: Clock) -> int:
    return wait_for_host(
        holder.run_dir, seconds, path=holder.lock, clock=clock.clock, sleep=clock.sleep
    )


def test_a_free_host_is_taken_at_once(tmp_path):
    held = Holder(tmp_path, "lock")
    held.release()
    events: list[str] = []
    fd = wait(held, 2, Clock(events))
    try:
        assert events == []
        with pytest.raises(Locked):  # taken: by this test now
            os.close(lock_host(held.lock))
    finally:
        os.close(fd)


def test_it_waits_while_held_and_takes_the_lock_once_let_go(holder):
    events: list[str] = []

    def on_sleep(n: int) -> None:
        if n == 2:  # the first retry still found it held
            holder.release()
            events.append("released")

    fd = wait(holder, 2, Clock(events, on_sleep))
    try:
        events.append("taken")
        assert events == ["slept", "slept", "released", "taken"]
        with pytest.raises(Locked) as exc:  # held by the waiter now
            os.close(lock_host(holder.lock))
        assert exc.value.pid == os.getpid()
    finally:
        os.close(fd)


def test_the_wait_ends_with_the_holder_named(holder):
    events: list[str] = []
    clock = Clock(events)
    with pytest.raises(Locked) as exc:
        os.close(wait(holder, 2, clock))
    assert exc.value.pid == os.getpid()
    assert events == ["slept"] * round(2 / POLL_S) and clock.now == 2
    if holder.what == "lock":  # still the holder's
        with pytest.raises(Locked):
            os.close(lock_host(holder.lock))
    else:  # the waiter took the host lock at each try, and let go of it when it found the agent
        os.close(lock_host(holder.lock))


def test_without_wait_it_refuses_at_once(holder):
    events: list[str] = []
    with pytest.raises(Locked):
        os.close(wait(holder, 0, Clock(events)))
    assert events == []


def restore(monkeypatch, holder: Holder, clock: Clock, *args: str):
    """``hostd restore`` through the CLI, its host lock the holder's file and its time the
    clock's; the journal it restores is an empty one of the test's."""
    patched = functools.partial(
        wait_for_host, path=holder.lock, clock=clock.clock, sleep=clock.sleep
    )
    monkeypatch.setattr(agent_cli, "wait_for_host", patched)
    real = agent_cli._restore

    def restored(state_dir: str, as_json: bool) -> None:
        clock.events.append("restored")
        real(state_dir, as_json)

    monkeypatch.setattr(agent_cli, "_restore", restored)
    state = holder.run_dir.parent / "state"
    argv = ["restore", "--state-dir", str(state), "--run-dir", str(holder.run_dir), *args]
    return CliRunner().invoke(app, argv)


@root
def test_restore_waits_for_the_stopping_agent_then_restores(monkeypatch, holder):
    events: list[str] = []

    def on_sleep(n: int) -> None:
        assert "restored" not in events
        if n == 1:
            holder.release()
            events.append("released")

    result = restore(monkeypatch, holder, Clock(events, on_sleep), "--wait", "2", "--json")
    assert result.exit_code == 0, result.output
    assert events == ["slept", "released", "restored"]
    assert '"results": []' in result.stdout


@root
def test_restore_fails_in_one_line_when_the_wait_ends(monkeypatch, holder):
    events: list[str] = []
    result = restore(monkeypatch, holder, Clock(events), "--wait", "2")
    assert result.exit_code == 1, result.output
    assert "restored" not in events and events.count("slept") == round(2 / POLL_S)
    assert result.stderr == (
        f"hostd: an agent is running (pid {os.getpid()}) after waiting 2 s for it to stop: "
        "stop it (it restores)\n"
    )
    assert isinstance(result.exception, SystemExit)  # no traceback


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_a_bad_wait_is_refused_in_one_line(tmp_path, value):
    argv = ["restore", "--wait", value, "--state-dir", str(tmp_path / "s"), "--run-dir",
            str(tmp_path / "r")]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "--wait" in result.stderr and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)

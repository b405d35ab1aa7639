"""``hostd top`` in a real terminal (tmux): it draws the layers and the threads that wait most,
refreshes, and q quits it; without a terminal it says to use ``hostd stats``."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.cli.test_cli import HOSTD, hostd

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux")


def tmux(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False)


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session).stdout


def test_top_fits_80x24_draws_refreshes_takes_its_keys_and_quits_on_q():
    session = f"hostd-top-{time.monotonic_ns()}"
    started = tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24",
                   f"{HOSTD} top --interval 0.3; sleep 30")  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 60

        def until(what: str) -> str:
            shown = screen(session)
            while time.monotonic() < deadline and what not in shown:
                time.sleep(0.1)
                shown = screen(session)
            assert what in shown, shown
            return shown

        shown = until("threads by run-queue wait")
        lines = shown.splitlines()
        assert lines[0].startswith("hostd top on ") and "h help · q quit" in lines[-1], shown
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert "trainer" in shown and "rest" in shown and "wait/s" in shown, shown
        rows = [ln for ln in lines if ln.rstrip().endswith(("rest", "0")) and ln[:8].strip()]
        assert rows  # threads are listed, as many as fit
        first = shown
        while time.monotonic() < deadline and screen(session) == first:
            time.sleep(0.1)  # it refreshes: the next measurement redraws the screen
        assert screen(session) != first
        tmux("send-keys", "-t", session, "s")
        until("threads by CPU")
        tmux("send-keys", "-t", session, "l")
        until("threads by CPU, layer comms")
        tmux("send-keys", "-t", session, "?")
        assert "Marks: D" in until("sort by the next measure")
        tmux("send-keys", "-t", session, "h")
        until("threads by CPU, layer comms")
        tmux("send-keys", "-t", session, "q")
        while time.monotonic() < deadline and "hostd top on" in screen(session):
            time.sleep(0.2)
        assert "hostd top on" not in screen(session)  # it quit (the shell's sleep is left)
        assert "Traceback" not in screen(session)
    finally:
        tmux("kill-session", "-t", session)


def test_top_without_a_terminal_says_what_to_use():
    proc = hostd("top", check=False)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "hostd: hostd top needs a terminal; `hostd stats` prints the same once"
    )

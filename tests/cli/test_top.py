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


def test_top_draws_refreshes_and_quits_on_q():
    session = f"hostd-top-{time.monotonic_ns()}"
    started = tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50",
                   f"{HOSTD} top --interval 0.3; sleep 30")  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 60
        shown = ""
        while time.monotonic() < deadline and "threads that waited most" not in shown:
            time.sleep(0.2)
            shown = screen(session)
        assert "hostd top on" in shown and "q quits" in shown, shown
        assert "trainer" in shown and "rest" in shown and "wait/s" in shown, shown
        first = shown
        while time.monotonic() < deadline and screen(session) == first:
            time.sleep(0.2)  # it refreshes: the next measurement redraws the screen
        assert screen(session) != first
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

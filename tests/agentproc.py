"""``hostd run`` as a child process for the tests that run the agent (tests/privileged, the VM
tier): start it scoped to a process tree, read its status, ask for a full pass, stop it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HOSTD = [sys.executable, "-c", "from hostd.cli import main; main()"]


class Agent:
    """``hostd run`` scoped to one process tree, with its log, status and a stop that restores."""

    def __init__(
        self, tmp: Path, scope: int, *extra: str, policy: Path, env: dict | None = None
    ) -> None:
        self.state, self.run = tmp / "state", tmp / "run"
        self.log = tmp / "agent.log"
        self.proc = subprocess.Popen(
            [*HOSTD, "run", "--policy", str(policy), "--state-dir", str(self.state),
             "--run-dir", str(self.run), "--scope-pid", str(scope), *extra],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),  # noqa: SIM115
            env={**os.environ, **(env or {})},
        )  # fmt: skip

    def status(self) -> dict:
        try:
            return json.loads((self.run / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_passes(self, n: int, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st.get("passes", 0) >= n:
                return st
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no pass {n} within {timeout}s:\n{self.log.read_text()}")

    def full_pass(self, timeout: float = 60) -> dict:
        """Ask for a full pass now (SIGUSR1, what ``hostd enable`` sends) and wait for it."""
        n = self.status().get("passes", 0)
        self.proc.send_signal(signal.SIGUSR1)
        return self.wait_passes(n + 1, timeout)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=120)
        return self.log.read_text()


def wait_for(check, what: str, agent: Agent | None = None, timeout: float = 30) -> None:
    """Wait until ``check()`` holds (no timing assert: the deadline only bounds a failure)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            log = agent.log.read_text() if agent is not None else ""
            raise AssertionError(f"{what}: not within {timeout}s\n{log}")
        time.sleep(0.02)

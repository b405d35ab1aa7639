"""``hostd run`` as a child process (``AgentProc``): the demo's agent, and the tests' and the
benchmarks' (``tests/agentproc.py``, ``bench/``); ``HOSTD``, the command line that starts hostd
(its first two words start a module of it, as the demo's roles are started)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HOSTD = [sys.executable, "-m", "hostd"]


class AgentProc:
    """``hostd run`` as a child process with its own state and run folders (also the tests'
    agent, ``tests/agentproc.py``): its status, a wait for passes, and ``stop()``, which sends
    SIGTERM, on which the agent puts back everything it changed."""

    def __init__(
        self,
        workdir: Path,
        *,
        policy: str | None = None,
        scope: Sequence[int] = (),
        extra: Sequence[str] = (),
        env: dict | None = None,
        new_session: bool = False,
    ) -> None:
        self.state, self.run = workdir / "state", workdir / "run"
        self.log = workdir / "agent.log"
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [*HOSTD, "run", "--state-dir", str(self.state), "--run-dir", str(self.run)]
        if policy:
            argv += ["--policy", policy]
        for pid in scope:
            argv += ["--scope-pid", str(pid)]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [*argv, *extra],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, **(env or {})},
                start_new_session=new_session,  # as a service runs: leading its own session
            )

    def status(self) -> dict:
        """The agent's status.json, or {} before it wrote one."""
        try:
            return json.loads((self.run / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_passes(self, n: int = 1, timeout: float = 60) -> dict:
        """Wait until the agent has made ``n`` passes; its status then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st.get("passes", 0) >= n:
                return st
            if self.proc.poll() is not None:
                raise RuntimeError(f"hostd run exited:\n{self.log.read_text()}")
            time.sleep(0.05)
        raise RuntimeError(
            f"hostd run made no pass {n} within {timeout} s:\n{self.log.read_text()}"
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> str:
        """Signal the agent, wait for it (SIGKILL after ``timeout`` s) and return its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()

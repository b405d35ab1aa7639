"""``hostd run`` as a child process for the tests that run the agent (tests/privileged, the VM
tier): start it scoped to a process tree, read its status, ask for a full pass, stop it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from hostd.demo import AgentProc


class Agent(AgentProc):
    """``hostd run`` scoped to one process tree, with a full pass on demand."""

    def __init__(
        self,
        tmp: Path,
        scope: int,
        *extra: str,
        policy: Path,
        env: dict | None = None,
        new_session: bool = False,
    ) -> None:
        super().__init__(
            tmp, policy=str(policy), scope=[scope], extra=extra, env=env, new_session=new_session
        )

    def full_pass(self, timeout: float = 60) -> dict:
        """Ask for a full pass now (SIGUSR1, what ``hostd enable`` sends) and wait for it."""
        n = self.status().get("passes", 0)
        self.proc.send_signal(signal.SIGUSR1)
        return self.wait_passes(n + 1, timeout)


def wait_for(check, what: str, agent: Agent | None = None, timeout: float = 30) -> None:
    """Wait until ``check()`` holds (no timing assert: the deadline only bounds a failure)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            log = agent.log.read_text() if agent is not None else ""
            raise AssertionError(f"{what}: not within {timeout}s\n{log}")
        time.sleep(0.02)

"""Attacks on the running agent that a local user or a slow client can make (issue 44), on the
real kernel: each builds its stand-in job, runs ``hostd run`` scoped to it, attacks, stops the
agent and checks that every knob it changed is back (``test_agent.host_state``)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
from pathlib import Path

import pytest

from tests.privileged.test_agent import HOSTD, Agent, host_state, needs_v1_cpuset
from tests.workload import TrainingJob

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent changes real threads"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
]


def _count(pid: int, what: str) -> int:
    return len(os.listdir(f"/proc/{pid}/{what}"))


@needs_v1_cpuset
def test_idle_scrapes_cannot_exhaust_the_agents_files_and_lose_originals(tmp_path: Path):
    """Issue 44.2: with its file limit at 64, 200 idle connections to the metrics port used to
    take every descriptor of the agent; its /proc reads then failed (EMFILE), the full pass took
    the unseen threads for exited ones and closed their records, and the stop left their knobs
    changed. Now the exporter holds at most 16 connections, a failed read is never an exit, and
    the stop, with all 200 still held (as the client sees them), puts every knob back."""
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher)
        clients: list[socket.socket] = []
        try:
            st = agent.wait_passes(1)
            port = int(st["metrics"].rsplit(":", 1)[1].split("/")[0])
            resource.prlimit(agent.proc.pid, resource.RLIMIT_NOFILE, (64, 64))
            threads = _count(agent.proc.pid, "task")
            for _ in range(200):  # as a client does: one after the other, each left open
                try:
                    clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                except OSError:
                    break  # nothing accepts any more (the agent is out of descriptors)
            assert len(clients) == 200  # each accepted: the oldest ended to make room
            st = agent.full_pass(timeout=30)
            assert _count(agent.proc.pid, "task") <= threads + 16
            assert _count(agent.proc.pid, "fd") < 64
            assert st["journal"]["records"] > 0
        finally:
            log = agent.stop()
            for c in clients:
                with contextlib.suppress(OSError):
                    c.close()
        assert agent.proc.returncode == 0, log
        assert host_state(job) == before, log
        assert "Traceback" not in log

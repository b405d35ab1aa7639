"""Attacks on the running agent that a local user or a slow client can make (issue 44), on the
real kernel: each builds its stand-in job, runs ``hostd run`` scoped to it, attacks, stops the
agent and checks that every knob it changed is back (``test_agent.host_state``)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agentproc import wait_for
from tests.privileged.test_agent import AUTOGROUPS, HOSTD, Agent, host_state, needs_v1_cpuset
from tests.privileged.test_preempt import _autogroup, _cpu_cgroup, _policy
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


PREEMPT = Path(__file__).with_name("preempt.toml")
TJOB = (  # the preempt policy's protected job: an idle process named tjob
    "open('/proc/self/comm', 'w').write('tjob')\nimport time\ntime.sleep(600)"
)


@pytest.mark.skipif(not AUTOGROUPS, reason="autogroups are off")
def test_a_demoted_session_whose_leader_exits_gets_its_weight_back(tmp_path: Path):
    """Issue 44.3: a busy child of a session whose leader exits (nohup, `setsid sh -c 'job &'`,
    an ended ssh session) was demoted; its session's weight was kept on the leader's task, and
    the next full pass closed that record as gone, so the session stayed at nice 19 after the
    stop. A session's knob lives while the session does: given back through a member."""
    job = subprocess.Popen([sys.executable, "-c", TJOB], start_new_session=True)
    leader = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' & echo $!; read x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    child = int(leader.stdout.readline())
    try:
        before = (_policy(child), _autogroup(child))
        agent = Agent(tmp_path, 1, policy=PREEMPT)
        try:
            agent.wait_passes(1)
            wait_for(lambda: _policy(child) == os.SCHED_IDLE and _autogroup(child) == "19",
                     "the busy session demoted", agent)  # fmt: skip
            leader.stdin.close()  # the leader exits; its busy child stays in the session
            leader.wait()
            agent.full_pass()
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert (_policy(child), _autogroup(child)) == before, log
    finally:
        for proc in (job, leader):
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


ORPHANING = (  # a parent that forks a data worker, says its pid, and exits when told
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    open('/proc/self/comm', 'w').write('pt_data_worker')\n"
    "    time.sleep(600)\n"
    "    os._exit(0)\n"
    "print(pid, flush=True)\n"
    "sys.stdin.read()\n"
)


def test_an_orphan_that_leaves_the_scope_is_still_restored(tmp_path: Path):
    """Issue 44.14: with ``--scope-pid``, a process whose parent exits is reparented out of the
    scope; the next full pass took it for gone and closed its records, so it kept hostd's values
    after the stop. What hostd changed stays in its care until it is restored."""
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHANING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    worker = int(parent.stdout.readline())
    try:
        before = (_policy(worker), os.getpriority(os.PRIO_PROCESS, worker))
        agent = Agent(tmp_path, parent.pid)  # tests/privileged/policy.toml: data: BATCH, nice 5
        try:
            agent.wait_passes(1)
            wait_for(lambda: _policy(worker) == os.SCHED_BATCH, "the worker placed", agent)
            parent.stdin.close()  # the parent exits: the worker is init's, out of the scope
            parent.wait()
            agent.full_pass()
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert (_policy(worker), os.getpriority(os.PRIO_PROCESS, worker)) == before, log
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


RUNUSER = (  # a light root process that runs a user's busy command in its own session
    "import os, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.setgid(65534)\n"
    "    os.setuid(65534)\n"
    "    while True:\n"
    "        pass\n"
    "print(pid, flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_users_busy_child_does_not_demote_the_root_process_that_started_it(tmp_path: Path):
    """Issue 44.9: a user's busy child in a root process's session (`runuser`, `sudo -u`, a job
    runner, no new session) made the root process SCHED_IDLE, its session nice 19 and moved it
    into /hostd.demoted. Now the busy user's work is demoted, the other user's bystander is
    left alone, and the stop puts everything back."""
    job = subprocess.Popen([sys.executable, "-c", TJOB], start_new_session=True)
    root = subprocess.Popen(
        [sys.executable, "-c", RUNUSER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(root.stdout.readline())
    try:
        before = {p: (_policy(p), _autogroup(p), _cpu_cgroup(p)) for p in (root.pid, child)}
        agent = Agent(tmp_path, 1, policy=PREEMPT)
        try:
            agent.wait_passes(1)
            wait_for(lambda: _policy(child) == os.SCHED_IDLE, "the busy child demoted", agent)
            wait_for(lambda: "preempt spare pid=" in agent.log.read_text(), "spared", agent)
            assert (_policy(root.pid), _autogroup(root.pid), _cpu_cgroup(root.pid)) == before[
                root.pid
            ]
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert {p: (_policy(p), _autogroup(p), _cpu_cgroup(p)) for p in before} == before, log
    finally:
        for proc in (job, root):
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)

"""What children inherit from a thread hostd changed comes back too (root, real threads): a
process hostd reniced, made SCHED_BATCH and pinned creates a thread and a child process after
the change; after a restore (the agent's stop, or ``hostd restore`` after a crash) all three
have their original nice, policy and affinity again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostd import knobkinds, knobs
from hostd.host import Host
from hostd.journal import Journal, read_boot_id
from hostd.reconcile import Observed, reconcile, restore
from hostd.tasks import scan

_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else None

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: renices real threads"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
]

# Waits for a line on stdin, then starts a thread and forks a child (both inherit), prints
# "tid pid" of them and sleeps.
PARENT = """
import os, sys, threading, time
sys.stdin.readline()
t = threading.Thread(target=time.sleep, args=(120,), daemon=True); t.start()
time.sleep(0.05)
child = os.fork()
if child == 0:
    time.sleep(120); os._exit(0)
print(t.native_id, child, flush=True)
time.sleep(120)
"""


def _state(tid: int) -> tuple:
    return (
        os.getpriority(os.PRIO_PROCESS, tid),
        os.sched_getscheduler(tid),
        tuple(sorted(os.sched_getaffinity(tid))),
    )


@pytest.mark.parametrize("how", ["stop", "kill -9, then hostd restore"])
def test_what_children_inherited_is_restored(tmp_path, how):
    host = Host()
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        before = _state(proc.pid)
        cpu = min(os.sched_getaffinity(0))
        (task,) = [t for t in scan(host, pids=[proc.pid]) if t.tid == proc.pid]
        want = {
            knobs.task_key(task.tid, task.start_time, "nice"): 7,
            knobs.task_key(task.tid, task.start_time, "sched"): ["batch", 0, False],
            knobs.task_key(task.tid, task.start_time, "affinity"): str(cpu),
        }
        journal = Journal(tmp_path / "state", read_boot_id(host))
        report = reconcile(host, journal, want, Observed([task]), unchangeable=set())
        assert report.counts == {"applied": 3}, report.results
        proc.stdin.write("go\n")
        proc.stdin.flush()
        thread, child = (int(x) for x in proc.stdout.readline().split())
        changed = (7, os.SCHED_BATCH, (cpu,))
        assert _state(proc.pid) == _state(thread) == _state(child) == changed  # inherited
        if how == "stop":
            result = restore(host, journal)
            inherited = [r for r in result.results if r.detail.startswith("inherited")]
            assert len(inherited) == 6, result.results  # 3 knobs x (thread, child)
        else:
            journal.close()
            out = subprocess.run([HOSTD, "restore", "--state-dir", str(tmp_path / "state"),
                                  "--run-dir", str(tmp_path / "run")],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            assert out.returncode == 0, out.stdout + out.stderr
            assert "inherited from" in out.stdout
        assert _state(proc.pid) == _state(thread) == _state(child) == before
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"


@pytest.mark.skipif(not AUTOGROUPS, reason="autogroups are off")
def test_a_session_weight_comes_back_after_its_leader_exited(tmp_path):
    """The session's other processes keep the autogroup hostd weighed: restored through them."""
    host = Host()
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 120 & echo $!; exec sleep 120"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    member = int(leader.stdout.readline())
    try:
        nice = int(Path(f"/proc/{member}/autogroup").read_text().split()[-1])
        key = knobs.task_key(leader.pid, host.start_time(leader.pid), "autogroup")
        journal = Journal(tmp_path / "state", read_boot_id(host))
        journal.record([(key, nice)])
        knobkinds.write(host, key, nice - 5)
        leader.kill()
        leader.wait()
        assert Path(f"/proc/{member}/autogroup").read_text().split()[-1] == str(nice - 5)
        result = restore(host, journal)
        assert [r.outcome for r in result.results] == ["restored"], result.results
        assert Path(f"/proc/{member}/autogroup").read_text().split()[-1] == str(nice)
    finally:
        os.kill(member, 9)

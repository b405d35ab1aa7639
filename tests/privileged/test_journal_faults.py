"""The journal's faults on the real kernel (root): a full state disk (a 64 KiB tmpfs filled up)
changes nothing on the host, and a damaged journal restores every readable record, names the
lines it could not read, exits 3 ("partial") and keeps the agent from starting on it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostd.host import Host
from hostd.journal import JOURNAL_NAME, Journal, read_boot_id
from tests.privileged.test_agent import POLICY, Agent, host_state
from tests.workload import TrainingJob

_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else None

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts a tmpfs, renices threads"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
]


def hostd(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@contextlib.contextmanager
def full_tmpfs(path: Path):
    """A 64 KiB tmpfs at ``path``, filled until the kernel says ENOSPC."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(path)],
                   check=True)  # fmt: skip
    try:
        fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(OSError):  # really full
            (path / "probe").write_bytes(b"x" * 4096)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_state_disk_changes_nothing_on_the_host(tmp_path):
    with TrainingJob(ranks=1, workers=1) as job, full_tmpfs(tmp_path / "state"):
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher, policy=POLICY)
        try:
            agent.wait_passes(1)
            st = agent.full_pass()  # the second pass must not take the first's keys as recorded
            counts = st["last_pass"]["counts"]
            assert counts.get("unjournaled", 0) > 0 and "applied" not in counts, counts
            now = host_state(job)
            now["latency"] = before["latency"]  # held while it runs, not a journaled knob
            assert now == before  # no knob without a durable original
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert "journal write failed" in log and "No space left on device" in log
        assert "Traceback" not in log
        assert host_state(job) == before


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def test_a_damaged_journal_restores_what_it_can_read_and_says_what_it_could_not(tmp_path):
    state, run = tmp_path / "state", tmp_path / "run"
    host = Host()
    child = _sleeper()
    try:
        start = host.start_time(child.pid)
        nice = os.getpriority(os.PRIO_PROCESS, child.pid)
        key = f"task/{child.pid}@{start}/nice"
        Journal(state, read_boot_id(host)).record([(key, nice)])
        os.setpriority(os.PRIO_PROCESS, child.pid, 7)  # what hostd would have done
        with open(state / JOURNAL_NAME, "ab") as fh:
            fh.write(b"\xff\xfe\n")  # damage
            fh.write(json.dumps({"key": f"task/{child.pid}@{start}/cpuset",
                                 "orig": "/../../etc"}).encode() + b"\n")  # fmt: skip
        # An agent must not start on it: it would take its own values for originals.
        refused = hostd("run", "--state-dir", str(state), "--run-dir", str(run),
                        "--policy", str(POLICY), "--mode", "observe", "--once")  # fmt: skip
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "damaged" in refused.stderr and "hostd restore" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 7

        out = hostd("restore", "--state-dir", str(state), "--run-dir", str(run), "--json")
        assert out.returncode == 3, out.stdout + out.stderr
        result = json.loads(out.stdout)
        assert [r["outcome"] for r in result["results"]] == ["restored"]
        assert [u["line"] for u in result["unreadable"]] == [2, 3]
        assert "not a plain cgroup path" in result["unreadable"][1]["why"]
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == nice  # the readable record
        assert result["set_aside"] and Path(result["set_aside"]).exists()
        assert not (state / JOURNAL_NAME).exists()  # the next agent may start
        again = hostd("restore", "--state-dir", str(state), "--run-dir", str(run))
        assert again.returncode == 0 and "nothing to do" in again.stdout
    finally:
        child.kill()
        child.wait()


KILL_POINTS = 8  # RELIABILITY.md: "kill -9 at random points"


def test_kill_9_at_random_points_then_restore_leaves_nothing_changed(tmp_path):
    """The agent is killed at random moments from its start to past its first pass (inside a
    pass, between a record and its knob, while idle); each time ``hostd restore`` puts every
    knob back. Figures: the points tried and the knobs left changed (0)."""
    import random
    import signal
    import time

    rng = random.Random(15)
    left: list[tuple[float, dict]] = []
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        for n in range(KILL_POINTS):
            delay = rng.uniform(0.0, 1.5)
            agent = Agent(tmp_path / f"k{n}", job.launcher, policy=POLICY)
            time.sleep(delay)
            agent.stop(signal.SIGKILL)
            out = hostd("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
            assert out.returncode in (0, 3), out.stdout + out.stderr  # 3: a cut last line
            after = host_state(job)
            if after != before:
                left.append((delay, {k: after[k] for k in after if after[k] != before[k]}))
    assert left == [], left

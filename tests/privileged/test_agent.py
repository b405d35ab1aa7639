"""The agent on the real kernel (root): apply every knob kind this machine has, then restore.

Each test starts a realistic idle job (tests/workload.py: names from FACTS.md), snapshots the
host state the agent may touch, runs ``hostd run`` scoped to the job (``--scope-pid``), checks
the intended effect in /proc and cgroupfs, stops the agent (SIGTERM, or kill -9 followed by
``hostd restore``) and asserts the snapshot is identical again. IRQ affinity is host-wide and
is changed and restored for real.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import agentproc
from tests.agentproc import wait_for
from tests.workload import SETTLES_INTO_POLL, TrainingJob

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "tests" / "privileged" / "policy.toml"
_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else None
CPUSET = Path("/sys/fs/cgroup/cpuset")
# The tests that check the policy's cpusets read them in the v1 hierarchy, where this machine
# kind keeps them; on a host of pure cgroup v2 they skip (the VM tier runs the agent there).
needs_v1_cpuset = pytest.mark.skipif(
    not (CPUSET / "cpuset.cpus").exists(),
    reason="needs the cgroup v1 cpuset controller at /sys/fs/cgroup/cpuset (pure cgroup v2: "
    "tests/vm runs the agent there)",
)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent changes real threads"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _thread_state(tid: int) -> tuple | None:
    try:
        raw = os.sched_getscheduler(tid)
        return (
            tuple(sorted(os.sched_getaffinity(tid))),
            raw,
            os.sched_getparam(tid).sched_priority,
            os.getpriority(os.PRIO_PROCESS, tid),
            next(
                (ln.split(":", 2)[2] for ln in (_read(f"/proc/{tid}/cgroup") or "").splitlines()
                 if ln.split(":")[1] == "cpuset"),
                "",
            ),
        )  # fmt: skip
    except OSError:
        return None


def host_state(job: TrainingJob) -> dict:
    """Everything the agent may change: the job's threads, IRQs, cpuset cgroups."""
    threads = {tid: _thread_state(tid) for pid in job.pids for tid in job.tids(pid)}
    irqs = {
        irq: _read(f"/proc/irq/{irq}/smp_affinity_list")
        for irq in sorted(os.listdir("/proc/irq"))
        if irq.isdigit()
    }
    cpusets = sorted(p.name for p in CPUSET.iterdir() if p.is_dir()) if CPUSET.is_dir() else []
    return {
        "threads": threads,
        "irqs": irqs,
        "cpusets": cpusets,
        "latency": _dma_latency(),
        "autogroup": _read(f"/proc/{job.launcher}/autogroup"),  # "/autogroup-N nice X"
    }


AUTOGROUPS = _read("/proc/sys/kernel/sched_autogroup_enabled") == "1"


def _dma_latency() -> int | None:
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_RDONLY)
    except OSError:
        return None
    try:
        return struct.unpack("i", os.read(fd, 4))[0]
    finally:
        os.close(fd)


class Agent(agentproc.Agent):
    def __init__(self, tmp: Path, scope: int, *extra: str, policy: Path = POLICY, **kw) -> None:
        super().__init__(tmp, scope, *extra, policy=policy, **kw)


def hostd(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _effects(job: TrainingJob) -> None:
    """The policy's intended effect, as /proc and cgroupfs show it."""
    rank = job.ranks[0]
    main = _thread_state(rank)
    assert main[1] == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK and main[2] == 10
    assert len(main[0]) == 1  # confined to the trainer's own CPU
    own = main[0][0]
    assert main[4] == "/hostd/trainer"
    tasks = (CPUSET / "hostd" / "trainer" / "tasks").read_text().split()
    assert str(rank) in tasks
    assert _read(str(CPUSET / "hostd" / "trainer" / "cpuset.cpus")) == str(own)
    comms = {}
    for tid in job.tids(rank):
        comm = _read(f"/proc/{tid}/comm")
        comms[comm] = _thread_state(tid)
    assert comms["gloo_tcp_loop"][1] == os.SCHED_RR | os.SCHED_RESET_ON_FORK
    assert comms["gloo_tcp_loop"][2] == 15
    assert own not in comms["gloo_tcp_loop"][0]  # open layers use the pool
    for worker in job.workers:
        assert _thread_state(worker)[1] == os.SCHED_BATCH and _thread_state(worker)[3] == 5
    assert _thread_state(job.launcher)[1] == os.SCHED_IDLE
    if AUTOGROUPS:  # the session the launcher leads (the whole job's) weighs nice 5
        assert (_read(f"/proc/{job.launcher}/autogroup") or "").endswith(" nice 5")
    # IRQs: off the trainer's CPU, except kernel-managed ones that refuse.
    moved = [
        irq for irq in os.listdir("/proc/irq") if irq.isdigit()
        and str(own) not in (_read(f"/proc/irq/{irq}/smp_affinity_list") or "").split(",")
    ]  # fmt: skip
    assert moved


@needs_v1_cpuset
def test_agent_applies_every_knob_and_sigterm_restores(tmp_path):
    with TrainingJob(ranks=2, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher)
        try:
            agent.wait_passes(1)
            st = agent.full_pass()
            _effects(job)
            # hostd's own threads run on the pool, off the trainer's CPU
            trainer = _thread_state(job.ranks[0])[0][0]
            mine = os.listdir(f"/proc/{agent.proc.pid}/task")
            assert mine and all(trainer not in os.sched_getaffinity(int(t)) for t in mine)
            if before["latency"] is not None:
                assert _dma_latency() == 20  # the policy's C-state limit, held while it runs
            assert st["mode"] == "enforce" and st["state"] == "running"
            counts = st["last_pass"]["counts"]
            assert counts.get("skipped", 0) > 0  # the second pass found it all in place
            assert "applied" not in counts  # reconcile by diff: nothing written twice
            status = hostd("status", "--run-dir", str(agent.run)).stdout
            assert "trainer" in status and "mode enforce" in status
            assert "source events: proc connector" in status
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert host_state(job) == before, log
        assert " ERROR " not in log and "Traceback" not in log
        assert not (agent.state / "journal.jsonl").exists()


@needs_v1_cpuset
def test_kill_9_then_restore_puts_the_host_back(tmp_path):
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher)
        agent.wait_passes(1)
        agent.stop(signal.SIGKILL)
        _effects(job)  # a crash leaves the changes in place...
        assert (agent.state / "journal.jsonl").exists()
        out = hostd("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        assert out.returncode == 0, out.stdout + out.stderr
        assert host_state(job) == before  # ...and restore puts everything back
        again = hostd("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        assert again.returncode == 0 and "nothing to do" in again.stdout  # idempotent


def test_observe_mode_changes_nothing(tmp_path):
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher, "--mode", "observe")
        st = agent.wait_passes(1)
        assert st["last_pass"]["counts"].get("would-apply", 0) > 0
        assert host_state(job) == before
        agent.stop()
        assert host_state(job) == before


@needs_v1_cpuset
def test_disable_restores_and_enable_reapplies(tmp_path):
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher)
        try:
            agent.wait_passes(1)
            _effects(job)
            assert hostd("disable", "--run-dir", str(agent.run)).returncode == 0
            deadline = time.monotonic() + 20
            while agent.status().get("state") != "disabled" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert host_state(job) == before
            n = agent.status()["passes"]
            assert hostd("enable", "--run-dir", str(agent.run)).returncode == 0
            agent.wait_passes(n + 1)
            _effects(job)
        finally:
            agent.stop()
        assert host_state(job) == before


@needs_v1_cpuset
def test_sighup_with_a_bad_policy_keeps_the_old_one(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.read_text())
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher, policy=policy)
        try:
            agent.wait_passes(1)
            policy.write_text("version = 1\n[[layer]]\nname = 'x'\n")
            n = agent.status()["passes"]
            agent.proc.send_signal(signal.SIGHUP)
            agent.wait_passes(n + 1)
            _effects(job)  # still the old policy
        finally:
            log = agent.stop()
        assert "reload refused, keeping the running policy" in log
        assert host_state(job) == before


def test_second_agent_refuses_to_start(tmp_path):
    with TrainingJob(ranks=1, workers=0) as job:
        agent = Agent(tmp_path, job.launcher)
        try:
            agent.wait_passes(1)
            second = subprocess.run(
                [HOSTD, "run", "--policy", str(POLICY), "--state-dir", str(tmp_path / "s2"),
                 "--run-dir", str(agent.run), "--scope-pid", str(job.launcher)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert second.returncode == 1
            assert "another hostd agent is running" in second.stderr
        finally:
            agent.stop()


def test_untrusted_policy_file_is_refused(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.read_text())
    policy.chmod(0o666)
    proc = hostd("run", "--once", "--policy", str(policy), "--state-dir", str(tmp_path / "s"),
                 "--run-dir", str(tmp_path / "r"), "--scope-pid", str(os.getpid()))  # fmt: skip
    assert proc.returncode == 2
    assert "writable by group or others" in proc.stderr
    assert not (tmp_path / "s" / "journal.jsonl").exists()


# What the thread-making scripts below share: a thread renames itself (only threads of the
# same process may rename each other).
_RENAME = r"""
import os, threading, time, sys
def rename(name):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
        fh.write(name)
"""

_CHURN = (
    _RENAME
    + r"""
def short():
    rename("gloo_tcp_loop")
    time.sleep(0.002)
born = 0
sys.stdout.write("ready\n"); sys.stdout.flush()
while born < 5000:
    batch = [threading.Thread(target=short) for _ in range(50)]
    for t in batch: t.start()
    for t in batch: t.join()
    born += len(batch)
sys.stdout.write("done\n"); sys.stdout.flush()
time.sleep(30)
"""
)


def test_race_5000_short_lived_threads_while_applying(tmp_path):
    churn = subprocess.Popen(
        [sys.executable, "-c", _CHURN], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    agent = None
    try:
        assert churn.stdout.readline().strip() == "ready"
        agent = Agent(tmp_path, churn.pid)
        assert churn.stdout.readline().strip() == "done"  # 5000 threads came and went
        text = agent.stop()
        assert agent.proc.returncode == 0, text
        assert "Traceback" not in text and " ERROR " not in text, text
        passes = [ln for ln in text.splitlines() if " pass n=" in ln]
        assert passes, text
        # A consistent journal: everything restored or gone, the file removed.
        journal = agent.state / "journal.jsonl"
        assert not journal.exists(), journal.read_text()[:2000]
        assert _thread_state(churn.pid)[1] == os.SCHED_OTHER
    finally:
        if agent is not None:
            agent.stop()
        os.killpg(churn.pid, signal.SIGKILL)
        churn.wait()


@needs_v1_cpuset
def test_a_renamed_thread_moves_layers_and_still_restores_to_its_first_original(tmp_path):
    with TrainingJob(ranks=1, workers=0) as job:
        before = host_state(job)
        rank = job.ranks[0]
        gloo = next(t for t in job.tids(rank) if _read(f"/proc/{t}/comm") == "gloo_tcp_loop")
        agent = Agent(tmp_path, job.launcher)
        try:
            agent.wait_passes(1)
            assert _thread_state(gloo)[1] == os.SCHED_RR | os.SCHED_RESET_ON_FORK
            n = agent.status()["passes"]
            os.kill(rank, signal.SIGUSR1)  # it renames itself "python3": now a trainer thread

            def moved() -> bool:  # the cpuset join may wait for a quiet moment: wait for it too
                state = _thread_state(gloo)
                fifo = state[1] == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK and state[2] == 10
                return fifo and state[4] == "/hostd/trainer"

            wait_for(moved, "the renamed thread in the trainer layer", agent)
            state = _thread_state(gloo)
            assert state[4] == "/hostd/trainer" and len(state[0]) == 1
            st = agent.status()
            assert st["passes"] == n, "a full pass did it, not the comm event"
            wait_for(lambda: agent.status().get("events", {}).get("event_passes"), "status")
        finally:
            log = agent.stop()
        os.kill(rank, signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while _read(f"/proc/{gloo}/comm") != "gloo_tcp_loop" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert host_state(job) == before, log


def _children(pid: int) -> set[int]:
    return {int(c) for c in (_read(f"/proc/{pid}/task/{pid}/children") or "").split()}


def test_new_thread_and_new_process_after_start_are_placed_by_events(tmp_path):
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        rank = job.ranks[0]
        agent = Agent(tmp_path, job.launcher)
        try:
            st = agent.wait_passes(1)
            assert st["source"]["kind"] == "events", st["source"]
            n = st["passes"]
            old_tids, old_children = set(job.tids(rank)), _children(rank)
            job.new_thread(rank)  # pt_nccl_heartbt: the comms layer, RR 15
            wait_for(lambda: len(job.tids(rank)) > len(old_tids), "the new thread", agent)
            job.new_worker(rank)  # one more pt_data_worker process: BATCH, nice 5
            wait_for(lambda: _children(rank) - old_children, "the new worker", agent)
            (tid,) = set(job.tids(rank)) - old_tids
            (worker,) = _children(rank) - old_children
            wait_for(
                lambda: _thread_state(tid)[1:3] == (os.SCHED_RR | os.SCHED_RESET_ON_FORK, 15),
                "the new comm thread in the comms layer",
                agent,
            )
            wait_for(
                lambda: (_read(f"/proc/{worker}/comm") == "pt_data_worker"
                         and _thread_state(worker)[1] == os.SCHED_BATCH
                         and _thread_state(worker)[3] == 5),
                "the new data worker in the data layer",
                agent,
            )  # fmt: skip
            assert agent.status()["passes"] == n, "a full pass did it, not the events"
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert " ERROR " not in log and "Traceback" not in log, log
        after = host_state(job)
        # The new thread and worker are hostd's changes undone, like every other thread.
        assert _thread_state(tid)[1:4] == (os.SCHED_OTHER, 0, 0)
        assert _thread_state(worker)[1:4] == (os.SCHED_OTHER, 0, 0)
        for key in ("irqs", "cpusets", "latency"):
            assert after[key] == before[key]
        assert {t: after["threads"][t] for t in before["threads"]} == before["threads"]


_SPAWNER = (
    _RENAME
    + r"""
def idle():
    rename("gloo_tcp_loop")
    time.sleep(3600)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=idle, daemon=True).start()
sys.stdout.write("done\n"); sys.stdout.flush()
time.sleep(3600)
"""
)


def test_a_forced_overflow_rescans_and_misses_nothing(tmp_path):
    """A tiny receive buffer loses events in a burst of 2,000 threads: the agent must notice
    (ENOBUFS), rescan, and end with every thread placed. The agent is stopped (SIGSTOP) during
    the burst: running, it sometimes kept up with the spawner on 2 CPUs, and nothing was lost."""
    spawner = subprocess.Popen(
        [sys.executable, "-c", _SPAWNER, "2000"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    agent = None
    try:
        assert spawner.stdout.readline().strip() == "ready"
        agent = Agent(tmp_path, spawner.pid, env={"HOSTD_CONNECTOR_RCVBUF": "4096"})
        agent.wait_passes(1)
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            spawner.stdin.write("go\n")
            spawner.stdin.flush()
            assert spawner.stdout.readline().strip() == "done"
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        tids = [int(t) for t in os.listdir(f"/proc/{spawner.pid}/task")]
        assert len(tids) > 2000

        def placed() -> int:
            """Threads in the comms layer: RR, or nice -20 once the layer's RT cap is full."""
            states = [_thread_state(t) or (0, 0, 0, 0) for t in tids]
            return sum(
                1 for st in states
                if st[1] == os.SCHED_RR | os.SCHED_RESET_ON_FORK
                or (st[1] == os.SCHED_OTHER and st[3] == -20)
            )  # fmt: skip

        wait_for(lambda: placed() == 2000, "every new thread in the comms layer", agent, 60)

        # (the status is written at most once a second: wait for the one that counts it)
        def counted() -> bool:
            return agent.status().get("events", {}).get("overflows", 0) >= 1

        wait_for(counted, "the overflow counted in the status", agent)
        text = agent.stop()
        assert "events lost (receive buffer overflow): rescanning /proc" in text
        assert agent.proc.returncode == 0 and " ERROR " not in text, text
        assert placed() == 0  # and all of it restored
    finally:
        if agent is not None:
            agent.stop()
        os.killpg(spawner.pid, signal.SIGKILL)
        spawner.wait()


def _set_online(cpu: int, on: bool) -> None:
    Path(f"/sys/devices/system/cpu/cpu{cpu}/online").write_text("1" if on else "0")


@pytest.mark.skipif(
    not Path("/sys/devices/system/cpu/cpu1/online").exists(), reason="CPU 1 cannot be offlined"
)
@needs_v1_cpuset
def test_cpu_offline_and_online_ends_with_the_planned_cpusets(tmp_path):
    """Offlining a CPU empties the v1 cpuset that held it (FACTS.md) and the kernel moves its
    threads out; once the CPU is back, the agent (told by a uevent) puts them back."""
    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        agent = Agent(tmp_path, job.launcher)
        cpu = None
        try:
            agent.wait_passes(1)
            _effects(job)
            cpu = _thread_state(job.ranks[0])[0][0]  # the trainer's own CPU
            if cpu == 0:
                pytest.skip("the trainer's CPU is CPU 0, which cannot go offline")
            n = agent.status()["passes"]
            _set_online(cpu, False)
            agent.wait_passes(n + 1)  # the offline event: a full pass on one CPU fewer
            _set_online(cpu, True)
            cpu = None
            agent.wait_passes(n + 2)  # the online event: planned again, cpusets refilled
            wait_for(lambda: _try(_effects, job), "the planned cpusets back", agent)
            assert agent.status()["events"].get("device_events", 0) >= 2
        finally:
            if cpu is not None:
                _set_online(cpu, True)
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert host_state(job) == before, log


def _try(check, *args) -> bool:
    try:
        check(*args)
        return True
    except (AssertionError, OSError, TypeError, IndexError):
        return False


def test_polling_fallback_places_new_threads_and_says_so(tmp_path):
    """``[agent] source = "poll"`` (what hostd does where the connector is unavailable): new
    threads are placed by the next rescan, and status and the log say which source is used."""
    policy = tmp_path / "poll.toml"
    policy.write_text(
        POLICY.read_text().replace('mode = "enforce"', 'mode = "enforce"\nsource = "poll"')
    )
    with TrainingJob(ranks=1, workers=0) as job:
        before = host_state(job)
        rank = job.ranks[0]
        agent = Agent(tmp_path, job.launcher, policy=policy)
        try:
            st = agent.wait_passes(1)
            assert st["source"]["kind"] == "poll", st["source"]
            assert "polling /proc every 0.2 s" in st["source"]["detail"]
            old = set(job.tids(rank))
            job.new_thread(rank)
            wait_for(lambda: len(job.tids(rank)) > len(old), "the new thread", agent)
            (tid,) = set(job.tids(rank)) - old
            wait_for(
                lambda: _thread_state(tid)[1:3] == (os.SCHED_RR | os.SCHED_RESET_ON_FORK, 15),
                "the new comm thread placed by a polling pass",
                agent,
            )
            assert agent.status()["events"].get("event_passes", 0) == 0
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        after = host_state(job)
        assert {t: after["threads"][t] for t in before["threads"]} == before["threads"]


_ACTIVITY_POLICY = """
version = 1
name = "activity"
[[layer]]
name = "comms"
comment = "a rank's unnamed threads that wait in poll(2)"
match = [[{ activity = "polls" }, { job_role = "rank" }, { uid = 0 }]]
kind = "open"
sched = { nice = 3 }
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
kind = "open"
"""


def test_an_unnamed_thread_that_settles_into_poll_moves_without_a_full_pass(tmp_path):
    """A rank's unnamed thread waits on a lock when the agent starts, then settles into poll(2)
    (what NCCL's service thread does after its start): the agent's second look moves it to the
    layer of threads that poll, by itself, and the stop restores it."""
    policy = tmp_path / "policy.toml"
    policy.write_text(_ACTIVITY_POLICY)
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"}
    job = subprocess.Popen(
        [sys.executable, "-c", SETTLES_INTO_POLL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    agent = None
    try:
        assert job.stdout.readline() == "ready\n"
        service = max(int(t) for t in os.listdir(f"/proc/{job.pid}/task"))
        agent = Agent(tmp_path, job.pid, policy=policy)
        agent.wait_passes(1)
        assert os.getpriority(os.PRIO_PROCESS, service) == 0  # waits: not yet known
        n = agent.status()["passes"]
        job.stdin.write("go\n")
        job.stdin.flush()
        wait_for(lambda: os.getpriority(os.PRIO_PROCESS, service) == 3, "moved by a relook", agent)
        assert agent.status()["passes"] == n, "a full pass did it, not the relook"
        assert os.getpriority(os.PRIO_PROCESS, job.pid) == 0  # the leader: its own name
        log = agent.stop()
        assert f"relook threads=1 {service}:polls" in log, log
        assert os.getpriority(os.PRIO_PROCESS, service) == 0  # restored
    finally:
        if agent is not None:
            agent.stop()
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


STORM = """
import sys, threading, time
print("ready", flush=True)
sys.stdin.readline()
for _ in range(3000):  # thousands of fork events at once: a storm
    threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
print("done", flush=True)
time.sleep(3600)
"""


def _nice(pid: int) -> tuple[int, str]:
    """A process's nice and its autogroup's ("/autogroup-N nice X": X)."""
    return os.getpriority(os.PRIO_PROCESS, pid), _read(f"/proc/{pid}/autogroup").split()[-1]


@pytest.mark.skipif(not AUTOGROUPS, reason="autogroups are off on this kernel")
def test_the_agent_raises_its_priority_in_a_storm_and_lowers_it_after(tmp_path):
    """At rest the agent keeps the nice it started with (its wake-ups must not preempt a rank
    mid-step); a storm of new threads raises it and its session to [agent] nice (-10, the
    default) until the storm has passed."""
    job = subprocess.Popen(
        [sys.executable, "-c", STORM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    agent = None
    try:
        assert job.stdout.readline() == "ready\n"
        agent = agentproc.Agent(tmp_path, job.pid, policy=POLICY, new_session=True)
        agent.wait_passes(1)
        me = agent.proc.pid
        assert _nice(me) == (0, "0")  # at rest
        os.kill(me, signal.SIGSTOP)  # the storm comes faster than the agent reads: it waits
        try:
            job.stdin.write("go\n")
            job.stdin.flush()
            assert job.stdout.readline() == "done\n"
        finally:
            os.kill(me, signal.SIGCONT)
        wait_for(lambda: _nice(me) == (-10, "-10"), "the agent raised in the storm", agent)
        wait_for(lambda: _nice(me) == (0, "0"), "the agent at rest again", agent)
        log = agent.stop()
        assert "Traceback" not in log, log
    finally:
        if agent is not None:
            agent.stop()
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()

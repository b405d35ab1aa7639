"""Preemptible work and the starvation guard on the real kernel (root), in a sandbox.

Each test starts its own process tree (``Sandbox``): an idle protected "job" process, busy
"competitor" sessions, a thread a real-time spinner starves; runs ``hostd run`` scoped to the
tree with tests/privileged/preempt.toml; checks in /proc what the agent did (SCHED_IDLE, the
session's autogroup nice, a boost, a runaway returned to normal scheduling); stops the agent
(SIGTERM, or kill -9 and ``hostd restore``) and asserts that every thread of the tree is back
as it was, including threads and processes born SCHED_IDLE while their session was demoted
(also while hostd was dead). Nothing outside the tree is touched: the agent is scoped to it.
CPU-bound children are pinned to one CPU and live a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import agentproc
from tests.agentproc import wait_for

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "tests" / "privileged" / "preempt.toml"
_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else None
AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent changes real threads"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
    pytest.mark.skipif(
        Path("/sys/fs/cgroup/cpu/hostd.demoted").exists()
        or Path("/sys/fs/cgroup/hostd.demoted").exists(),
        reason="a hostd agent on this host has demoted work (its cgroup hostd.demoted exists)",
    ),
]

# The sandbox's processes. Roles: "root" starts the others and prints their pids as JSON;
# "job" sleeps (the protected layer's thread); "busy" leads a session of its own and spins,
# with one spinning child; SIGUSR1 makes it fork a sleeping child and start a sleeping
# thread (both born with its scheduling policy), whose ids it appends to a file; "victim"
# spins, pinned; "spin" sets itself SCHED_FIFO 5 (the test's own real-time hog) and spins;
# "rtspin" spins and waits to be made real-time by hostd.
_CHILD = textwrap.dedent(
    r"""
    import json, os, signal, sys, threading, time
    role, cpu = sys.argv[1], int(sys.argv[2])
    def name(comm):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
            fh.write(comm)
    def spin():
        while True:
            pass
    if role == "root":
        name("tsandbox")
        out = {}
        for sub in sys.argv[3].split(","):
            proc = __import__("subprocess").Popen([sys.executable, "-c", CODE, sub, str(cpu)])
            out[sub] = proc.pid
        print(json.dumps(out), flush=True)
        while True:
            time.sleep(3600)
    os.sched_setaffinity(0, {cpu})
    if role == "job":
        name("tjob")
        while True:
            time.sleep(3600)
    elif role == "busy":
        os.setsid()
        name("tbusy")
        born = sys.argv[3] if len(sys.argv) > 3 else f"/tmp/tbusy-{os.getpid()}"
        def more(*_):
            pid = os.fork()
            if pid == 0:
                name("tbusy_kid")
                while True:
                    time.sleep(3600)
            def sleeper():
                name("tbusy_thr")
                with open(born, "a") as fh:
                    fh.write(f"{threading.get_native_id()}\n")
                while True:
                    time.sleep(3600)
            with open(born, "a") as fh:
                fh.write(f"{pid}\n")
            threading.Thread(target=sleeper, daemon=True).start()
        signal.signal(signal.SIGUSR1, more)
        if os.fork() == 0:
            name("tbusy_w")
        spin()
    elif role == "victim":
        name("tvictim")
        spin()
    elif role == "spin":
        name("tspin")
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        spin()
    elif role == "rtspin":
        name("trtspin")
        spin()
    """
)


class Sandbox:
    """The test's process tree; leaving the context kills every process of it."""

    def __init__(self, tmp: Path, roles: list[str], cpu: int) -> None:
        self.born = tmp / "born.txt"
        code = _CHILD.replace('f"/tmp/tbusy-{os.getpid()}"', repr(str(self.born)))
        self.code = f"CODE = {code!r}\n" + code
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.code, "root", str(cpu), ",".join(roles)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.pids: dict[str, int] = json.loads(self.proc.stdout.readline())
        self.root = self.proc.pid
        if "busy" in roles:
            wait_for(lambda: len(self.kids("busy")) == 1, "the busy session's worker")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        for pid in self.tree():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def tree(self) -> list[int]:
        """Every process below the root (also those that left its session)."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    ppid = int(stat.rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry))
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return sorted(found)

    def threads(self) -> dict[int, tuple]:
        """(policy, priority, nice, autogroup nice, cpu cgroup) of every thread of the tree."""
        state = {}
        for pid in self.tree():
            with contextlib.suppress(OSError):
                autogroup = Path(f"/proc/{pid}/autogroup").read_text().split()[-1]
                cgroup = _cpu_cgroup(pid)
                for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                    with contextlib.suppress(OSError):
                        state[tid] = (
                            os.sched_getscheduler(tid),
                            os.sched_getparam(tid).sched_priority,
                            os.getpriority(os.PRIO_PROCESS, tid),
                            autogroup,
                            cgroup,
                        )
        return state

    def kids(self, role: str) -> list[int]:
        """The busy session's worker processes (its leader's children)."""
        leader = self.pids[role]
        return [
            pid
            for pid in self.tree()
            if pid != leader and _stat(pid)[0] == leader  # its parent
        ]

    def more(self) -> list[int]:
        """Make the busy leader fork a child and start a thread; their ids."""
        have = self.born.read_text().split() if self.born.exists() else []
        os.kill(self.pids["busy"], signal.SIGUSR1)
        wait_for(lambda: self.born.exists() and len(self.born.read_text().split()) >= len(have) + 2,
                 "the busy session's new child and thread")  # fmt: skip
        return [int(x) for x in self.born.read_text().split()[len(have) :]]


def _stat(pid: int) -> tuple[int, int]:
    """(ppid, session) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])


def _born_demoted(born: list[int]) -> bool:
    """Whether threads born in a demoted session are SCHED_IDLE. They inherit it, except when
    born while the guard boosts their parent (SCHED_FIFO with reset-on-fork, or its own policy
    back where real-time is refused: hostd.agent.guard): then they are born SCHED_OTHER and the
    agent decides them from the fork event, a moment later."""
    return all(_policy(t) == os.SCHED_IDLE for t in born)


def _policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK
    except OSError:
        return None


def _autogroup(pid: int) -> str:
    return Path(f"/proc/{pid}/autogroup").read_text().split()[-1]


def _cpu_mount() -> tuple[int, Path] | None:
    import hostd.sched.group as group

    found = group.mount("/")
    return None if found is None else (found[0], Path("/") / found[1])


def _cpu_cgroup(pid: int) -> str:
    """The process's cgroup in the cpu controller's hierarchy ("/": the root)."""
    found = _cpu_mount()
    want = "cpu" if found and found[0] == 1 else ""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (want in controllers.split(",")) if want else not controllers:
            return path
    return "?"


# hostd's own cgroup for demoted processes of the root cpu cgroup (hostd.sched.group.HOME)
HOME = _cpu_mount()[1] / "hostd.demoted" if _cpu_mount() else None


def _at_home(pids: list[int]) -> bool:
    """The processes are in /hostd.demoted, which yields (cpu.idle = 1, else least weight)."""
    return all(_cpu_cgroup(p) == "/hostd.demoted" for p in pids) and _yields(HOME)


class Agent(agentproc.Agent):
    def __init__(self, tmp: Path, scope: int, *extra: str, policy: Path = POLICY) -> None:
        super().__init__(tmp, scope, *extra, policy=policy)

    def preempt(self) -> dict:
        return self.status().get("preempt") or {}


def hostd(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _demoted(box: Sandbox, home: bool = False) -> bool:
    """The busy session's threads SCHED_IDLE, its autogroup nice 19 and (``home``: it started
    in the root cpu cgroup) its processes in hostd's cgroup."""
    busy = [box.pids["busy"], *box.kids("busy")]
    idle = all(_policy(pid) == os.SCHED_IDLE for pid in busy)
    grouped = not AUTOGROUPS or _autogroup(box.pids["busy"]) == "19"
    return idle and grouped and (not home or _at_home(busy))


def _start_demoted(tmp: Path, box: Sandbox, home: bool = True) -> Agent:
    agent = Agent(tmp, box.root)
    agent.wait_passes(1)
    wait_for(lambda: _demoted(box, home), "the busy session demoted", agent)
    return agent


def _back_as_before(box: Sandbox, before: dict[int, tuple], born: list[int]) -> None:
    now = box.threads()
    assert {tid: now[tid] for tid in before if tid in now} == before
    for tid in born:  # born SCHED_IDLE in the demoted session: back to what it inherited from
        assert now[tid][:3] == (os.SCHED_OTHER, 0, 0), (tid, now[tid])


def test_a_busy_session_is_demoted_while_the_job_runs_and_sigterm_restores(tmp_path):
    with Sandbox(tmp_path, ["job", "busy"], cpu=1) as box:
        before = box.threads()
        agent = _start_demoted(tmp_path, box)
        try:
            assert _policy(box.pids["job"]) == os.SCHED_OTHER  # the job itself is untouched
            assert _cpu_cgroup(box.pids["job"]) == "/"
            born = box.more()  # a child and a thread born in the demoted session ...
            wait_for(lambda: _born_demoted(born), "the new threads SCHED_IDLE", agent)  # ... too
            assert _at_home(born)  # ... and hostd's cgroup, where they stay while it is demoted
            time.sleep(1.5)  # several watch ticks (each checks who may stay in hostd's cgroup)
            assert _at_home(born)
            wait_for(lambda: agent.preempt().get("demoted"), "status.json says so", agent)
            pre = agent.preempt()
            assert pre["active"] and [d["session"] for d in pre["demoted"]] == [box.pids["busy"]]
            status = hostd("status", "--run-dir", str(agent.run)).stdout
            assert f"session {box.pids['busy']} demoted" in status
            explained = hostd("explain", str(box.pids["busy"]), "--policy", str(POLICY),
                              "--run-dir", str(agent.run),
                              "--state-dir", str(agent.state)).stdout  # fmt: skip
            assert "DEMOTED" in explained
            said = "hostd now: thread scheduling policy idle (before hostd: other)\n"
            assert said in explained, explained
            # what hostd holds changed, from the agent's own journal: the demoted threads, held
            held = json.loads(hostd("changes", "--state-dir", str(agent.state), "--json").stdout)
            sched = {k["key"]: k for k in held["knobs"] if k["kind"] == "sched"}
            key = next(k for k in sched if k.startswith(f"task/{box.pids['busy']}@"))
            assert sched[key]["state"] == "held" and sched[key]["current"][0] == "idle"
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        _back_as_before(box, before, born)
        assert "preempt demote session=" in log and "Traceback" not in log
        after = json.loads(hostd("changes", "--state-dir", str(agent.state), "--json").stdout)
        assert after["knobs"] == []  # everything restored: the journal holds nothing
        assert f"preempt home session={box.pids['busy']} moved=2" in log
        assert not (agent.state / "journal.jsonl").exists()
        assert not HOME.exists()  # emptied into the root (the born child too) and removed


def test_kill_9_then_restore_also_restores_what_was_born_after_the_crash(tmp_path):
    with Sandbox(tmp_path, ["job", "busy"], cpu=1) as box:
        before = box.threads()
        agent = _start_demoted(tmp_path, box)
        born = box.more()
        agent.stop(signal.SIGKILL)
        try:
            born += box.more()  # born while no agent runs: only the session record knows it
            assert all(_policy(t) == os.SCHED_IDLE for t in born) and _at_home(born)
        finally:
            out = hostd("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        assert out.returncode == 0, out.stdout + out.stderr
        _back_as_before(box, before, born)
        assert all(_cpu_cgroup(pid) == "/" for pid in born) and not HOME.exists()
        again = hostd("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        assert again.returncode == 0 and "nothing to do" in again.stdout


def test_the_session_is_released_when_the_job_leaves(tmp_path):
    with Sandbox(tmp_path, ["job", "busy"], cpu=1) as box:
        before = box.threads()
        agent = _start_demoted(tmp_path, box)
        try:
            born = box.more()
            os.kill(box.pids["job"], signal.SIGKILL)  # the protected job leaves
            busy = [box.pids["busy"], *box.kids("busy")]
            wait_for(
                lambda: all(_policy(p) == os.SCHED_OTHER for p in busy + born),
                "the busy session released",
                agent,
            )
            if AUTOGROUPS:
                assert _autogroup(box.pids["busy"]) == "0"
            wait_for(lambda: not HOME.exists(), "hostd's cgroup emptied and removed", agent)
            assert all(_cpu_cgroup(p) == "/" for p in busy + born)
            wait_for(
                lambda: agent.preempt().get("counts", {}).get("releases"),
                "status.json says so",
                agent,
            )
            pre = agent.preempt()
            assert not pre["active"] and not pre["demoted"]
            assert pre["counts"]["releases"] == 1
        finally:
            log = agent.stop()
        del before[box.pids["job"]]
        _back_as_before(box, before, born)
        assert "preempt release session=" in log


def test_observe_mode_decides_but_changes_nothing(tmp_path):
    with Sandbox(tmp_path, ["job", "busy"], cpu=1) as box:
        before = box.threads()
        agent = Agent(tmp_path, box.root, "--mode", "observe")
        try:
            wait_for(lambda: agent.preempt().get("demoted"), "a demotion decided", agent)
            assert box.threads() == before
        finally:
            agent.stop()
        assert box.threads() == before


def test_the_guard_boosts_a_thread_a_real_time_spinner_starves(tmp_path):
    with Sandbox(tmp_path, ["job", "victim", "spin"], cpu=1) as box:
        wait_for(lambda: _policy(box.pids["spin"]) == os.SCHED_FIFO, "the spinner real-time")
        before = box.threads()
        victim = box.pids["victim"]
        agent = Agent(tmp_path, box.root)
        try:
            wait_for(lambda: agent.preempt().get("counts", {}).get("boosts"), "a boost", agent)
            recent = agent.preempt()["recent"]
            assert any(ev["what"] == "boost" and ev["tid"] == victim for ev in recent), recent
            explained = hostd("explain", str(victim), "--policy", str(POLICY),
                              "--run-dir", str(agent.run)).stdout  # fmt: skip
            assert "guard: boost" in explained
        finally:
            log = agent.stop()
        assert f"guard boost tid={victim}" in log
        assert box.threads() == before  # the spinner keeps its own FIFO 5, the victim its policy


def test_a_runaway_real_time_thread_returns_to_normal_scheduling(tmp_path):
    with Sandbox(tmp_path, ["job", "rtspin"], cpu=1) as box:
        before = box.threads()
        spinner = box.pids["rtspin"]
        agent = Agent(tmp_path, box.root)
        try:
            wait_for(lambda: agent.preempt().get("runaways"), "a runaway", agent)
            runaways = agent.preempt()["runaways"]
            assert [(r["tid"], r["comm"]) for r in runaways] == [(spinner, "trtspin")]
            assert runaways[0]["start"] > 0  # hostd plan keys it by (tid, start time)
            assert _policy(spinner) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, spinner) == -20
            status = hostd("status", "--run-dir", str(agent.run)).stdout
            assert "1 runaway real-time threads returned to normal" in status
        finally:
            log = agent.stop()
        assert f"guard runaway tid={spinner}" in log
        assert box.threads() == before


# -- a busy session in a cgroup of its own (a scope, a container): the cgroup yields too ---------
@pytest.fixture
def tenant():
    """A cgroup of the test's own in the cpu controller's v1 hierarchy, for the busy session;
    afterwards every process in it goes back to the root cgroup and it is removed."""
    import hostd.sched.group as group

    found = group.mount("/")
    if found is None or found[0] != 1:
        pytest.skip("needs the cpu controller on cgroup v1 (the VM tier tests v2)")
    top = Path("/") / found[1]
    path = top / "hostd-test-tenant"
    path.mkdir()
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (top / "cgroup.procs").write_text(pid)
        path.rmdir()


def test_the_guard_knows_where_the_kernel_refuses_real_time(tenant):
    """RT group scheduling: a cgroup made below the root has no real-time budget, and the
    guard's boost (SCHED_FIFO) is refused there: it must know before it tries."""
    from hostd.agent.guard import rt_refused
    from hostd.host import Host
    from hostd.topology import read_topology

    host = Host("/")
    topo = read_topology(host)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert not rt_refused(host, topo, proc.pid)  # the root cgroup: the host's budget
        (tenant / "cgroup.procs").write_text(str(proc.pid))
        refused = rt_refused(host, topo, proc.pid)
        try:
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(1))
            took = True
            os.sched_setscheduler(proc.pid, os.SCHED_OTHER, os.sched_param(0))
        except PermissionError:
            took = False
        assert refused == (not took)  # what the kernel does, known beforehand
        budget = tenant / "cpu.rt_runtime_us"
        assert refused == (budget.exists() and budget.read_text().strip() == "0")
    finally:
        proc.kill()
        proc.wait()


def _setting(path: Path) -> str:
    """What weighs the cgroup down: its cpu.idle (Linux 5.15+, v1 too), else its cpu.shares."""
    idle = path / "cpu.idle"
    return idle.read_text().strip() if idle.exists() else (path / "cpu.shares").read_text().strip()


def _yields(path: Path) -> bool:
    idle = path / "cpu.idle"
    return _setting(path) == ("1" if idle.exists() else "2")


def _tenant_weighed_down(tmp_path, box, tenant):
    """The busy session moved into ``tenant``, the agent started and ``tenant`` weighed down:
    (its setting before, the box's threads before, the agent)."""
    for pid in [box.pids["busy"], *box.kids("busy")]:
        (tenant / "cgroup.procs").write_text(str(pid))
    setting = _setting(tenant)
    before = box.threads()
    agent = _start_demoted(tmp_path, box, home=False)
    try:
        wait_for(lambda: _yields(tenant), "the tenant cgroup weighed down", agent)
    except BaseException:
        agent.stop()
        raise
    return setting, before, agent


def test_a_busy_session_in_a_cgroup_of_its_own_has_its_cgroup_weighed_down(tmp_path, tenant):
    with Sandbox(tmp_path, ["job", "busy"], cpu=1) as box:
        setting, before, agent = _tenant_weighed_down(tmp_path, box, tenant)
        try:
            wait_for(lambda: agent.preempt().get("demoted_cgroups"), "status.json says so", agent)
            assert agent.preempt()["demoted_cgroups"] == ["/hostd-test-tenant"]
            status = hostd("status", "--run-dir", str(agent.run)).stdout
            assert "cgroup /hostd-test-tenant yields as a whole" in status
            # a process of a session that is not demoted joins it: the cgroup's weight is back
            (tenant / "cgroup.procs").write_text(str(box.root))
            wait_for(lambda: _setting(tenant) == setting, "the cgroup's weight given back", agent)
            assert _demoted(box)  # its threads stay demoted
            (tenant.parent / "cgroup.procs").write_text(str(box.root))
        finally:
            log = agent.stop()
        assert agent.proc.returncode == 0, log
        assert "preempt group demote cgroup=/hostd-test-tenant" in log
        assert "preempt group cap cgroup=/hostd-test-tenant" in log
        assert log.count("preempt group release cgroup=/hostd-test-tenant why=") == 1, log
        assert "which is not demoted" in log
        assert _setting(tenant) == setting
        _back_as_before(box, before, [])


def test_kill_9_then_restore_gives_the_cgroup_its_weight_back(tmp_path, tenant):
    with Sandbox(tmp_path, ["job", "busy"], cpu=1) as box:
        setting, before, agent = _tenant_weighed_down(tmp_path, box, tenant)
        agent.stop(signal.SIGKILL)
        out = hostd("restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run))
        assert out.returncode == 0, out.stdout + out.stderr
        assert _setting(tenant) == setting
        _back_as_before(box, before, [])

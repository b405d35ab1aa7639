"""A stand-in node, as real processes in real cgroups at the paths a real node has (issue 43): the
node's own infrastructure is never demoted, competing work wherever it sits is, no cgroup another
manager owns is written unless the policy says so, and the stop puts every thread, session and
cgroup back (root, live kernel; cgroup v1 here, v2 in the VM tier, which runs these tests too).

Each busy process is placed in its cgroup and session before it execs (as runc, logind and
slurmstepd place what they start) in every hierarchy that matters: the v2 tree (or v1's unified
one) where the node model reads the path, and v1's ``cpu`` where the CPU is shared. A pod's
namespace is in its container's bundle at containerd's path, written by the test only where no
containerd keeps that folder (else the pods are left out).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.agentproc import wait_for
from tests.nodecg import CONTAINERD, Cgroup, bundle, contain, hexid, pod_path
from tests.privileged.test_agent import AUTOGROUPS
from tests.privileged.test_preempt import HOSTD, Agent, _autogroup, _policy

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups, sessions of other users"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
]

# Under the VM tier's emulation an interpreter starts in seconds, not milliseconds.
PATIENCE = 300.0 if os.environ.get("HOSTD_IN_VM") == "1" else 60.0
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
BUSY = textwrap.dedent(
    """
    import os, sys
    with open("/proc/self/comm", "w") as fh:
        fh.write(sys.argv[1])
    if sys.argv[1] == "tjob":
        import time
        while True:
            time.sleep(3600)
    while True:
        pass
    """
)
POLICY = textwrap.dedent(
    """
    version = 1
    name = "node-test"
    [agent]
    interval = 0.2
    [preempt]
    interval = 0.2
    busy = 0.3
    release_after = 1
    [guard]
    enabled = false
    [[layer]]
    name = "job"
    comment = "the protected job: an idle process"
    match = [[{ comm_prefix = "tjob" }, { uid = 0 }]]
    preempt = true
    [[layer]]
    name = "rest"
    comment = "everything else: preemptible, unless the node keeps it ([preempt] keep_*)"
    match = [[]]
    preemptible = true
    """
)


class Node:
    """The stand-in node: name -> (cgroup path, uid, demoted or kept by the default rules)."""

    def __init__(self) -> None:
        infra, work, agent, userns = hexid(), hexid(), hexid(), hexid()
        self.layout: dict[str, tuple[str, int, bool]] = {
            "container": (f"/system.slice/docker-{hexid()}.scope", 0, True),
            "transient": ("/system.slice/run-u4242.service", 0, True),
            "service": ("/system.slice/hostd-test-busy.service", 0, False),
            "root-login": ("/user.slice/user-0.slice/session-4242.scope", 0, False),
            "user-login": ("/user.slice/user-65534.slice/session-4243.scope", 65534, True),
        }
        self.bundles: list[Path] = []
        self.cgroups: dict[str, Cgroup] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.job: subprocess.Popen | None = None
        self.made_runtime = not CONTAINERD.parent.exists()
        self.infra, self.work, self.agent, self.userns = infra, work, agent, userns

    def start(self) -> None:
        """Start every process in its place (``close`` undoes what was started, also when this
        stops half-way)."""
        infra, work, agent, userns = self.infra, self.work, self.agent, self.userns
        if self.made_runtime:
            try:
                self.bundles = [
                    bundle(infra, "kube-system"), bundle(work, "team-a"),
                    bundle(agent, "monitoring", "node-exporter-x7"), bundle(userns, "team-b"),
                ]  # fmt: skip
            except OSError:  # /run is not ours to write here (a read-only root): no pods
                self.made_runtime = False
            else:
                self.layout["infra-pod"] = (pod_path("burstable", infra), 0, False)
                self.layout["workload-pod"] = (pod_path("besteffort", work), 0, True)
                # a DaemonSet's agent in a namespace the policy does not list: hostNetwork
                self.layout["agent-pod"] = (pod_path("burstable", agent), 0, False)
                # a workload that made a user namespace of its own: a full bounding set there,
                # no agent of the node's
                self.layout["userns-pod"] = (pod_path("besteffort", userns), 0, True)
        for name, (path, _, _) in self.layout.items():
            self.cgroups[name] = Cgroup(path)
        self.job = subprocess.Popen([PYTHON, "-c", BUSY, "tjob"], start_new_session=True)
        for name, (_, uid, _) in self.layout.items():
            cg = self.cgroups[name]

            def place(cg=cg, uid=uid, name=name) -> None:
                cg.join()
                if name.endswith("-pod"):
                    contain(host_network=name == "agent-pod", own_user_ns=name == "userns-pod")
                if uid:
                    os.setgid(uid)
                    os.setuid(uid)

            self.procs[name] = subprocess.Popen(
                [PYTHON, "-c", BUSY, f"tb-{name}"[:15]], start_new_session=True, preexec_fn=place
            )

    def close(self) -> None:
        for proc in [self.job, *self.procs.values()]:
            if proc is not None:
                proc.kill()
                proc.wait()
        for cg in reversed(self.cgroups.values()):  # a parent one made may hold another's
            cg.remove()
        for folder in self.bundles:
            shutil.rmtree(folder, ignore_errors=True)
        if self.made_runtime:
            for path in (CONTAINERD, CONTAINERD.parent, CONTAINERD.parent.parent):
                with contextlib.suppress(OSError):
                    path.rmdir()

    def state(self) -> dict:
        """Each process's policy and autogroup nice, and each cgroup's weight files."""
        return {
            name: (_policy(p.pid), _autogroup(p.pid), self.cgroups[name].weight())
            for name, p in self.procs.items()
        }


@pytest.fixture
def node():
    n = Node()
    try:
        n.start()
        yield n
    finally:
        n.close()


@pytest.mark.parametrize(
    ("write", "crash"),
    [(False, False), (True, False), (True, True)],
    ids=[
        "no writes",
        "weigh containers and pods",
        "weigh containers and pods, kill -9 and restore",
    ],
)
def test_the_node_keeps_its_own_and_preempts_the_rest(tmp_path, node, write, crash):
    """The default rules on a node of every kind: a container under system.slice, a systemd-run
    unit, another user's login and a workload pod are demoted (SCHED_IDLE, autogroup nice 19);
    a system service, root's login, a kube-system pod and a node agent's pod (the host's
    network, in a namespace the policy does not list) are not. No cgroup of theirs is
    written unless ``[cgroups] weigh`` names its kind (then the container's and the pod's
    cgroups yield, and get their weight back at the stop). After the stop (or ``kill -9`` and
    ``hostd restore``) every thread, session and cgroup is as before."""
    policy = tmp_path / "node.toml"
    write_kinds = '\n[cgroups]\nweigh = ["container", "pod"]\n'  # (as the shipped policy)
    policy.write_text(POLICY + (write_kinds if write else "\n[cgroups]\nwrite = []\n"))
    before = node.state()
    agent = Agent(tmp_path, 1, policy=policy)  # the whole host: scoped below init
    demoted = [n for n, (_, _, d) in node.layout.items() if d]
    kept = [n for n, (_, _, d) in node.layout.items() if not d]
    try:
        agent.wait_passes(1, timeout=PATIENCE)

        weighed = [n for n in ("container", "workload-pod", "userns-pod") if write and n in demoted]

        def down() -> bool:  # every session demoted, and then each weighed cgroup written
            # (a cgroup yields once every session in it is demoted: one may come a tick later)
            state = node.state()
            return all(_policy(node.procs[n].pid) == os.SCHED_IDLE for n in demoted) and all(
                state[n][2] != before[n][2] for n in weighed
            )

        wait_for(down, "the competing work demoted", agent, PATIENCE)
        now = node.state()
        for name in kept:
            assert now[name] == before[name], (name, now[name])
        for name in demoted:
            assert now[name][1] == ("19" if AUTOGROUPS else before[name][1]), name
        for name in demoted:
            if name in ("container", "workload-pod", "userns-pod") and write:
                assert now[name][2] != before[name][2], f"{name}'s cgroup yields"
            else:
                assert now[name][2] == before[name][2], f"{name}'s cgroup was written"
        want = {node.procs[n].pid for n in demoted}

        def said() -> bool:  # status.json, written at most once a second
            listed = (agent.status().get("preempt") or {}).get("demoted", [])
            return {d["session"] for d in listed} == want

        wait_for(said, "status.json lists the demoted sessions", agent, PATIENCE)
    finally:
        log = agent.stop(signal.SIGKILL if crash else signal.SIGTERM)
        if crash:  # (also when the test failed above: the host is put back whatever happened)
            out = subprocess.run(
                [HOSTD, "restore", "--state-dir", str(agent.state), "--run-dir", str(agent.run)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    if crash:
        assert out.returncode == 0, out.stdout + out.stderr
    else:
        assert agent.proc.returncode == 0, log
    assert node.state() == before, log
    assert "Traceback" not in log


def _counts(agent: Agent) -> dict:
    return (agent.status().get("preempt") or {}).get("counts", {})


def _cgroup(pid: int) -> str:
    """The process's cgroup in the cpu controller's hierarchy."""
    import hostd.sched.group as group

    found = group.mount("/")
    want = "cpu" if found is not None and found[0] == 1 else ""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if want in controllers.split(",") or controllers == want:
            return path
    return ""


def _quota(cg: Cgroup) -> int | None:
    """The cgroup's CFS quota in microseconds (None: no cap)."""
    for name, value in cg.weight().items():
        if name.endswith("/cpu.max"):
            quota = value.split()[0]
            return None if quota == "max" else int(quota)
        if name.endswith("/cpu.cfs_quota_us"):
            return None if int(value) < 0 else int(value)
    return None


def test_the_jobs_session_weight_only_while_demoted_work_needs_outweighing(tmp_path):
    """``[preempt] weigh_job = "while-needed"``: the job's session weight (its layer's
    ``group_nice = -5``, taken from every other cgroup at the root, the node's own included) is
    given only while demoted work is not contained. A busy session of the root cgroup, moved to
    /hostd.demoted (idle at the root), needs no weight; another user's busy login (a cgroup
    hostd may not write) does: the weight is given, and taken back when that login is gone. A
    container whose cgroup the policy lets hostd write is idle and capped (``cpu.max``,
    ``[preempt] cap_cpus``): contained too. Everything is as before after the stop."""
    node = Node()
    node.layout = {k: v for k, v in node.layout.items() if k == "service"}
    node.made_runtime = False
    cg: Cgroup | None = None
    policy = tmp_path / "weight.toml"
    policy.write_text(
        POLICY.replace("preempt = true", "preempt = true\nsched = { group_nice = -5 }").replace(
            "release_after = 1", 'release_after = 1\nweigh_job = "while-needed"'
        )
        + '\n[cgroups]\nwrite = ["container"]\n'
    )
    rooted: subprocess.Popen | None = None
    login: subprocess.Popen | None = None
    container: subprocess.Popen | None = None
    login_cg = None
    try:
        node.start()
        cg = Cgroup(f"/system.slice/docker-{hexid()}.scope")  # (made after the node's own)
        before, cg_before = node.state(), cg.weight()
        job_before = _autogroup(node.job.pid)
        agent = Agent(tmp_path, 1, policy=policy)
        try:
            agent.wait_passes(1, timeout=PATIENCE)
            rooted = subprocess.Popen([PYTHON, "-c", BUSY, "tb-rooted"], start_new_session=True)
            wait_for(lambda: _cgroup(rooted.pid) == "/hostd.demoted", "the root session moved",
                     agent, PATIENCE)  # fmt: skip
            ticks = _counts(agent).get("ticks", 0)
            wait_for(lambda: _counts(agent).get("ticks", 0) >= ticks + 10, "ten more ticks",
                     agent, PATIENCE)  # fmt: skip
            assert _autogroup(node.job.pid) == job_before, "no weight needed"
            assert _counts(agent).get("weight_given", 0) == 0
            login_cg = Cgroup("/user.slice/user-65534.slice/session-4244.scope")

            def place() -> None:
                login_cg.join()
                os.setgid(65534)
                os.setuid(65534)

            login = subprocess.Popen([PYTHON, "-c", BUSY, "tb-login"], start_new_session=True,
                                     preexec_fn=place)  # fmt: skip
            wait_for(lambda: _policy(login.pid) == os.SCHED_IDLE, "the login demoted", agent,
                     PATIENCE)  # fmt: skip
            if AUTOGROUPS:
                wait_for(lambda: _autogroup(node.job.pid) == "-5", "the weight given", agent,
                         PATIENCE)  # fmt: skip
            login.kill()
            login.wait()
            if AUTOGROUPS:
                wait_for(lambda: _autogroup(node.job.pid) == job_before, "the weight taken back",
                         agent, PATIENCE)  # fmt: skip
            wait_for(lambda: _counts(agent).get("weight_taken", 0) >= 1, "status.json says so",
                     agent, PATIENCE)  # fmt: skip
            assert _counts(agent).get("weight_given") == 1
            # a container of a kind the policy lets hostd write: idle and capped
            container = subprocess.Popen([PYTHON, "-c", BUSY, "tb-container"],
                                         start_new_session=True, preexec_fn=cg.join)  # fmt: skip
            assert cg is not None
            wait_for(lambda: _quota(cg) is not None, "the container capped", agent, PATIENCE)
            assert _quota(cg) == 2000  # 0.02 CPU of its 100 ms period
            assert _policy(container.pid) == os.SCHED_IDLE
            ticks = _counts(agent).get("ticks", 0)
            wait_for(lambda: _counts(agent).get("ticks", 0) >= ticks + 10, "ten more ticks",
                     agent, PATIENCE)  # fmt: skip
            assert _autogroup(node.job.pid) == job_before, "a capped container: no weight"
        finally:
            log = agent.stop(signal.SIGTERM)
        assert agent.proc.returncode == 0, log
        assert _cgroup(rooted.pid) == "/", "moved back"
        assert node.state() == before, log
        assert cg.weight() == cg_before, log
        assert _autogroup(node.job.pid) == job_before
        assert "Traceback" not in log
    finally:
        for proc in (rooted, login, container):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if login_cg is not None:
            login_cg.remove()
        if cg is not None:
            cg.remove()
        node.close()

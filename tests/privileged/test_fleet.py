"""A small fleet on one machine, scraped by one real Prometheus: ``hostd report --prometheus``
gives the verdict the agents' own records give (root: the agents run for real).

Three nodes, each an agent as a sidecar runs it (``hostd run --sidecar`` in a PID namespace of
its own, ``unshare --pid --fork --mount-proc``, cgroupfs and /proc/irq read-only there and a
/run of its own as in a pod: it sees and changes only its own namespace's processes, and holds
its own lock), with its own state and run folders and its own metrics port
(``HOSTD_METRICS_PORT``); one Prometheus (tests/prometheus.py) scrapes the three, each target
labelled with its ``node``. On each node a torchrun-like job (a launcher named ``pt_elastic``, a
rank with torchrun's environment running ``pretrain.py``, with NCCL's and gloo's thread names)
runs four attempts one after another, protected and opted out (``HOSTD_PROTECT=0``) in turn; the
rank reports a throughput (``HOSTD_THROUGHPUT_FILE``) that depends on the node, the arm and the
attempt only, so that the verdict is meaningful and the same whichever way it is computed:
node-c runs slower protected.

Then ``hostd report --prometheus URL --json`` must agree with ``hostd report --json`` of each
agent's state folder (each attempt's throughput; each node's A/B, ratio and interval) and of the
records of all three gathered in one folder (the job's ratio, each within the other's interval,
and the finding); no wall-clock assert. Everything started is stopped and checked gone, each
agent ends having put back what it changed, and what a sidecar must not touch (IRQs, governors,
hostd's cgroups, the mounts) is as before.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest

from tests.privileged.test_agent import HOSTD
from tests.prometheus import Prometheus, binary, free_port

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "docs" / "json" / "report.schema.json"
CGROUP = Path("/sys/fs/cgroup")
# The hierarchies made read-only in each namespace: cpusets, and the CPU controller (weights, a
# demoted group); one on cgroup v2.
READ_ONLY = sorted(
    {str(p.resolve()) for p in (CGROUP / "cpuset", CGROUP / "cpu", CGROUP) if p.is_dir()}
    - ({str(CGROUP)} if (CGROUP / "cpuset").is_dir() else set())
)
NODES = {  # each node's throughput, steps/s: (protected, unprotected); node-c slower protected
    "node-a": (12.0, 10.0),
    "node-b": (12.6, 10.3),
    "node-c": (9.85, 10.0),
}
ATTEMPT_S = 4.0

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: PID namespaces, agents for real"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)"),
    pytest.mark.skipif(
        binary() is None,
        reason="no Prometheus server: `python -m tests.prometheus install` (Debian's package)",
    ),
]

POLICY = """version = 1
name = "fleet"
[agent]
interval = 0.2
[metrics]
address = "127.0.0.1"
sample_interval = 0.5
[preempt]
enabled = false
[guard]
enabled = false
[[layer]]
name = "trainer"
comment = "root's ranks, protected"
match = [[{ job_role = "rank" }, { uid = 0 }]]
sched = { nice = -5 }
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""

# The rank: threads named as PyTorch's, a step's worth of CPU now and then, and its throughput,
# argv[2] steps/s, written to HOSTD_THROUGHPUT_FILE as a trainer's rank 0 does.
RANK = textwrap.dedent(
    """
    import os, sys, threading, time

    def named(name):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
            fh.write(name)
        time.sleep(3600)

    for name in ("pt_nccl_watchdg", "pt_gloo_runloop"):
        threading.Thread(target=named, args=(name,), daemon=True).start()
    seconds, rate = float(sys.argv[1]), sys.argv[2]
    path = os.environ["HOSTD_THROUGHPUT_FILE"]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        while time.monotonic() - began < 0.02:
            pass
        with open(path + ".tmp", "w") as fh:
            fh.write(f"{rate} steps/s\\n")
        os.replace(path + ".tmp", path)
        time.sleep(0.08)
    """
)
# torchrun: named pt_elastic, it starts the rank with the environment torch.distributed.elastic
# gives its workers.
LAUNCHER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    spec = json.loads(sys.argv[1])
    with open("/proc/self/comm", "w") as fh:
        fh.write("pt_elastic")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0",
           "ROLE_NAME": "default", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": spec["run_id"], "TORCHELASTIC_RESTART_COUNT": "0",
           "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
           "HOSTD_THROUGHPUT_FILE": spec["throughput"], **spec["env"]}
    rank = subprocess.Popen([sys.executable, spec["script"], str(spec["seconds"]),
                             str(spec["rate"])], env=env)
    sys.exit(rank.wait())
    """
)
# PID 1 of a node's namespace: the agent, then, on "go", the attempts; "done" once the agent has
# recorded their ends; on "stop", the agent stopped and what it leaves checked.
INSIDE = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    policy, work, launcher, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    state, run = os.path.join(work, "state"), os.path.join(work, "run")
    # As in a pod (in this mount namespace only: private): cgroupfs and /proc/irq read-only, and
    # a /run of its own, where the agent takes its lock (one agent per /run).
    for path in [*sys.argv[5:], "/proc/irq"]:
        for args in (["--bind", path, path], ["-o", "remount,bind,ro", path]):
            subprocess.run(["mount", *args], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755,size=16m", "tmpfs", "/run"], check=True)
    hostd = [sys.executable, "-c", "from hostd.cli import main; main()"]
    dirs = ["--state-dir", state, "--run-dir", run]

    def say(**what):
        print(json.dumps(what), flush=True)

    def status():
        try:
            with open(os.path.join(run, "status.json")) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def ended():
        try:
            names = [n for n in os.listdir(os.path.join(state, "attempts")) if n.endswith(".json")]
            recs = [json.load(open(os.path.join(state, "attempts", n))) for n in names]
        except (OSError, ValueError):
            return False
        return len(recs) == len(plan) and all(r.get("end") is not None for r in recs)

    def until(check, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline or agent.poll() is not None:
                say(error=f"{what}: not within {timeout} s", log=open(log.name).read()[-3000:])
                agent.kill()
                sys.exit(1)
            time.sleep(0.05)

    def call(*args):
        p = subprocess.run([*hostd, *args], capture_output=True, text=True, timeout=120)
        return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}

    with open(os.path.join(work, "agent.log"), "w") as log:
        agent = subprocess.Popen([*hostd, "run", "--sidecar", "--policy", policy, *dirs],
                                 stdout=subprocess.DEVNULL, stderr=log)
    until(lambda: status().get("passes", 0) >= 1, "the agent's first pass")
    say(ready=os.getpid())
    sys.stdin.readline()
    for spec in plan:
        subprocess.run([sys.executable, "-c", launcher, json.dumps(spec)], check=True)
    until(ended, "the attempts' ends recorded")
    say(done=len(plan))
    sys.stdin.readline()
    agent.send_signal(signal.SIGTERM)
    rc = agent.wait(120)
    say(agent_rc=rc, log=open(log.name).read()[-3000:],
        changes=call("changes", "--state-dir", state, "--json"),
        status=call("status", "--run-dir", run))
    """
)


def host_wide() -> dict:
    """What no sidecar may change: IRQs, CPU frequency governors, hostd's cgroups, the mounts
    that were read-only inside the namespaces."""

    def read(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    irqs = Path("/proc/irq")
    mounts = [
        line.split()[4:6]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] in (*READ_ONLY, "/proc/irq", "/run")
    ]
    return {
        "irqs": {p.name: read(p / "smp_affinity_list") for p in irqs.iterdir() if p.is_dir()},
        "governors": {
            str(p): read(p)
            for p in Path("/sys/devices/system/cpu").glob("cpu*/cpufreq/scaling_governor")
        },
        "cgroups": sorted(str(p) for p in [*CGROUP.glob("*hostd*"), *CGROUP.glob("*/*hostd*")]),
        "mounts": sorted(mounts),
    }


class Node:
    """One node: ``unshare`` running INSIDE (killed with it: ``--kill-child``), its lines read
    by a thread."""

    def __init__(self, name: str, tmp: Path, policy: Path, script: Path, port: int) -> None:
        self.name, self.work = name, tmp / name
        self.work.mkdir()
        protected, unprotected = NODES[name]
        order = (True, False, True, False) if name != "node-b" else (False, True, False, True)
        plan = []
        for k, flag in enumerate(order):
            rate = (protected if flag else unprotected) * (1 + 0.01 * (k // 2))
            plan.append({
                "run_id": f"fleet-{name}-{k}", "script": str(script), "seconds": ATTEMPT_S,
                "rate": round(rate, 4), "throughput": str(self.work / f"rate-{k}"),
                "env": {} if flag else {"HOSTD_PROTECT": "0"},
            })  # fmt: skip
        self.plan = plan
        self.err = (self.work / "inside.err").open("w")
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable,
             "-c", INSIDE, str(policy), str(self.work), LAUNCHER, json.dumps(plan), *READ_ONLY],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "HOSTD_METRICS_PORT": str(port)},
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def said(self, key: str, timeout: float = 120) -> dict:
        """Its next line, which must hold ``key`` (a deadline only bounds a failure)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        msg = json.loads(line) if line.strip() else {}
        assert key in msg, (self.name, msg, (self.work / "inside.err").read_text()[-3000:])
        return msg

    def tell(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # and, --kill-child, its namespace's PID 1: all of the namespace
        self.proc.wait(60)
        self.proc.stdin.close()
        self.err.close()


def report(*args: str) -> dict:
    got = subprocess.run([HOSTD, "report", *args, "--json"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    doc = json.loads(got.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    return doc


def ours(tmp: Path) -> list[int]:
    """Processes still running that this test started (their command line names its folder)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if entry.isdigit() and str(tmp).encode() in cmdline:
            found.append(int(entry))
    return found


def test_a_fleet_scraped_by_one_prometheus_gives_the_agents_verdict(tmp_path):
    policy, script = tmp_path / "policy.toml", tmp_path / "pretrain.py"
    policy.write_text(POLICY)
    script.write_text(RANK)
    before = host_wide()
    ports = {name: free_port() for name in NODES}
    labels = {f"127.0.0.1:{port}": {"node": name} for name, port in ports.items()}
    nodes: list[Node] = []
    prom = Prometheus(list(labels), tmp_path, labels=labels)
    try:
        nodes = [Node(name, tmp_path, policy, script, ports[name]) for name in NODES]
        for node in nodes:
            node.said("ready")
        prom.wait(f'count(up{{job="hostd"}} == 1) == {len(nodes)}')
        since = datetime.now(timezone.utc).isoformat()
        for node in nodes:
            node.tell()  # go
        for node in nodes:
            node.said("done")
        # every attempt's end scraped: its series gone (the deadline only bounds a failure)
        deadline = time.monotonic() + 30
        while prom.query("hostd_job_attempt_info") and time.monotonic() < deadline:
            time.sleep(0.5)
        url = f"http://127.0.0.1:{prom.port}"
        fleet = report("--prometheus", url, "--since", since, "--step", "1s")
        only_c = report("--prometheus", url, "--since", since, "--step", "1s",
                        "--selector", '{node="node-c"}')  # fmt: skip
        per_host = {n.name: report("--state-dir", str(n.work / "state")) for n in nodes}
        gathered = tmp_path / "gathered"
        gathered.mkdir()
        for n in nodes:
            for rec in (n.work / "state" / "attempts").glob("*.json"):
                shutil.copy(rec, gathered / f"{n.name}-{rec.name}")
        together = report("--dir", str(gathered))
        for node in nodes:
            node.tell()  # stop
        ends = {node.name: node.said("agent_rc") for node in nodes}
    finally:
        for node in nodes:
            node.stop()
        prom.stop()
    # --- everything stopped, everything put back
    assert ours(tmp_path) == []
    for name, end in ends.items():
        assert end["agent_rc"] == 0 and "Traceback" not in end["log"], (name, end["log"])
        assert json.loads(end["changes"]["out"])["knobs"] == [], (name, end["changes"])
        assert end["status"]["rc"] == 3, (name, end["status"])  # stopped, nothing to restore
    assert host_wide() == before

    # --- what Prometheus gave: every attempt of every node, as the agents recorded them
    assert "folder" not in fleet and fleet["prometheus"]["url"] == url
    attempts = {(s["host"], s["attempt"]): s for s in fleet["attempts"]}
    assert len(attempts) == 4 * len(nodes)
    for node in nodes:
        for s in per_host[node.name]["attempts"]:
            mine = attempts[node.name, s["attempt"]]
            assert (mine["job"], mine["protected"], mine["source"]) == (
                "pretrain.py", s["protected"], "torchrun",
            )  # fmt: skip
            assert mine["throughput"] == pytest.approx(s["throughput"]), (node.name, s, mine)
            assert mine["wait_share"] is not None and mine["wait_per_timeslice_s"] is None
        assert {p["protected"] for p in per_host[node.name]["attempts"]} == {True, False}
    (job,) = fleet["comparisons"]
    assert job["job"] == "pretrain.py" and job["measure"]["name"] == "throughput"
    assert job["hosts"] == sorted(NODES)

    # --- each node's A/B from Prometheus is its agent's own
    by_host = {e["host"]: e for e in fleet["fleet"]["per_host"]}
    for name, doc in per_host.items():
        (own,) = doc["comparisons"]
        ab = own["ab"]
        mine = by_host[name]
        assert mine["ratio"] == pytest.approx(ab["ratio"]), (name, mine, ab)
        assert (mine["low"], mine["high"]) == (
            pytest.approx(ab["low"]), pytest.approx(ab["high"]),
        )  # fmt: skip
        assert mine["finding"] == ab["finding"]
    slower = fleet["fleet"]["slower"]
    assert [(e["host"], e["finding"]) for e in slower] == [("node-c", "slower")], slower
    assert "node-c (pretrain.py)" in fleet["fleet"]["verdict"]
    between = {b["protected"]: b for b in fleet["fleet"]["between_hosts"]}
    assert (between[True]["fastest"], between[True]["slowest"]) == ("node-b", "node-c")

    # --- the job as a whole: the records of all three nodes in one folder say the same
    (whole,) = together["comparisons"]
    ours_ab, theirs = job["ab"], whole["ab"]
    assert ours_ab["ratio"] == pytest.approx(theirs["ratio"])
    assert theirs["low"] <= ours_ab["ratio"] <= theirs["high"]
    assert ours_ab["low"] <= theirs["ratio"] <= ours_ab["high"]
    assert ours_ab["finding"] == theirs["finding"] == "faster", (ours_ab, theirs)

    # --- a selector: node-c's attempts only, and said so
    assert only_c["prometheus"]["selector"] == '{node="node-c"}'
    assert {s["host"] for s in only_c["attempts"]} == {"node-c"}
    assert len(only_c["attempts"]) == 4

"""The agent records job attempts for real (root: it runs for real): a driver runs attempts of a
busy job one after another, half opted out (HOSTD_PROTECT=0); each leaves a record saying
whether it was protected, its per-layer CPU and wait over time and the throughput it wrote. A
job run by another user cannot make hostd read a file that user does not own, nor join root's
attempts under the same names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.agentproc import Agent, wait_for
from tests.privileged.test_agent import HOSTD

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent runs for real"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv(1)"),
]

POLICY = """version = 1
name = "attempts"
[metrics]
enabled = false
sample_interval = 0.5
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

# A rank: busy for argv[1] seconds, writing its steps/s to HOSTD_THROUGHPUT_FILE as it goes.
RANK = textwrap.dedent(
    """
    import os, sys, time
    path = os.environ.get("HOSTD_THROUGHPUT_FILE")
    end = time.monotonic() + float(sys.argv[1])
    steps, t0 = 0, time.monotonic()
    last = t0
    while time.monotonic() < end:
        x = 0
        for i in range(20000):
            x += i * i
        steps += 1
        now = time.monotonic()
        if path and now - last > 0.2:
            try:
                with open(path + ".tmp", "w") as fh:
                    fh.write(f"{steps / (now - t0):.2f} steps/s\\n")
                os.replace(path + ".tmp", path)
            except OSError:
                pass
            last = now
    """
)
# The driver: runs each attempt (env, user) in turn, then waits for a line on stdin.
DRIVER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    for run in json.loads(sys.argv[1]):
        env = {**os.environ, **run["env"]}
        subprocess.run([*run["user"], sys.executable, "-c", sys.argv[2], str(run["seconds"])],
                       env=env, check=True)
    print("done", flush=True)
    sys.stdin.readline()
    """
)
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def rank_env(run_id: str, throughput: str, **more: str) -> dict:
    return {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
        "HOSTD_JOB": "ab-test", "HOSTD_THROUGHPUT_FILE": throughput, **more,
    }  # fmt: skip


def test_attempts_are_recorded_protected_or_not(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    secret = tmp_path / "secret"
    secret.write_text("42 secrets/s\n")  # root's: a nobody job must not get it read
    secret.chmod(0o644)
    runs = [
        {"env": rank_env("ab-1", str(out / "t1")), "user": [], "seconds": 3},
        {"env": rank_env("ab-2", str(out / "t2"), HOSTD_PROTECT="0"), "user": [], "seconds": 3},
        {"env": rank_env("ab-3", str(out / "t3")), "user": [], "seconds": 3},
        {"env": rank_env("ab-4", str(secret)), "user": NOBODY, "seconds": 3},
    ]
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(runs), RANK],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    agent = Agent(tmp_path, driver.pid, policy=policy)
    try:
        agent.wait_passes(1)
        assert driver.stdout.readline().strip() == "done"
        folder = agent.state / "attempts"
        wait_for(lambda: not agent.status().get("attempts", {}).get("live"), "attempts end")
        records = {}
        for path in folder.glob("*.json"):
            rec = json.loads(path.read_text())
            records[rec["attempt"]] = rec
    finally:
        log = agent.stop()
        driver.communicate("\n", timeout=30)
    assert sorted(records) == [f"torchrun ab-{i} restart 0" for i in (1, 2, 3, 4)], log
    assert {r["job"] for r in records.values()} == {"ab-test"}
    assert {r["source"] for r in records.values()} == {"hostd"}
    protected = {a[9:13]: r["protected"] for a, r in records.items()}
    assert protected == {"ab-1": True, "ab-2": False, "ab-3": True, "ab-4": False}
    assert "HOSTD_PROTECT" in records["torchrun ab-2 restart 0"]["why"]
    for attempt, rec in records.items():
        assert rec["schema"] == "hostd.attempt/1"
        assert rec["end"] is not None and rec["end"] >= rec["start"]
        assert rec["ranks"] == 1
        samples = rec["samples"]
        assert len(samples) >= 2, (attempt, samples)
        layer = "trainer" if rec["protected"] else "rest"
        cpu = sum(s["layers"].get(layer, {}).get("cpu_seconds", 0) for s in samples)
        assert cpu > 0.5, (attempt, samples)  # a busy rank, 3 s
        assert all(set(s["layers"]) <= {layer} for s in samples), (attempt, samples)
    for i in (1, 2, 3):
        rec = records[f"torchrun ab-{i} restart 0"]
        got = [s["throughput"] for s in rec["samples"] if s["throughput"] is not None]
        assert got and all(v > 0 for v in got), rec["samples"]
        assert rec["throughput_unit"] == "steps/s"
    nobody = records["torchrun ab-4 restart 0"]
    assert all(s["throughput"] is None for s in nobody["samples"]), nobody["samples"]
    assert nobody["throughput_unit"] is None
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert {r["uid"] for r in records.values()} == {0, 65534}
    # hostd report on these records: the nobody attempt is another user's, so a job of its own
    # (a job's name is the user's to write); root's three make the A/B, on their throughput
    page = tmp_path / "report.html"
    got = subprocess.run([HOSTD, "report", "--dir", str(folder), "--json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    comparisons = {c["job"]: c for c in json.loads(got.stdout)["comparisons"]}
    assert sorted(comparisons) == ["ab-test (uid 0)", "ab-test (uid 65534)"]
    comparison = comparisons["ab-test (uid 0)"]
    assert {a["protected"]: a["recorded"] for a in comparison["arms"]} == {True: 2, False: 1}
    assert comparison["measure"]["name"] == "throughput" and comparison["verdict"]
    assert comparisons["ab-test (uid 65534)"]["ab"] is None  # one arm: no A/B
    out = subprocess.run([HOSTD, "report", "--dir", str(folder), "-o", str(page)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert comparison["verdict"] in out.stdout and comparison["verdict"] in page.read_text()

"""CLI tests through the installed ``hostd`` entry point (as a user runs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workload import TrainingJob

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else shutil.which("hostd")

pytestmark = pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed")


def hostd(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version():
    from hostd import __version__

    assert hostd("--version").stdout.strip() == f"hostd {__version__}"


def test_topo_json_live():
    data = json.loads(hostd("topo", "--json").stdout)
    assert data["online"] == Path("/sys/devices/system/cpu/online").read_text().strip()
    assert data["nodes"] and data["cgroup"]["mode"] in ("v1", "v2", "hybrid")


def test_topo_table_live_names_what_matters():
    text = hostd("topo").stdout
    assert "CPUs online" in text and "NUMA" in text and "IRQs:" in text


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*") if p.is_dir()))
def test_commands_run_on_every_fixture_host(name):
    root = str(FIXTURES / name)
    topo = json.loads(hostd("topo", "--json", "--root", root).stdout)
    assert topo["cpus"]
    classified = json.loads(hostd("classify", "--json", "--root", root).stdout)
    assert sum(layer["threads"] for layer in classified["layers"]) == len(classified["threads"])
    plan = json.loads(hostd("plan", "--json", "--root", root).stdout)
    assert plan["pool"]
    assert "policy training" in hostd("plan", "--root", root).stdout


AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"


def test_classify_explain_and_plan_a_live_training_job():
    with TrainingJob(ranks=2, workers=1) as job:
        rank = str(job.ranks[0])
        data = json.loads(hostd("classify", "--json", "--pid", rank).stdout)
        comms = {t["comm"]: t["layer"] for t in data["threads"]}
        assert {t["pid"] for t in data["threads"]} == {job.ranks[0]}
        expected_rt = os.geteuid() == 0
        assert comms["gloo_tcp_loop"] == ("comms" if expected_rt else "rest")
        text = hostd("explain", rank).stdout
        if expected_rt:
            assert "-> layer trainer, group 1" in text
            assert "job_role = 'rank'" in text
            assert f"job: rank 0 of job torchrun {job.launcher} " in text
            # Earlier layers say why they did not match, with the thread's own value.
            assert "comm is" in text
        ex = json.loads(hostd("explain", rank, "--json").stdout)
        assert ex["thread"]["parent_comm"] == "pt_elastic"
        assert ex["layers"][-1]["matched"] is True
        plan = json.loads(hostd("plan", "--json", "--scope-pid", str(job.launcher)).stdout)
        layers = {layer["name"]: layer for layer in plan["layers"]}
        if expected_rt:
            assert layers["trainer"]["threads"] >= 4
            decided = {t["tid"]: t for t in plan["tasks"]}
            gloo = next(t["tid"] for t in data["threads"] if t["comm"] == "gloo_tcp_loop")
            # A comm thread weighs as its rank's threads (BENCHMARKS.md): nothing to change.
            assert gloo not in decided
            # Each rank leads its session (as under torchrun): its leader gets the session
            # weight; on a small host the trainer gets no CPUs of its own.
            assert decided[job.ranks[0]]["group_nice"] == (-5 if AUTOGROUPS else None)
        members = hostd("classify", "--members", "--layer", "helpers").stdout
        assert "pt_elastic" in members


def test_classify_unknown_layer_is_bad_input():
    proc = hostd("classify", "--layer", "nope", check=False)
    assert proc.returncode == 2
    assert "--layer 'nope'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_explain_unknown_thread_is_bad_input():
    proc = hostd("explain", "99999999", check=False)
    assert proc.returncode == 2
    assert "no such thread" in proc.stderr


def test_missing_root_is_bad_input(tmp_path):
    proc = hostd("topo", "--root", str(tmp_path / "absent"), check=False)
    assert proc.returncode == 2 and "expected an existing folder" in proc.stderr


def test_bad_policy_is_one_line_exit_2_and_nothing_planned(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'version = 1\n[[layer]]\nname = "x"\ncomment = "c"\nmatch = [[]]\nkind = "wide"\n'
    )
    proc = hostd("plan", "--policy", str(bad), check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        f'hostd: {bad}: layer[0].kind: \'wide\': expected one of "confined", "grouped", "open"'
    )


def test_policy_check_shipped_policies():
    files = sorted(str(p) for p in (REPO / "policies").glob("*.toml"))
    assert files
    proc = hostd("policy", "check", *files)
    assert proc.stdout.count(": ok (") == len(files)
    assert "warning" not in proc.stderr


def test_policy_check_mixed_exit_2(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text("version = 1\nlayers = []\n")
    proc = hostd("policy", "check", str(REPO / "policies" / "training.toml"), str(bad), check=False)
    assert proc.returncode == 2
    assert ": ok (" in proc.stdout
    assert f"{bad}: layers: unknown key (a typo?); expected one of version," in proc.stderr


def test_policy_show_default_is_the_shipped_file():
    shown = hostd("policy", "show").stdout
    assert shown == (REPO / "policies" / "training.toml").read_text()


def test_policy_show_says_who_preempts_and_the_preemption_settings():
    shown = hostd("policy", "show", "--policy", str(REPO / "policies" / "training.toml")).stdout
    assert "trainer (grouped, preempts)" in shown and "rest (open, preemptible)" in shown
    assert "[preempt] busy = 0.5 CPUs" in shown and "session_nice = 19" in shown
    assert "[guard] starve_after = 5 s" in shown

"""``hostd demo`` on the live kernel: the four arms run, report, and leave nothing behind, also
when interrupted with Ctrl-C (SIGINT) while the agent is applying."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from tests.agentproc import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the demo runs the agent")

HOSTD = [sys.executable, "-m", "hostd"]
CPUSET = Path("/sys/fs/cgroup/cpuset")


def _leftovers() -> list[str]:
    """Processes the demo starts (its job, the agent, the contention) that still exist."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and ("hostd.demo" in raw or "hostd run" in raw or "hostd-demo" in raw):
            found.append(raw)
    return found


def _host() -> dict:
    irqs = {
        irq: Path(f"/proc/irq/{irq}/smp_affinity_list").read_text()
        for irq in os.listdir("/proc/irq")
        if irq.isdigit() and Path(f"/proc/irq/{irq}/smp_affinity_list").exists()
    }
    cpusets = sorted(p.name for p in CPUSET.iterdir() if p.is_dir()) if CPUSET.is_dir() else []
    return {"irqs": irqs, "cpusets": cpusets}


def test_demo_runs_four_arms_and_restores():
    before = _host()
    proc = subprocess.run(
        [*HOSTD, "demo", "--seconds", "2", "--json"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/json/demo.schema.json").read_text()
    )
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    rows = doc["arms"]
    assert [r["arm"] for r in rows] == [
        "alone",
        "contended",
        "contended + hostd, share only",
        "contended + hostd",
    ]
    for row in rows:
        assert row["error"] is None and row["steps_per_s"] > 0, row
    assert rows[0]["contention"] == "" and rows[1]["contention"].startswith(
        f"{2 * len(os.sched_getaffinity(0))} x "
    )
    # The stand-in job is classified as the default policy sees a torchrun job.
    assert all(row["sample_error"] is None for row in rows), rows
    for layers in (rows[2]["layers"], rows[3]["layers"]):
        assert layers["trainer"]["threads"] >= 2 and layers["comms"]["threads"] >= 2
        assert layers["data"]["threads"] >= 2 and layers["trainer"]["cpu"] > 0
    # The contention's session is demoted with preemption on, never with it off.
    assert rows[2]["demoted_sessions"] == 0 and rows[3]["demoted_sessions"] >= 1
    wait_for(lambda: not _leftovers(), "the demo's processes are gone", timeout=30)
    assert _host() == before


def test_demo_table_and_bad_input():
    proc = subprocess.run([*HOSTD, "demo", "--seconds", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--seconds 0" in proc.stderr


def test_ctrl_c_while_the_agent_runs_restores_and_leaves_nothing():
    before = _host()
    # SIGINT as a terminal has it: a shell's background job (CI started with "&") inherits it
    # ignored, and Python then never raises KeyboardInterrupt.
    proc = subprocess.Popen(
        [*HOSTD, "demo", "--seconds", "30"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        # The third arm is under way once an agent is running.
        wait_for(
            lambda: any("hostd run" in c for c in _leftovers()), "the agent starts", timeout=240
        )
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert "Traceback" not in out
    wait_for(lambda: not _leftovers(), "the demo's processes are gone", timeout=30)
    assert _host() == before

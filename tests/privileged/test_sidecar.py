"""Sidecar mode on the real kernel: hostd in a PID namespace of its own, as in a pod with
``shareProcessNamespace`` (``unshare --pid --fork --mount-proc``).

Inside the namespace a stand-in job (tests/workload.py) and ``hostd run --sidecar --once`` with
the privileged tests' policy, with cgroupfs and /proc/irq read-only as in a pod: the job's
threads are changed (the whole namespace is the scope: no ``--scope-pid``), while the host-wide
knobs that policy asks for (IRQs off the trainer's CPU, a C-state limit) and cpusets are left
alone; ``hostd restore`` puts the job back as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "tests" / "privileged" / "policy.toml"
# The cpuset hierarchy, made read-only inside the namespace (v1 here; v2 where that is all).
CPUSET = next(p for p in (Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup")) if p.is_dir())

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a PID namespace and real threads"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)"),
]

INSIDE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from tests.privileged.test_agent import host_state
    from tests.workload import TrainingJob

    policy, state, run, ro = sys.argv[1:5]
    hostd = [sys.executable, "-c", "from hostd.cli import main; main()"]
    dirs = ["--state-dir", state, "--run-dir", run]

    def call(*args):
        p = subprocess.run([*hostd, *args], capture_output=True, text=True, timeout=120)
        return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}

    # As in a pod: cgroupfs and /proc/irq read-only (in this mount namespace only: unshare
    # makes it private).
    for path in (ro, "/proc/irq"):
        for args in (["--bind", path, path], ["-o", "remount,bind,ro", path]):
            subprocess.run(["mount", *args], check=True)

    with TrainingJob(ranks=1, workers=1) as job:
        before = host_state(job)
        result = {"pid": os.getpid(), "rank": job.ranks[0]}
        result["run"] = call("run", "--sidecar", "--once", "--policy", policy, *dirs)
        during = host_state(job)
        result["doctor"] = call("doctor", "--sidecar")
        result["restore"] = call("restore", *dirs)
        after = host_state(job)
        result["rank_changed"] = during["threads"][job.ranks[0]] != before["threads"][job.ranks[0]]
        result["host_wide_same"] = all(during[k] == before[k] for k in ("irqs", "latency"))
        result["restored"] = after == before
    print(json.dumps(result))
    """
)


def test_sidecar_in_its_own_pid_namespace_changes_its_pod_only(tmp_path):
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INSIDE,
         str(POLICY), str(tmp_path / "state"), str(tmp_path / "run"), str(CPUSET)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["pid"] == 1  # the namespace's first process: hostd saw only this "pod"
    run = result["run"]
    assert run["rc"] == 0 and "Traceback" not in run["err"], run
    assert "sidecar: host-wide knobs are off" in run["err"], run["err"]
    assert "a PID namespace of its own" in run["err"]
    assert result["rank_changed"], run  # the job's trainer got its layer's settings
    assert result["host_wide_same"], run  # IRQs and the C-state limit left alone
    assert "a PID namespace of its own" in result["doctor"]["out"], result["doctor"]
    doctor = result["doctor"]["out"]
    assert "leave out:" in doctor and "irq" in doctor
    assert "is read-only here: thread affinity only" in doctor  # no cpuset writes in the pod
    assert "/proc/irq is read-only here" in doctor
    assert result["restore"]["rc"] == 0, result["restore"]
    assert result["restored"], result["restore"]

"""``hostd stats`` on the live kernel (read-only, no root): two busy threads pinned to one CPU
must wait for each other on its run queue, and an idle thread must not; plus the CLI's refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hostd.host import Host
from hostd.policy import load_policy
from hostd.stats import measure

_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else shutil.which("hostd")
needs_proc = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"),
    reason="needs Linux /proc with per-thread schedstat (CONFIG_SCHED_INFO)",
)
needs_cli = pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed")

POLICY = """\
version = 1

[[layer]]
name = "busy"
comment = "two spinning threads sharing one CPU"
match = [[{ comm_prefix = "stats_busy" }]]

[[layer]]
name = "idle"
comment = "a sleeping thread"
match = [[{ comm_prefix = "stats_idle" }]]

[[layer]]
name = "rest"
comment = "everything else"
match = [[]]
"""

# hashlib releases the GIL on large buffers, so both busy threads stay runnable at once and
# only the single CPU they are pinned to keeps one of them waiting.
_CHILD = textwrap.dedent(
    r"""
    import hashlib, os, sys, threading, time
    cpu, data, ready = int(sys.argv[1]), b"x" * (1 << 20), []

    def run(name, busy):
        tid = threading.get_native_id()
        with open(f"/proc/self/task/{tid}/comm", "w") as fh:
            fh.write(name)
        if busy:
            os.sched_setaffinity(0, {cpu})  # 0: the calling thread only
        ready.append(tid)
        while busy:
            hashlib.sha256(data).digest()
        time.sleep(3600)

    for name, busy in (("stats_busy0", True), ("stats_busy1", True), ("stats_idle", False)):
        threading.Thread(target=run, args=(name, busy), daemon=True).start()
    while len(ready) < 3:
        time.sleep(0.01)
    print("ready", flush=True)
    time.sleep(3600)
    """
)


@pytest.fixture
def contended(tmp_path):
    """(child pid, policy path): the child's busy threads share one CPU."""
    policy = tmp_path / "stats.toml"
    policy.write_text(POLICY)
    cpu = min(os.sched_getaffinity(0))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(cpu)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        yield child.pid, str(policy)
    finally:
        child.kill()
        child.wait()


@pytest.mark.live
@needs_proc
def test_busy_threads_on_one_cpu_wait_and_an_idle_one_does_not(contended):
    pid, policy = contended
    stats = measure(Host(), load_policy(policy), 1.0, scope=[pid])
    layers = {ly.layer: ly for ly in stats.layers}
    busy, idle = layers["busy"], layers["idle"]
    assert (busy.threads, idle.threads) == (2, 1)
    assert busy.delta.wait_ns > 0 and busy.rates.wait > 0
    assert busy.delta.involuntary > 0
    assert idle.rates.cpu < busy.rates.cpu
    assert idle.rates.cpu < 0.05  # asleep: about 0
    assert stats.top and stats.top[0].layer == "busy"
    assert {t.pid for t in stats.top} == {pid}


@pytest.mark.live
@needs_proc
@needs_cli
def test_cli_json_has_the_layers(contended):
    pid, policy = contended
    args = ["stats", "--json", "--interval", "0.5", "--pid", str(pid), "--policy", policy]
    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    layers = {ly["layer"]: ly for ly in data["layers"]}
    assert list(layers) == ["busy", "idle", "rest"]
    assert layers["busy"]["threads"] == 2 and layers["idle"]["threads"] == 1
    assert layers["busy"]["delta"]["wait_ns"] > 0
    assert data["scope"] == [pid] and data["interval"] >= 0.5


@needs_cli
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "-1"], "--interval -1: expected a positive number of seconds"),
        (["--interval", "0"], "--interval 0: expected a positive number of seconds"),
        (["--top", "-1"], "--top -1: expected 0 or more"),
        (["--interval", "0.1", "--pid", "999999999"], "no such process"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(args, message):
    proc = subprocess.run([HOSTD, "stats", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr

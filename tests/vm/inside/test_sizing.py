"""A self-sizing layer on a cgroup-v2, multi-node kernel, for real: it grows under load and shrinks
after it, and everything is put back when the agent stops.

A load of three processes named ``sizer-load`` (they spin while a flag file exists, else sleep)
is the layer's only work; its policy lets it hold 1 to 3 of the VM's CPUs (``pool_min = 1``
would leave it all but one). Idle at first, the layer keeps its minimum of 1; spinning, it
saturates and grows (every decision is logged and in ``hostd status``); idle again for
``shrink_after``, it shrinks back to 1. Its processes' affinity follows (cgroup v2: the layer's
cpuset and the threads' affinity). SIGTERM restores: the load's affinity and the cgroup tree
read as before.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap

from tests import agentproc
from tests.agentproc import Agent

# Under software emulation a pass takes seconds: a failure is reported after 3 minutes.
wait_for = functools.partial(agentproc.wait_for, timeout=180)

POLICY = """version = 1
name = "vm-sizing"
pool_min = 1
[sizing]
interval = 0.5
shrink_after = 3
[[layer]]
name = "load"
comment = "the test's load: sized to 30-70 % busy"
match = [[{ comm_prefix = "sizer-load" }, { uid = 0 }]]
kind = "confined"
cpus = { min = 1, max = 3 }
util = { low = 0.3, high = 0.7 }
[[layer]]
name = "rest"
comment = "everything else: left alone"
match = [[]]
"""

LOAD = textwrap.dedent(
    """
    import os, sys, time
    flag = sys.argv[1]
    with open("/proc/self/comm", "w") as fh:
        fh.write("sizer-load")
    for _ in range(2):
        if os.fork() == 0:
            break
    print(os.getpid(), flush=True)
    while True:
        if os.path.exists(flag):
            end = time.monotonic() + 0.05
            while time.monotonic() < end:
                pass
        else:
            time.sleep(0.05)
    """
)


def layer_cpus(agent: Agent) -> list[int]:
    for layer in agent.status().get("layers") or ():
        if layer["name"] == "load":
            return layer["cpus"]
    return []


def test_a_layer_grows_under_load_and_shrinks_after(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    flag = tmp_path / "busy"
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(flag)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    pids = [int(load.stdout.readline()) for _ in range(3)]
    before = {pid: os.sched_getaffinity(pid) for pid in pids}
    agent = Agent(tmp_path, load.pid, policy=policy)
    try:
        agent.wait_passes(1, timeout=300)
        wait_for(lambda: len(layer_cpus(agent)) == 1, "the idle layer at its minimum", agent)
        flag.touch()  # three spinning processes: the layer saturates
        wait_for(lambda: len(layer_cpus(agent)) > 1, "the layer grown", agent)
        wait_for(lambda: len(layer_cpus(agent)) == 3, "the layer at its maximum", agent)
        cpus = set(layer_cpus(agent))
        wait_for(lambda: all(os.sched_getaffinity(p) <= cpus for p in pids), "affinity", agent)
        flag.unlink()  # idle: after shrink_after the layer shrinks back
        wait_for(lambda: len(layer_cpus(agent)) == 1, "the layer shrunk", agent)
        resizes = agent.status()["sizing"]["resizes"]
        grows = [r for r in resizes if r["to"] > r["from"]]
        shrinks = [r for r in resizes if r["to"] < r["from"]]
        assert grows and shrinks, resizes
        assert all(r["why"].startswith("grow") for r in grows), resizes
        assert all(r["why"].startswith("shrink") for r in shrinks), resizes
        assert shrinks[-1]["to"] == 1
    finally:
        log = agent.stop(signal.SIGTERM)
        flag.unlink(missing_ok=True)
    try:
        assert "Traceback" not in log, log
        assert "resize layer=load" in log
        assert {pid: os.sched_getaffinity(pid) for pid in pids} == before  # restored
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait()

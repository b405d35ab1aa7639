"""An affinity the thread's cpuset does not allow, on the real kernel (root): sched_setaffinity
fails with EINVAL; the knob reports it as not permitted (its cpuset does not permit those CPUs:
a container's, say; an outcome, not an agent error) and names the cpuset the thread is in, so
that the log says why. A v1 cpuset of one CPU is made for the test and removed after it."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from hostd import knobkinds, knobs
from hostd.host import Host
from hostd.host.errors import NotPermitted
from tests.privileged.test_agent import needs_v1_cpuset

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: moves a thread between cpusets"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs"),
]

ROOT = Path("/sys/fs/cgroup/cpuset")


@needs_v1_cpuset
def test_affinity_outside_the_threads_cpuset_is_refused_and_says_which(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    box = ROOT / f"hostd-test-einval-{os.getpid()}"
    sleeper = subprocess.Popen(["sleep", "600"])
    box.mkdir()
    try:
        (box / "cpuset.mems").write_text((ROOT / "cpuset.mems").read_text().split(",")[0])
        (box / "cpuset.cpus").write_text(str(cpus[-1]))
        (box / "tasks").write_text(str(sleeper.pid))
        host = Host()
        key = knobs.task_key(sleeper.pid, host.start_time(sleeper.pid), "affinity")
        with pytest.raises(NotPermitted) as refused:
            knobkinds.write(host, key, str(cpus[0]))
        assert refused.value.errno == errno.EINVAL and refused.value.outcome == "not-permitted"
        assert f"outside its cpuset /{box.name}" in str(refused.value), refused.value
        assert os.sched_getaffinity(sleeper.pid) == {cpus[-1]}  # unchanged
        knobkinds.write(host, key, str(cpus[-1]))  # inside it: accepted
    finally:
        sleeper.kill()
        sleeper.wait()
        box.rmdir()
    assert not box.exists()

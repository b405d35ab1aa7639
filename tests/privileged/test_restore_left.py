"""A restore puts back only what is still hostd's (issue 44.4; root, real threads): a thread an
admin reniced after hostd did keeps the admin's nice, and is reported "left"; a thread hostd
reniced twice gets its original back; after the agent's stop and after ``hostd restore`` from
the journal's file alike."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hostd import knobs
from hostd.host import Host
from hostd.journal import Journal, read_boot_id
from hostd.reconcile import LEFT, Observed, reconcile, restore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: renices real threads")


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "restore after kill -9"])
def test_a_renice_since_hostd_is_left_and_hostds_own_values_go_back(tmp_path, crash):
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)
    ]
    try:
        host = Host()
        journal = Journal(tmp_path, read_boot_id(host))
        keys = [knobs.task_key(p.pid, host.start_time(p.pid), "nice") for p in procs]
        admins, twice = procs
        before = [os.getpriority(os.PRIO_PROCESS, p.pid) for p in procs]
        assert before == [0, 0]
        report = reconcile(host, journal, dict.fromkeys(keys, 5), Observed(()), unchangeable=set())
        assert report.counts == {"applied": 2}
        report = reconcile(
            host, journal, {keys[0]: 5, keys[1]: 10}, Observed(()), unchangeable=set()
        )
        assert report.counts == {"skipped": 1, "applied": 1}
        os.setpriority(os.PRIO_PROCESS, admins.pid, 7)  # an admin's renice, since
        if crash:
            journal = Journal(tmp_path, read_boot_id(host))  # what the file says
        report = restore(host, journal)
        outcome = {r.key: (r.outcome, r.detail) for r in report.results}
        assert outcome[keys[0]] == ("left", LEFT)
        assert outcome[keys[1]][0] == "restored"
        assert os.getpriority(os.PRIO_PROCESS, admins.pid) == 7
        assert os.getpriority(os.PRIO_PROCESS, twice.pid) == 0
        assert not Journal(tmp_path, read_boot_id(host)).records  # both closed
    finally:
        for p in procs:
            p.kill()
            p.wait()

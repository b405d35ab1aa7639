"""A real Prometheus server scrapes a running agent (root: the agent runs for real), and its
HTTP API gives back the per-layer series. Prometheus is Debian's package, unpacked by
``python -m tests.prometheus install`` (.ci/run does it); without it the test skips and says so."""

from __future__ import annotations

import os

import pytest

from tests.privileged.test_agent import HOSTD, Agent
from tests.prometheus import Prometheus, binary
from tests.workload import TrainingJob

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent runs for real"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(
        binary() is None,
        reason="no Prometheus server: `python -m tests.prometheus install` (Debian's package)",
    ),
]

POLICY = """version = 1
name = "scraped"
[metrics]
port = 0
[[layer]]
name = "trainer"
comment = "the ranks"
match = [[{ job_role = "rank" }, { uid = 0 }]]
sched = { nice = 2 }
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""


def test_a_real_prometheus_scrapes_the_agent(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with TrainingJob(ranks=1, workers=0) as job:
        agent = Agent(tmp_path, job.launcher, policy=policy)
        try:
            agent.wait_passes(1)
            url = agent.status()["metrics"]
            assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
            prom = Prometheus([url.split("/")[2]], tmp_path)
            try:
                assert prom.wait('up{job="hostd"}')[0]["value"][1] == "1"
                trainer = prom.wait('hostd_layer_threads{layer="trainer"}')
                assert float(trainer[0]["value"][1]) >= 1
                layers = {r["metric"]["layer"] for r in prom.wait("hostd_layer_threads")}
                assert layers == {"trainer", "rest"}
                info = prom.wait("hostd_info")[0]["metric"]
                assert (info["policy"], info["mode"], info["state"]) == (
                    "scraped", "enforce", "running",
                )  # fmt: skip
                applied = prom.wait('hostd_actions_total{outcome="applied"}')
                assert float(applied[0]["value"][1]) >= 1  # the rank's nice, at least
                # the layers' CPU and run-queue wait, sampled from schedstat every 5 s
                assert prom.wait('hostd_layer_cpu_seconds_total{layer="trainer"}')
                assert prom.wait('hostd_layer_wait_per_wakeup_seconds_count{layer="trainer"}')
                # a new thread of the rank, placed from its event: the lag histogram counts it
                job.new_thread(job.ranks[0])
                # the stand-in job's attempt (torchrun's run id "standin"), by its labels
                labels = '{training_job="standin",attempt="torchrun standin restart 0"}'
                assert prom.wait(f"hostd_job_cpu_seconds_total{labels}")
                info = prom.wait("hostd_job_attempt_info")[0]["metric"]
                # nice 2 protects nothing: the attempt is recorded as not protected
                assert (info["source"], info["protected"]) == ("torchrun", "false")
                lag = prom.wait("hostd_event_lag_seconds_count > 0")
                assert float(lag[0]["value"][1]) >= 1
                assert prom.wait('hostd_event_lag_seconds_bucket{le="+Inf"} > 0')
            finally:
                prom.stop()
        finally:
            agent.stop()

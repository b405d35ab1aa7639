"""The agent's Prometheus exporter: what ``hostd status`` says, as metrics, over HTTP.

``Exporter(state, status).start()`` serves ``/metrics`` with prometheus_client on the policy's
``[metrics]`` address and port (localhost:9464 by default; ``HOSTD_METRICS_ADDRESS`` and
``HOSTD_METRICS_PORT`` override them, as the DaemonSet does to be scraped on the pod's IP). A
scrape reads the agent's last status document (``StatusFile.last``, replaced whole each time the
agent writes it, at most once a second): the HTTP thread never touches the agent's live state,
and a scrape costs no read of /proc.

The HTTP server is the agent's guest, and bounded so that no client can starve it (issue 44.2):
``hostd.agent.metrics_http`` says how.

Metric names follow Prometheus' conventions (``hostd_`` prefix, base units, ``_total`` for
counters); docs/operations.md, "Metrics", lists them. The fleet's recording and alerting rules,
deploy/prometheus/hostd-rules.yml, read them by these names (tests/unit/test_prometheus_rules.py
checks that each name they read is served here).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING
from wsgiref.simple_server import make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from hostd.agent.metrics_http import DEADLINE_S, MAX_CLIENTS, Handler, Server

if TYPE_CHECKING:
    from hostd.agent.state import AgentState
    from hostd.agent.status import StatusFile

log = logging.getLogger("hostd")
# The outcomes of a knob write (hostd.reconcile), which the agent counts.
OUTCOMES = (
    "applied", "skipped", "restored", "left", "gone", "not-permitted", "unchangeable", "error",
    "unsupported", "unjournaled",
)  # fmt: skip
# The agent's loop catches what its work raises (hostd.agent.loop): a full pass, an event pass,
# or the rest of a step (a part, a source); the counter each is counted under.
PASS_ERRORS = {"full": "full_pass_errors", "event": "event_pass_errors", "step": "step_errors"}


# Event lag: a new thread's proc-connector event to its knobs applied (seconds).
LAG_BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)


class Histogram:
    """Counts of observations at or below each bound, their number and sum (Prometheus'
    histogram, kept by the agent's own thread; a scrape reads its ``doc()`` in the status)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # not cumulative: one bucket per observation
        self.count, self.sum = 0, 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.bounds):
            self.counts[i] += 1
        self.count += 1
        self.sum += value

    def observe_many(self, value: float, times: int, total: float) -> None:
        """``times`` observations of ``value`` whose sum is ``total``."""
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.bounds):
            self.counts[i] += times
        self.count += times
        self.sum += total

    def doc(self) -> dict:
        """Cumulative buckets ("le" bounds), count and sum, as JSON."""
        cumulative = list(itertools.accumulate(self.counts))
        return {"le": list(self.bounds), "buckets": cumulative, "count": self.count,
                "sum": round(self.sum, 6)}  # fmt: skip


def _buckets(value: dict) -> list[tuple[str, float]]:
    """A ``Histogram.doc()`` as prometheus_client's buckets, +Inf last."""
    pairs = zip(value["le"], value["buckets"], strict=True)
    return [(repr(float(b)), c) for b, c in pairs] + [("+Inf", value["count"])]


def histogram_family(name: str, doc: str, value: dict | None) -> HistogramMetricFamily:
    value = value or {"le": [], "buckets": [], "count": 0, "sum": 0.0}
    return HistogramMetricFamily(name, doc, buckets=_buckets(value), sum_value=value["sum"])


class Collector:
    """Metric families from the agent's last status document."""

    def __init__(self, status: StatusFile, exporter: Exporter) -> None:
        self.status, self.exporter = status, exporter

    def describe(self) -> list[Metric]:
        return []  # no registration-time scrape: the families depend on the policy

    def collect(self) -> Iterator[Metric]:
        st = self.status.last
        info = InfoMetricFamily("hostd", "The agent: version, policy, mode and state.")
        info.add_metric(
            [],
            {
                "version": str(st.get("version", "")),
                "policy": str((st.get("policy") or {}).get("name", "")),
                "mode": str(st.get("mode", "")),
                "state": str(st.get("state", "starting")),
            },
        )
        yield info
        threads = GaugeMetricFamily(
            "hostd_layer_threads", "Threads in each layer (hostd's own left out).", labels=["layer"]
        )
        cpus = GaugeMetricFamily(
            "hostd_layer_cpus",
            "CPUs a layer has of its own (0: the shared pool).",
            labels=["layer"],
        )
        for layer in st.get("layers") or ():
            threads.add_metric([layer["name"]], layer["threads"])
            cpus.add_metric([layer["name"]], len(layer["cpus"]))
        yield threads
        yield cpus
        layer_stats = st.get("layer_stats") or {}
        for name, key, doc in (
            ("hostd_layer_cpu_seconds", "cpu_seconds", "CPU time of a layer's threads."),
            ("hostd_layer_runqueue_wait_seconds", "wait_seconds",
             "Time a layer's threads were runnable but waited for a CPU (schedstat)."),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=["layer"])
            for layer, value in sorted((layer_stats.get(key) or {}).items()):
                family.add_metric([layer], value)
            yield family
        switches = CounterMetricFamily(
            "hostd_layer_involuntary_switches",
            "Times a layer's threads were switched out while they could still run (preempted).",
            labels=["layer"],
        )
        for layer, value in sorted((layer_stats.get("involuntary_switches") or {}).items()):
            switches.add_metric([layer], value)
        yield switches
        pressure = CounterMetricFamily(
            "hostd_layer_cpu_pressure_seconds",
            "CPU pressure stall time (PSI) of the cgroup v2 groups hostd made for a layer: "
            "some (a task waited) and full (all did).",
            labels=["layer", "kind"],
        )
        for layer, value in sorted((layer_stats.get("cpu_pressure_seconds") or {}).items()):
            pressure.add_metric([layer, "some"], value["some"])
            pressure.add_metric([layer, "full"], value["full"])
        yield pressure
        resizes = CounterMetricFamily(
            "hostd_layer_resizes", "CPU count changes of a self-sizing layer.", labels=["layer"]
        )
        for layer, value in sorted(((st.get("sizing") or {}).get("resizes_total") or {}).items()):
            resizes.add_metric([layer], value)
        yield resizes
        waits = HistogramMetricFamily(
            "hostd_layer_wait_per_wakeup_seconds",
            "Run-queue wait per wakeup of a layer's threads (each thread's mean per timeslice "
            "over a sample, counted once per timeslice).",
            labels=["layer"],
        )
        for layer, value in sorted((layer_stats.get("wait_per_wakeup") or {}).items()):
            waits.add_metric([layer], _buckets(value), value["sum"])
        yield waits
        events = st.get("events") or {}
        passes = CounterMetricFamily(
            "hostd_passes", "Passes of the agent by kind: full (every thread) or event.",
            labels=["kind"],
        )  # fmt: skip
        passes.add_metric(["full"], events.get("full_passes", 0))
        passes.add_metric(["event"], events.get("event_passes", 0))
        yield passes
        actions = CounterMetricFamily(
            "hostd_actions", "Knob writes by outcome (applied, restored, gone, ...).",
            labels=["outcome"],
        )  # fmt: skip
        for outcome in OUTCOMES:
            actions.add_metric([outcome], events.get(outcome, 0))
        yield actions
        errors = CounterMetricFamily(
            "hostd_pass_errors", "Work of the agent's loop that raised (caught, logged): a full "
            "pass, an event pass, or the rest of a step (a part, an event source).",
            labels=["kind"],
        )  # fmt: skip
        for kind, key in PASS_ERRORS.items():
            errors.add_metric([kind], events.get(key, 0))
        yield errors
        for name, key, doc in (
            ("hostd_events", "events", "Thread events from the proc connector."),
            (
                "hostd_event_overflows",
                "overflows",
                "Event buffer overflows (a full pass, at most one per 5 s).",
            ),
            (
                "hostd_rename_storms",
                "rename_storms",
                "One thread's rename storms: rename events muted for a minute.",
            ),
            ("hostd_device_events", "device_events", "Device events (each a full pass)."),
            ("hostd_relooked_threads", "relooked", "Unnamed job threads moved by what they do."),
            ("hostd_slow_cpuset_joins", "slow_joins", "Cpuset joins that held forks (backed off)."),
        ):
            yield CounterMetricFamily(name, doc, value=events.get(key, 0))
        yield histogram_family(
            "hostd_event_lag_seconds",
            "From a new thread's proc-connector event to its knobs in place.",
            st.get("event_lag"),
        )
        last = st.get("last_pass") or {}
        yield GaugeMetricFamily(
            "hostd_full_pass_seconds", "How long the last full pass took.",
            value=last.get("seconds", 0.0),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "hostd_journal_records", "Original values the journal holds (to restore).",
            value=(st.get("journal") or {}).get("records", 0),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "hostd_journal_left_records",
            "Original values the journal already held when this agent started: an earlier agent "
            "ended without putting them back (killed, crashed), or a restore could not.",
            value=events.get("journal_left", 0),
        )
        pre = st.get("preempt") or {}
        yield GaugeMetricFamily(
            "hostd_demoted_sessions", "Busy sessions demoted while a protected layer runs.",
            value=len(pre.get("demoted") or ()),
        )  # fmt: skip
        yield demoted_by_kind(pre.get("demoted") or ())
        counts = pre.get("counts") or {}
        for name, key, doc in (
            ("hostd_demotions", "demotions", "Sessions demoted."),
            ("hostd_demotion_releases", "releases", "Demoted sessions released."),
            (
                "hostd_demotion_lifts",
                "lifts",
                "Demoted sessions lifted: runnable past the floor without running.",
            ),
            (
                "hostd_session_weight_given",
                "weight_given",
                "The job's session weight given: demoted work it must outweigh.",
            ),
            (
                "hostd_session_weight_taken",
                "weight_taken",
                "The job's session weight taken back: no demoted work needs outweighing.",
            ),
            ("hostd_guard_boosts", "boosts", "Starvation-guard boosts."),
            ("hostd_guard_runaways", "runaways", "Real-time threads returned to normal."),
        ):
            yield CounterMetricFamily(name, doc, value=counts.get(key, 0))
        yield from job_families(st.get("attempts") or {}, st.get("hostname", ""))
        http = self.exporter.connections()
        yield CounterMetricFamily(
            "hostd_metrics_connections_refused",
            f"Scrape connections shut down or closed to make room ({MAX_CLIENTS} at once).",
            value=http["refused"],
        )
        yield CounterMetricFamily(
            "hostd_metrics_connections_expired",
            f"Scrape connections shut down after {DEADLINE_S:g} s.",
            value=http["expired"],
        )
        own = st.get("self") or {}
        yield CounterMetricFamily(
            "hostd_agent_cpu_seconds", "CPU time the agent itself used.",
            value=own.get("cpu_seconds", 0.0),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "hostd_agent_resident_memory_bytes", "The agent's resident memory.",
            value=own.get("rss_bytes", 0),
        )  # fmt: skip


def demoted_by_kind(demoted: Iterable[dict]) -> GaugeMetricFamily:
    """The demoted sessions by what they are on the node (``hostd.agent.demotion.where_of``):
    their kind, their pod's namespace, and whether the default policy keeps such a session from
    demotion (the node's infrastructure: a policy edited badly demotes it)."""
    family = GaugeMetricFamily(
        "hostd_demoted_sessions_by_kind",
        "Demoted sessions by node kind, pod namespace and whether they are the node's "
        "infrastructure (never demoted by the default policy).",
        labels=["kind", "namespace", "infrastructure"],
    )
    counts: Counter[tuple[str, str, str]] = Counter()
    for d in demoted:
        infra = "true" if d.get("infrastructure") else "false"
        counts[d.get("kind", "other"), d.get("namespace", ""), infra] += 1
    for labels, n in sorted(counts.items()):
        family.add_metric(list(labels), n)
    return family


def job_families(attempts: dict, hostname: str) -> Iterator[Metric]:
    """The live job attempts (``hostd.agent.attempts``): at most ``MAX_LABELLED`` by their
    ``training_job`` and ``attempt`` labels (``job`` is Prometheus' own: the scrape job's), the
    others together as ``training_job="other"``, so that a host's series stay few however many
    jobs it runs; their GPUs labelled as DCGM's exporter labels them (``gpu``, ``UUID``,
    ``device``, ``modelName``, ``Hostname``) to join its series."""
    live = attempts.get("live") or []
    info = InfoMetricFamily(
        "hostd_job_attempt", "A job attempt hostd records: its source and whether protected.",
        labels=["training_job", "attempt", "uid"],
    )  # fmt: skip
    gpus = InfoMetricFamily(
        "hostd_job_gpu", "A GPU a job attempt uses, labelled as DCGM's exporter labels it.",
        labels=["training_job", "attempt", "uid", "gpu", "UUID", "device", "modelName", "Hostname"],
    )  # fmt: skip
    cpu = CounterMetricFamily(
        "hostd_job_cpu_seconds",
        "CPU time of a job attempt's threads.",
        labels=["training_job", "attempt", "uid"],
    )
    wait = CounterMetricFamily(
        "hostd_job_runqueue_wait_seconds",
        "Time a job attempt's threads were runnable but waited for a CPU.",
        labels=["training_job", "attempt", "uid"],
    )
    util = GaugeMetricFamily(
        "hostd_job_gpu_utilization_ratio",
        "Mean utilisation of a job attempt's GPUs over the last sample (NVML).",
        labels=["training_job", "attempt", "uid"],
    )
    rate = GaugeMetricFamily(
        "hostd_job_throughput", "The throughput a job attempt reports (HOSTD_THROUGHPUT_FILE).",
        labels=["training_job", "attempt", "uid", "unit"],
    )  # fmt: skip
    for a in live:
        labels = [a["job"], a["attempt"], str(a["uid"])]
        info.add_metric(labels, {"source": a["source"], "protected": str(a["protected"]).lower()})
        for g in a.get("gpus") or ():
            gpus.add_metric(
                [*labels, g["gpu"], g["UUID"], g["device"], g["modelName"], hostname], {}
            )
        cpu.add_metric(labels, a["cpu_seconds"])
        wait.add_metric(labels, a["wait_seconds"])
        if a.get("gpu_utilization") is not None:
            util.add_metric(labels, a["gpu_utilization"])
        if a.get("throughput") is not None:
            rate.add_metric([*labels, a.get("throughput_unit") or ""], a["throughput"])
    other = attempts.get("other") or {}
    if other.get("attempts"):
        cpu.add_metric(["other", "other", ""], other["cpu_seconds"])
        wait.add_metric(["other", "other", ""], other["wait_seconds"])
    yield from (info, gpus, cpu, wait, util, rate)


class Exporter:
    def __init__(self, state: AgentState, status: StatusFile) -> None:
        self.state, self.status = state, status
        self.server: Server | None = None
        self.address: tuple[str, int] | None = None

    def start(self) -> None:
        conf = self.state.policy.metrics
        if not conf.enabled:
            return
        address = os.environ.get("HOSTD_METRICS_ADDRESS") or conf.address
        try:
            port = int(os.environ.get("HOSTD_METRICS_PORT") or conf.port)
        except ValueError:
            log.warning("metrics: HOSTD_METRICS_PORT is no port number: no exporter")
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector(self.status, self))  # type: ignore[arg-type]
        try:
            self.server = make_server(
                address, port, make_wsgi_app(registry), Server, handler_class=Handler
            )
        except (OSError, OverflowError, ValueError) as exc:
            log.warning("metrics: cannot listen on %s:%d (%s): no exporter", address, port,
                        getattr(exc, "strerror", None) or exc)  # fmt: skip
            return
        threading.Thread(
            target=self.server.serve_forever, name="hostd-metrics", daemon=True
        ).start()
        self.address = (address, self.server.server_address[1])
        log.info("metrics http://%s:%d/metrics", *self.address)

    def connections(self) -> dict[str, int]:
        """Connections open now, ended to make room for others, and ended at the deadline."""
        srv = self.server
        if srv is None:
            return {"open": 0, "refused": 0, "expired": 0}
        return {"open": len(srv.live), "refused": srv.refused, "expired": srv.expired}

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

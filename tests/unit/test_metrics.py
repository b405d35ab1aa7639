"""The agent's Prometheus exporter: scraped over HTTP, it says what the status file says."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
import types
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostd.agent import Agent, metrics, metrics_http
from hostd.host import Host
from hostd.policy import PolicyError, parse_policy
from hostd.reconcile import PassReport
from tests.fakes import FakeCalls, host_copy

POLICY = """version = 1
[metrics]
address = "127.0.0.1"
port = 0
[[layer]]
name = "trainer"
comment = "the ranks"
match = [[{ job_role = "rank" }]]
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_says_what_the_status_says(tmp_path):
    tree = host_copy(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), str(policy), state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe", allow_insecure_policy=True)  # fmt: skip
    agent.exporter.start()
    try:
        assert agent.exporter.address and agent.exporter.address[1] > 0  # port 0: a free one
        agent.pass_once()
        st = agent.status.last
        assert st["metrics"] == f"http://127.0.0.1:{agent.exporter.address[1]}/metrics"
        got = scrape(st["metrics"])
        for layer in st["layers"]:
            assert got[("hostd_layer_threads", (("layer", layer["name"]),))] == layer["threads"]
        assert got[("hostd_layer_threads", (("layer", "trainer"),))] > 0
        assert got[("hostd_passes_total", (("kind", "full"),))] == 1
        info = next(k for k in got if k[0] == "hostd_info")
        assert dict(info[1])["policy"] == "policy" and dict(info[1])["mode"] == "observe"
        assert got[("hostd_agent_resident_memory_bytes", ())] > 0
        # the event-lag histogram: its buckets, count and sum (no event pass yet: empty)
        assert got[("hostd_event_lag_seconds_count", ())] == 0
        assert got[("hostd_event_lag_seconds_bucket", (("le", "+Inf"),))] == 0
        assert ("hostd_event_lag_seconds_bucket", (("le", "0.001"),)) in got
    finally:
        agent.exporter.stop()
        agent.journal.close()
        agent.status.close()
    with pytest.raises(OSError):
        scrape(st["metrics"])  # stopped: nothing listens


def _observer(tmp_path) -> Agent:
    tree = host_copy(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    return Agent(Host(tree, calls=FakeCalls(tree)), str(policy), state_dir=tmp_path / "s",
                 run_dir=tmp_path / "r", mode="observe", allow_insecure_policy=True)  # fmt: skip


def _server_fds(exclude: set[int]) -> int:
    """This process's open sockets, less the ones the test holds (the exporter's, so)."""
    found = 0
    for n in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor
            found += int(n) not in exclude and os.readlink(f"/proc/self/fd/{n}").startswith(
                "socket:"
            )
    return found


def test_idle_connections_cannot_take_the_agents_descriptors(tmp_path):
    """Issue 44.2b: 100 connections opened and left idle (each cost the agent a thread and a
    descriptor, without limit, and ran it out of descriptors). Now the exporter holds at most
    twice MAX_CLIENTS of them, the newest ending the oldest, so a scrape still gets through
    while all 100 are held."""
    agent = _observer(tmp_path)
    agent.exporter.start()
    clients: list[socket.socket] = []
    try:
        agent.pass_once()
        port = agent.exporter.address[1]
        threads, base = threading.active_count(), _server_fds(set())
        for _ in range(100):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            clients.append(c)
        mine = {c.fileno() for c in clients}

        def settled() -> bool:
            return agent.exporter.connections()["refused"] >= 100 - 2 * metrics.MAX_CLIENTS

        deadline = time.monotonic() + 30  # bounds a failure only
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert settled(), agent.exporter.connections()
        got = scrape(agent.status.last["metrics"])  # the oldest idle one made room for it
        assert got[("hostd_metrics_connections_refused_total", ())] >= 100 - 16
        assert agent.exporter.connections()["open"] <= 2 * metrics.MAX_CLIENTS
        assert threading.active_count() - threads <= 2 * metrics.MAX_CLIENTS
        assert _server_fds(mine) - base <= 2 * metrics.MAX_CLIENTS
    finally:
        for c in clients:
            c.close()
        agent.exporter.stop()
        agent.journal.close()
        agent.status.close()


def test_a_connection_past_its_deadline_is_ended(tmp_path, monkeypatch):
    """A client that sends a byte now and then (each read within IDLE_S) is ended at DEADLINE_S."""
    monkeypatch.setattr(metrics_http, "DEADLINE_S", 0.0)
    agent = _observer(tmp_path)
    agent.exporter.start()
    try:
        c = socket.create_connection(("127.0.0.1", agent.exporter.address[1]), timeout=30)
        c.sendall(b"GET /metr")  # and nothing more: the handler waits for the rest
        assert c.recv(1) == b""  # shut down by the server (the timeout only bounds a failure)
        assert agent.exporter.connections()["expired"] >= 1
        c.close()
    finally:
        agent.exporter.stop()
        agent.journal.close()
        agent.status.close()


def test_out_of_descriptors_the_accept_loop_waits(monkeypatch):
    """At EMFILE the listener stays readable: socketserver would retry at once, a busy loop (95 %
    of a CPU). The server waits a moment after each such failure, and raises it (dropped)."""
    slept = []
    monkeypatch.setattr(metrics_http.time, "sleep", slept.append)
    server = metrics_http.Server(("127.0.0.1", 0), metrics_http.Handler)
    listener = server.socket

    def emfile():
        raise OSError(errno.EMFILE, "Too many open files")

    try:
        server.socket = types.SimpleNamespace(accept=emfile)
        with pytest.raises(OSError):
            server.get_request()
        assert slept and slept[0] >= 0.1
    finally:
        server.socket = listener
        server.server_close()


def test_the_metrics_table_is_validated():
    bad = POLICY.replace("port = 0", "port = 70000").replace('"127.0.0.1"', '"localhost"')
    with pytest.raises(PolicyError) as info:
        parse_policy(bad.encode(), "m.toml")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("m.toml:3:1: metrics.address: 'localhost': expected an IP address")
    assert lines[1].startswith("m.toml:4:1: metrics.port: 70000: expected an integer from 0")
    off = parse_policy(POLICY.replace("port = 0", "enabled = false").encode(), "m.toml")
    assert off.metrics.enabled is False and off.metrics.port == 9464


def test_a_histogram_counts_each_observation_once_cumulatively():
    from hostd.agent.metrics import Histogram

    h = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.005, 0.5):  # the last above every bound: +Inf only
        h.observe(value)
    assert h.doc() == {"le": [0.001, 0.01, 0.1], "buckets": [2, 3, 3], "count": 4, "sum": 0.5065}


@pytest.mark.parametrize("budget_s", [None, 0.0], ids=["whole", "sliced"])
def test_layer_cpu_and_wait_from_schedstat(tmp_path, budget_s):
    """Two samples of every classified thread's schedstat: each layer gets its threads' CPU and
    run-queue wait, and the wait per wakeup (mean per timeslice) counted once per timeslice.
    Sliced (as the agent's loop samples, between event passes): the same sums, a slice at a
    time, the next sample not due before this one ends."""
    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
        layer_of = {tid: c.layer for tid, c in agent.inc.classified.items()}
        rank_threads = [t for t, layer in layer_of.items() if layer == "trainer"]
        assert rank_threads

        def write(run: int, wait: int, slices: int) -> None:
            for tid, item in agent.inc.classified.items():
                path = tree / "proc" / str(item.task.pid) / "task" / str(tid) / "schedstat"
                path.write_text(f"{run} {wait} {slices}\n")

        write(1_000_000, 0, 10)
        agent.layer_stats.sample()  # the baseline: nothing counted yet
        assert not agent.layer_stats.cpu
        write(3_000_000, 400_000, 14)  # +2 ms on a CPU, +0.4 ms waiting, 4 wakeups each
        stats, slices = agent.layer_stats, 1
        due = stats.due
        while not stats.sample(budget_s):
            assert stats.sampling and stats.due == due  # not due again before it ends
            slices += 1
        assert not stats.sampling
        # 69 threads: a budget already spent reads 7 a slice
        assert slices == (1 if budget_s is None else 10)
        doc = agent.layer_stats.doc()
        n = len(rank_threads)
        assert doc["cpu_seconds"]["trainer"] == pytest.approx(0.002 * n)
        assert doc["wait_seconds"]["trainer"] == pytest.approx(0.0004 * n)
        hist = doc["wait_per_wakeup"]["trainer"]
        assert hist["count"] == 4 * n  # 0.1 ms per wakeup: in the 0.1 ms bucket and above
        assert hist["buckets"][hist["le"].index(1e-4)] == 4 * n
        assert hist["buckets"][hist["le"].index(5e-5)] == 0
        assert agent.layer_stats.due > 0
    finally:
        agent.journal.close()
        agent.status.close()


@pytest.mark.parametrize(
    ("address", "port"),
    [("127.0.0.1", "x"), ("127.0.0.1", "70000"), ("192.0.2.1", "0")],  # not ours
)
def test_a_bad_override_means_no_exporter_not_a_crash(tmp_path, monkeypatch, address, port):
    monkeypatch.setenv("HOSTD_METRICS_ADDRESS", address)
    monkeypatch.setenv("HOSTD_METRICS_PORT", port)
    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.exporter.start()
        assert agent.exporter.address is None
    finally:
        agent.exporter.stop()
        agent.journal.close()
        agent.status.close()


def test_layer_preemptions_and_cpu_pressure(tmp_path):
    """With the exporter on, a sample also counts each layer's involuntary switches (threads
    that ran) and the CPU pressure (PSI) of the v2 cgroups hostd made for it: changes only."""
    tree = host_copy(tmp_path)  # a pure cgroup v2 host
    policy = tmp_path / "policy.toml"
    grouped = 'match = [[{ job_role = "rank" }]]\nkind = "grouped"\ncpus = { min = 2 }'
    # the ranks live in systemd's train.service: the policy lets hostd make its cpusets there
    asks = POLICY.replace("version = 1\n", 'version = 1\n[cgroups]\nwrite = ["service"]\n')
    policy.write_text(asks.replace('match = [[{ job_role = "rank" }]]', grouped))
    agent = Agent(Host(tree, calls=FakeCalls(tree)), str(policy), state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe", allow_insecure_policy=True)  # fmt: skip
    agent.exporter.start()
    try:
        agent.pass_once()
        groups = [cs for cs in agent.plan.cpusets if cs.layer == "trainer"]
        assert groups, agent.plan.cpusets

        def write(step: int) -> None:
            for tid, item in agent.inc.classified.items():
                task = tree / "proc" / str(item.task.pid) / "task" / str(tid)
                (task / "schedstat").write_text(f"{step * 1000} 0 {step * 10}\n")
                status = (task / "status").read_text()
                head = status[: status.index("nonvoluntary_ctxt_switches:")]
                (task / "status").write_text(f"{head}nonvoluntary_ctxt_switches:\t{step * 3}\n")
            for cs in groups:
                folder = tree / "sys/fs/cgroup" / cs.path.lstrip("/")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "cpu.pressure").write_text(
                    f"some avg10=0.00 avg60=0.00 avg300=0.00 total={step * 1000}\n"
                    f"full avg10=0.00 avg60=0.00 avg300=0.00 total={step * 10}\n"
                )

        for step in (1, 2, 3):  # the first read of a count is its baseline
            write(step)
            agent.layer_stats.sample()
        doc = agent.layer_stats.doc()
        trainer = sum(1 for c in agent.inc.classified.values() if c.layer == "trainer")
        assert doc["involuntary_switches"]["trainer"] == 3 * trainer  # one change counted
        assert doc["cpu_pressure_seconds"]["trainer"] == {
            "some": pytest.approx(0.002 * len(groups)), "full": pytest.approx(2e-5 * len(groups)),
        }  # fmt: skip
        agent.write_status(PassReport(), None, "running")
        got = scrape(agent.status.last["metrics"])
        key = ("hostd_layer_involuntary_switches_total", (("layer", "trainer"),))
        assert got[key] == 3 * trainer
        some = ("hostd_layer_cpu_pressure_seconds_total", (("kind", "some"), ("layer", "trainer")))
        assert got[some] == pytest.approx(0.002 * len(groups))
    finally:
        agent.exporter.stop()
        agent.journal.close()
        agent.status.close()


def test_a_storm_that_lasts_still_gets_its_statistics_sampled(tmp_path, monkeypatch):
    """While events wait the loop samples only once a sample is ``STATS_FLOOR_S`` late: to
    begin (past its due time) and to go on (past its last slice)."""
    from hostd.agent import parts

    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
        stats, now = agent.layer_stats, time.monotonic()
        stats.due = now  # due just now: not late yet
        assert not parts.stats_overdue(stats)
        stats.due = now - 2 * parts.STATS_FLOOR_S
        assert parts.stats_overdue(stats)  # a sample to begin, late
        assert stats.sample(0.0) is False and stats.sampling
        assert not parts.stats_overdue(stats)  # a slice just ran
        stats.last_slice -= 2 * parts.STATS_FLOOR_S
        assert parts.stats_overdue(stats)  # the next slice, late
    finally:
        agent.journal.close()
        agent.status.close()


def collected(agent: Agent) -> dict[tuple[str, tuple], float]:
    """What a scrape would say now, straight from the exporter's collector (no HTTP)."""
    families = metrics.Collector(agent.status, agent.exporter).collect()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_passes_that_raise_are_counted_by_kind(tmp_path, monkeypatch):
    """The loop catches a full pass and an event pass that raise (hostd.agent.loop): each is
    counted under its kind, and is no pass; the full pass that follows a failed event pass is."""
    from hostd.agent import loop
    from hostd.host.connector import Event
    from tests.unit.test_agent_parts import RANK, _Connector

    agent = _observer(tmp_path)
    try:
        agent.pass_once()

        def boom(*args: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(agent, "pass_once", boom)
        loop.full(agent, "drift")
        monkeypatch.undo()
        monkeypatch.setattr(agent, "event_pass", boom)
        agent.sources.connector = _Connector([Event("fork", 4300, RANK, RANK)])
        agent.sources.kind = "events"
        loop.step(agent)  # the event pass raises: a full pass ("recovery") follows
        assert agent.counters["full_pass_errors"] == agent.counters["event_pass_errors"] == 1
        agent.write_status(PassReport(), None, "running")
        got = collected(agent)
        errors = {kind: got[("hostd_pass_errors_total", (("kind", kind),))] for kind in
                  ("full", "event", "step")}  # fmt: skip
        assert errors == {"full": 1, "event": 1, "step": 0}
        assert got[("hostd_passes_total", (("kind", "full"),))] == 2  # the first, the recovery
        assert got[("hostd_passes_total", (("kind", "event"),))] == 0
    finally:
        agent.sources.close()
        agent.journal.close()
        agent.status.close()


def _enforcer(tmp_path) -> Agent:
    """An agent in enforce mode on the default policy, as tests/unit/test_agent_parts.py runs
    one: its writes land in the fixture tree."""
    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r")  # fmt: skip
    agent.caps.sched = agent.caps.affinity = True  # the fake has threads to call
    return agent


def test_changes_the_journal_could_not_record_are_counted_as_unjournaled(tmp_path, monkeypatch):
    """A journal that refuses appends (a full disk): the pass writes nothing it could not
    record, and a demotion is not made; each refusal is an action of outcome "unjournaled"."""
    from hostd.journal import JournalError
    from hostd.preempt import Demotion

    agent = _enforcer(tmp_path)
    try:

        def full(*args: object) -> None:
            raise JournalError("journal.jsonl: no space left on device")

        monkeypatch.setattr(agent.journal, "record", full)
        report = agent.pass_once()
        refused = report.counts.get("unjournaled", 0)
        assert refused > 0 and "applied" not in report.counts
        sid = agent.cache.procs[5000].session  # user 1000's busy login
        sessions = {sid: [p.pid for p in agent.cache.procs.values() if p.session == sid]}
        agent.watcher.watch.demoted[sid] = Demotion(sid, time.monotonic(), 2.0)
        agent.watcher.demotions.demote(sid, 2.0, sessions)
        assert sid not in agent.watcher.watch.demoted  # no durable record: no demotion
        agent.write_status(PassReport(), None, "running")
        got = collected(agent)
        assert got[("hostd_actions_total", (("outcome", "unjournaled"),))] == refused + 1
        assert got[("hostd_actions_total", (("outcome", "applied"),))] == 0
    finally:
        agent.journal.close()
        agent.status.close()


def test_originals_an_earlier_run_left_are_said_at_start(tmp_path):
    """A journal that an agent killed before it restored left: the next agent starts on it and
    says how many originals it found (hostd_journal_left_records), for as long as it runs."""
    from hostd import knobs
    from hostd.journal import Journal, read_boot_id

    tree = host_copy(tmp_path)
    host = Host(tree, calls=FakeCalls(tree))
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    earlier = Journal(state, read_boot_id(host))
    earlier.record([(knobs.task_key(tid, host.start_time(tid), "nice"), 0) for tid in (4100, 4200)])
    earlier.close()
    agent = Agent(host, None, state_dir=state, run_dir=tmp_path / "r", mode="observe")
    try:
        agent.pass_once()
        assert agent.status.last["events"]["journal_left"] == 2
        assert collected(agent)[("hostd_journal_left_records", ())] == 2
    finally:
        agent.journal.close()
        agent.status.close()
    fresh = _observer(tmp_path / "fresh")
    try:
        fresh.pass_once()
        assert collected(fresh)[("hostd_journal_left_records", ())] == 0
    finally:
        fresh.journal.close()
        fresh.status.close()


def test_demoted_sessions_say_what_they_are_on_the_node(tmp_path):
    """Each demoted session is labelled by its node kind, its pod's namespace and whether the
    default policy keeps such a session (the node's infrastructure): sshd's session, a system
    service, which only a policy whose [preempt] keep_kinds lost "service" demotes, and a user's
    login session, whose leader is gone (the kind of its processes)."""
    from hostd.preempt import Demotion

    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
        procs = agent.cache.procs
        sessions: dict[int, list[int]] = {}
        for proc in procs.values():
            sessions.setdefault(proc.session, []).append(proc.pid)
        sshd, login = procs[1210].session, procs[5000].session
        assert login not in procs  # (its leader exited)
        for sid in (sshd, login):
            agent.watcher.watch.demoted[sid] = Demotion(sid, time.monotonic(), 2.0)
            agent.watcher.demotions.demote(sid, 2.0, sessions)
        agent.write_status(PassReport(), None, "running")
        said = {d["session"]: d for d in agent.status.last["preempt"]["demoted"]}
        assert (said[sshd]["kind"], said[sshd]["namespace"]) == ("service", "")
        assert said[sshd]["infrastructure"] is True
        assert (said[login]["kind"], said[login]["infrastructure"]) == ("login", False)
        got = collected(agent)
        labels = (("infrastructure", "true"), ("kind", "service"), ("namespace", ""))
        assert got[("hostd_demoted_sessions_by_kind", labels)] == 1
        labels = (("infrastructure", "false"), ("kind", "login"), ("namespace", ""))
        assert got[("hostd_demoted_sessions_by_kind", labels)] == 1
        assert got[("hostd_demoted_sessions", ())] == 2  # (the total, as before)
        agent.watcher.watch.demoted.pop(sshd)
        agent.watcher.demotions.release(sshd, "released", sessions)
        agent.write_status(PassReport(), None, "running")
        got = collected(agent)
        assert [k for k in got if k[0] == "hostd_demoted_sessions_by_kind"] == [
            ("hostd_demoted_sessions_by_kind", labels)
        ]
    finally:
        agent.journal.close()
        agent.status.close()

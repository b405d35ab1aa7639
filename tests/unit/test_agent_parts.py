"""The agent's parts without root: a whole pass, an event burst and an overflow on a fake kernel.

The host is a copy of the dgx-h100 fixture tree with ``tests.fakes.FakeCalls`` as its thread
calls (writes land in the tree's own stat and status files); the agent is the real one, with its
real journal, planner, reconcile and status file, in folders below ``tmp_path``. Cpusets, IRQs
and real-time stay off (the doctor's probe says so on a fixture tree); nice, policy and affinity
are changed and given back.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from hostd.agent import Agent, core, incremental, loop, parts
from hostd.agent.events import Batch
from hostd.host import Host, HostError
from hostd.host.connector import Event, Overflow
from hostd.reconcile import restore
from tests.fakes import FakeCalls, host_copy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "dgx-h100"
INFERENCE = Path(__file__).resolve().parents[2] / "policies" / "inference.toml"
RANK = 4100  # a rank of the fixture's torchrun job: main thread 4100, threads 4101-4111


def _proc_files(tree: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(tree)): p.read_bytes()
        for p in sorted((tree / "proc").rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name in ("stat", "status")
    }


@pytest.fixture
def agent(tmp_path):
    tree = host_copy(tmp_path)
    calls = FakeCalls(tree)
    host = Host(tree, calls=calls)
    a = Agent(host, None, state_dir=tmp_path / "state", run_dir=tmp_path / "run")
    a.caps.sched = a.caps.affinity = True  # the fake has threads to call
    a.tree, a.calls, a.before = tree, calls, _proc_files(tree)  # type: ignore[attr-defined]
    yield a
    a.journal.close()
    a.status.close()


def test_batch_coalesces_a_burst_per_thread():
    def in_scope(tgid, parent=0):
        return tgid != 666

    events = [
        Event("fork", 11, 10, 10),  # a thread of 10, then it exits: an exit only
        Event("comm", 11, 10, 0, "worker"),
        Event("exit", 11, 10),
        Event("fork", 20, 20, 10),  # a new process, renamed, then exec'd
        Event("comm", 20, 20, 0, "pt_data_worker"),
        Event("exec", 20, 20),
        Event("fork", 31, 30, 30),
        Event("fork", 31, 30, 30),  # named twice: read once
        Event("fork", 667, 666, 666),  # out of scope
        Event("comm", 99, 99, 0, "hostd"),  # the agent itself
    ]
    batch = Batch.of(events, me=99, in_scope=in_scope)
    assert batch.exits == [11]
    assert batch.named == {20: 20, 31: 30}
    assert batch.exec_pids == {20}
    assert batch.leaders == {20: "pt_data_worker"}
    assert batch.size == len(events)


def test_a_full_pass_applies_journals_reports_and_restores(agent):
    report = agent.pass_once()
    assert report.counts.get("applied", 0) > 0, report.counts
    assert not [r for r in report.results if r.outcome == "error"], report.results
    written = {tid for _, tid, _ in agent.calls.writes}
    assert RANK in written and RANK + 1 in written  # the rank's threads, in trainer
    # Every write has its journal record, for that thread and that kind (restore, below,
    # shows the originals were the tree's values: it gives back every file byte for byte).
    recorded = set(agent.journal.recorded())
    for kind, tid, _ in agent.calls.writes:
        start = agent.host.start_time(tid)
        assert f"task/{tid}@{start}/{kind}" in recorded, (kind, tid)
    assert agent.status.last["state"] == "running"
    on_disk = json.loads((Path(agent.status.run_dir) / "status.json").read_text())
    layers = {ly["name"]: ly["threads"] for ly in on_disk["layers"]}
    assert layers == {k: v for k, v in agent.inc.layer_counts.items() if k in layers}
    assert layers["trainer"] > 0
    # A second pass finds the tree as the first left it: nothing to write again.
    before = len(agent.calls.writes)
    again = agent.pass_once("drift")
    assert len(agent.calls.writes) == before, agent.calls.writes[before:]
    assert again.counts.get("applied", 0) == 0
    # Restore gives every file back byte for byte.
    restored = restore(agent.host, agent.journal)
    assert restored.counts.get("restored", 0) > 0
    assert _proc_files(agent.tree) == agent.before
    assert len(agent.journal) == 0


@pytest.mark.parametrize("piece", [1, 7])
def test_a_full_pass_in_pieces_does_what_one_piece_does(tmp_path, monkeypatch, piece):
    """A full pass writes its threads a piece at a time (``core.PIECE``, ``desired_pieces``):
    with pieces of one thread or of seven, every thread's writes in their order, every record,
    every file and every count are those of a pass in one piece, through a change of policy
    (records given back, others written) and a thread that exited (its records closed); and a
    pass after them finds nothing to do."""

    def passes(size: int) -> tuple:
        monkeypatch.setattr(core, "PIECE", size)
        tree = host_copy(tmp_path / str(size))
        calls = FakeCalls(tree)
        a = Agent(Host(tree, calls=calls), None, state_dir=tmp_path / f"s{size}",
                  run_dir=tmp_path / f"r{size}")  # fmt: skip
        a.caps.sched = a.caps.affinity = True
        counts = [a.pass_once().counts]
        gone = [k for k in a.journal.recorded() if k.startswith(f"task/{RANK + 5}@")]
        shutil.rmtree(tree / "proc" / str(RANK) / "task" / str(RANK + 5))
        a.policy_path = str(INFERENCE)
        a.reload()
        counts += [a.pass_once("reload").counts, a.pass_once("drift").counts]
        records = sorted(a.journal.recorded())
        a.journal.close()
        a.status.close()
        writes: dict[int, list] = {}
        for call, tid, value in calls.writes:
            writes.setdefault(tid, []).append((call, value))
        return counts, writes, records, _proc_files(tree), gone

    whole = passes(1_000_000)
    counts, _, records, _, gone = whole
    assert counts[1].get("restored") and counts[1].get("applied"), counts  # given back, written
    assert gone and not set(gone) & set(records)  # the exited thread's records closed
    assert not {k: n for k, n in counts[2].items() if k in ("applied", "restored")}, counts
    assert passes(piece) == whole


def test_a_failed_read_is_not_an_exit_no_original_is_lost(agent, monkeypatch):
    """Issue 44.2a: with the agent's file descriptors exhausted, every /proc open fails with
    EMFILE; the scan then misses the rank's threads. Neither the full pass nor a restore may
    take that for an exit: their records stay (reported), and once reads work again the
    restore gives every file back byte for byte."""
    agent.pass_once()
    mine = [k for k in agent.journal.recorded() if k.startswith(f"task/{RANK}@")]
    assert mine
    real_read = Host.read

    def emfile(self, rel):
        if rel.startswith(f"proc/{RANK}/"):
            raise HostError(errno.EMFILE, rel, "Too many open files")
        return real_read(self, rel)

    monkeypatch.setattr(Host, "read", emfile)
    report = agent.pass_once("drift")
    assert RANK not in {t.tid for t in agent.cache.tasks.values()}  # the scan missed it
    kept = [r for r in report.results if r.key in mine]
    assert kept and {r.outcome for r in kept} == {"error"}, kept
    assert set(mine) <= set(agent.journal.recorded())
    restored = restore(agent.host, agent.journal)  # a stop while reads still fail
    assert {r.outcome for r in restored.results if r.key in mine} == {"error"}
    assert set(mine) <= set(agent.journal.recorded())
    monkeypatch.setattr(Host, "read", real_read)
    restore(agent.host, agent.journal)
    assert _proc_files(agent.tree) == agent.before
    assert len(agent.journal) == 0


def _new_rank(tree: Path, pid: int, like: int) -> list[int]:
    """Start process ``pid`` in the tree: a copy of rank ``like`` as the fixture had it (before
    hostd), in a session of its own; returns its thread ids."""
    src, dst = FIXTURE / "proc" / str(like), tree / "proc" / str(pid)
    shutil.copytree(src, dst, symlinks=True)
    tids = []
    for task in sorted((dst / "task").iterdir()):
        tid = pid + int(task.name) - like
        task = task.rename(task.parent / str(tid))
        tids.append(tid)
        for path in (task / "stat", *([dst / "stat"] if tid == pid else [])):
            comm_end = path.read_text().rindex(")")
            text = path.read_text()
            rest = text[comm_end + 2 :].split(" ")
            rest[2] = rest[3] = str(pid)  # its process group and session
            path.write_text(f"{tid} {text[text.index('(') : comm_end + 1]} " + " ".join(rest))
        status = (task / "status").read_text()
        status = status.replace(f"Tgid:\t{like}", f"Tgid:\t{pid}")
        (task / "status").write_text(status.replace(f"Pid:\t{task.name}", f"Pid:\t{tid}"))
    return tids


def test_an_event_burst_places_new_threads_and_forgets_exits(agent):
    agent.pass_once()
    trainer = agent.plan.layer("trainer")
    writes = len(agent.calls.writes)
    new = _new_rank(agent.tree, 4300, like=RANK)  # a third rank, its 12 threads
    sent = time.monotonic_ns()
    events = [Event("fork", 4300, 4300, 4000, "", sent)]
    events += [Event("fork", t, 4300, 4300, "", sent) for t in new[1:]]
    report = agent.event_pass(events)
    # each new thread placed: how long after its event (the kernel's stamp), in the histogram
    lag = agent.event_lag.doc()
    assert lag["count"] == len(new) and lag["buckets"][-1] <= lag["count"]
    assert 0 < lag["sum"] < 60 * len(new)
    placed = {tid for kind, tid, _ in agent.calls.writes[writes:] if kind == "affinity"}
    assert placed == set(new), placed ^ set(new)
    # As the rank it copies (its GPU's node), not as the launcher it was forked from.
    assert agent.calls.get_affinity(new[0]) == agent.calls.get_affinity(RANK)
    assert agent.calls.get_affinity(new[0]) != agent.calls.get_affinity(4000)
    assert report.counts.get("applied", 0) >= len(new)
    assert agent.counters["events"] == len(events)
    assert agent.inc.layer_counts["trainer"] == sum(
        1 for c in agent.inc.classified.values() if c.layer == "trainer"
    )
    # trainer's share changed: its CPUs planned again at once, not by a full pass
    assert agent.counters["relayers"] == 1 and agent.counters["full_passes"] == 1
    assert agent.plan.layer("trainer").wanted > trainer.wanted
    assert agent.plan.layer("trainer").cpus > trainer.cpus  # it keeps the CPUs it had
    while agent.inc.redo_left:
        agent.redo(64)
    again = agent.pass_once()  # a full pass agrees: nothing left to write
    assert agent.plan.layer("trainer").cpus > trainer.cpus
    assert not again.counts.get("applied"), again.counts
    # It ends: forgotten at once, and its journal records closed once no event waits.
    shutil.rmtree(agent.tree / "proc" / "4300")
    agent.event_pass([Event("exit", tid, 4300) for tid in new])
    assert agent.inc.shrink_due is not None  # it gives them back, later
    assert {tid for tid, _ in agent.exited} == set(new)
    assert [k for k in agent.journal.recorded() if k.startswith("task/4300@")]
    agent.close_exited(5)
    assert len(agent.exited) == len(new) - 5
    agent.close_exited()
    assert not agent.exited
    for tid in new:
        assert tid not in agent.inc.classified
        assert not [k for k in agent.journal.recorded() if k.startswith(f"task/{tid}@")]
    assert any(k.startswith(f"task/{RANK}@") for k in agent.journal.recorded())
    # Given back: the trainer's CPUs shrink without a full pass, the pool's threads follow, and
    # the cpufreq settings of the CPUs it gave back are restored; a full pass then agrees.
    grown = agent.plan.layer("trainer").cpus
    agent.relayer("shrink")
    assert agent.plan.layer("trainer").cpus < grown and agent.counters["full_passes"] == 2
    freq = {k for k in agent.journal.recorded() if k.startswith("cpu/")}
    while agent.inc.redo_left:
        agent.redo(64)
    assert {k for k in agent.journal.recorded() if k.startswith("cpu/")} < freq
    again = agent.pass_once()
    assert agent.plan.layer("trainer").cpus < grown
    assert not {k: n for k, n in again.counts.items() if k in ("applied", "restored")}


def test_a_burst_is_read_newest_first_and_the_rest_follows(agent, monkeypatch):
    """More threads named than one pass reads (``READ_CHUNK``): the newest first, but a
    quarter of a pass for those named long ago (``OVERDUE_S``); the others wait in the backlog
    for the next passes; one that exits meanwhile is never read."""
    monkeypatch.setattr(incremental, "READ_CHUNK", 4)
    agent.pass_once()
    new = _new_rank(agent.tree, 4300, like=RANK)  # 12 threads, oldest first
    sent = time.monotonic_ns()
    events = [Event("fork", 4300, 4300, 4000, "", sent)]
    events += [Event("fork", t, 4300, 4300, "", sent) for t in new[1:]]

    def placed() -> set[int]:
        return {tid for kind, tid, _ in agent.calls.writes if kind == "affinity"} & set(new)

    agent.event_pass(events)
    assert placed() == set(new[-4:])  # the newest four; none overdue
    assert list(agent.inc.backlog) == new[:-4]
    monkeypatch.setattr(incremental, "OVERDUE_S", 0.0)  # now all of them are
    agent.event_pass([])
    assert placed() == {new[0], *new[-7:]}  # a quarter of the pass for the oldest
    assert list(agent.inc.backlog) == new[1:-7]
    shutil.rmtree(agent.tree / "proc" / "4300" / "task" / str(new[1]))  # the next oldest exits
    agent.event_pass([Event("exit", new[1], 4300)])
    assert placed() == set(new) - {new[1]}  # the exited one was never read
    assert not agent.inc.backlog
    # Each placed one's lag from its fork event, those that waited in the backlog too.
    assert agent.event_lag.doc()["count"] == len(new) - 1


def _part(agent, kind):
    """The agent's part of this class (``parts.ORDER``)."""
    (part,) = [p for p in agent.parts if isinstance(p, kind)]
    return part


class _Connector:
    """A thread-event source that is ready at once and hands out what it was given."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.muted: list[bool] = []
        self._r, self._w = os.pipe()
        os.write(self._w, b"x")

    def mute_renames(self, mute: bool) -> bool:
        self.muted.append(mute)
        return True

    def fileno(self) -> int:
        return self._r

    def read(self, limit: int) -> list:
        out, self.events = self.events[:limit], self.events[limit:]
        return out

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


def test_an_overflow_means_a_full_pass(agent):
    agent.pass_once()
    agent.last_full -= loop.OVERFLOW_GAP_S  # the last full pass, long enough ago
    passes, full = agent.passes, agent.counters["full_passes"]
    agent.sources.connector = _Connector([Event("fork", 4300, RANK, RANK), Overflow()])
    agent.sources.kind = "events"
    loop.step(agent)
    assert agent.counters["overflows"] == 1
    assert agent.counters["full_passes"] == full + 1
    assert agent.passes == passes + 1
    assert agent.counters["event_passes"] == 0  # the batch with the loss was not used
    agent.sources.close()


def test_overflows_again_and_again_make_a_full_pass_at_most_every_few_seconds(agent):
    """Issue 44.10: one thread renaming itself in a loop overflowed the event buffer four
    times a second, each a full pass (0.7-0.9 s at 100,000 threads): the agent at 80 % of a CPU.
    A loss soon after a full pass makes the next one due at most ``OVERFLOW_GAP_S`` after the
    last; the events that did arrive are used meanwhile. A read that is mostly one thread's
    renames mutes rename events (``COMM_MUTE_S``), and the full pass after it unmutes them."""
    agent.pass_once()
    agent.sources.kind = "events"
    storm = [Event("comm", RANK + 1, RANK, 0, f"x{i}") for i in range(200)]
    storm += [Event("fork", RANK + 1, RANK, RANK), Overflow()]
    agent.sources.connector = conn = _Connector(storm)
    full = agent.counters["full_passes"]
    loop.step(agent)
    assert agent.counters["overflows"] == 1 and agent.counters["full_passes"] == full
    assert agent.counters["event_passes"] == 1  # what arrived is used
    assert agent.overflow_due == pytest.approx(agent.last_full + loop.OVERFLOW_GAP_S)
    assert conn.muted == [True] and agent.counters["rename_storms"] == 1
    assert loop.next_full(agent) == (agent.overflow_due, "overflow")
    agent.renames_muted = agent.overflow_due = time.monotonic() - 1  # both due now
    loop.step(agent)
    assert agent.counters["full_passes"] == full + 1
    assert conn.muted == [True, False] and agent.renames_muted is None
    assert agent.overflow_due is None
    agent.sources.close()


def test_a_redo_chunks_originals_are_recorded_before_its_writes_and_never_synced(
    agent, monkeypatch
):
    """A re-layer's redo writes the pool's threads a few at a time: their originals are in the
    journal's file before the writes, and no fsync holds events up (a thread's record needs
    only the page cache); a restore gives them back."""
    from hostd.journal import Journal
    from tests.unit.test_journal import Syncs

    agent.pass_once()
    touched = {k.split("@")[0] for k in agent.journal.recorded()}
    item = next(
        c for c in agent.inc.classified.values()
        if c.layer == "rest" and f"task/{c.task.tid}" not in touched
    )  # fmt: skip
    tid, key = item.task.tid, f"task/{item.task.tid}@{item.task.start_time}/nice"
    syncs = Syncs(monkeypatch)
    writes = len(agent.calls.writes)
    agent.apply_threads({key: 7}, [item], fresh=False)
    assert agent.calls.writes[writes:] == [("nice", tid, 7)] and syncs.file == 0
    orig = agent.journal.original(key)
    assert orig != 7 and Journal(agent.journal.dir, agent.journal.boot_id).original(key) == orig
    restore(agent.host, agent.journal)
    assert ("nice", tid, orig) in agent.calls.writes[writes + 1 :]


def test_the_agents_own_threads_keep_to_the_pool_and_get_their_cpus_back(agent, monkeypatch):
    """hostd's threads run on the pool's CPUs (of those they started with), never on a layer's
    own; each change of the pool moves them, and switching off, observe mode and leaving give
    them back what they had."""
    me, own = os.getpid(), frozenset({0, 1, 12, 13})  # 12, 13: the trainer's own CPUs
    calls: list[tuple[int, frozenset[int]]] = []

    class Mine:
        def get_affinity(self, tid: int) -> frozenset[int]:
            assert tid == me
            return own

        def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
            calls.append((tid, cpus))

    _with_own_threads(agent, monkeypatch, Mine())
    pool = agent.plan.pool
    assert agent.plan.layer("trainer").cpus - pool >= {12, 13} and pool & own == {0, 1}
    loop.keep_to_pool(agent)
    assert calls == [(7001, {0, 1}), (me, {0, 1})]
    loop.keep_to_pool(agent)  # the same pool: nothing to do
    assert len(calls) == 2
    agent.state.mode_override = "observe"  # the layers hold no CPUs of their own: back
    loop.keep_to_pool(agent)
    assert calls[2:] == [(7001, own), (me, own)]
    agent.state.mode_override = None
    loop.keep_to_pool(agent)
    loop.keep_to_pool(agent, leaving=True)
    assert calls[4:] == [(7001, pool & own), (me, pool & own), (7001, own), (me, own)]
    agent.own_cpus = agent.own_now = pool  # started on the pool's CPUs: nothing ever to move
    agent.own_pool = None
    loop.keep_to_pool(agent)
    assert len(calls) == 8


def test_a_refused_move_of_the_agents_threads_is_reported_and_all_are_given_back(
    agent, monkeypatch, caplog
):
    """A container's limits refuse one thread's move after another moved: logged, never
    raised, and leaving gives every thread its CPUs back, the one that moved too."""
    from hostd.host.errors import HostError

    me, own = os.getpid(), frozenset({0, 1, 12, 13})
    calls: list[tuple[int, frozenset[int]]] = []

    class Refusing:
        def get_affinity(self, tid: int) -> frozenset[int]:
            return own

        def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
            if tid == me and cpus != own:
                raise HostError(22, f"task/{tid}/affinity", "Invalid argument")
            calls.append((tid, cpus))

    _with_own_threads(agent, monkeypatch, Refusing())
    with caplog.at_level("INFO", logger="hostd"):
        loop.keep_to_pool(agent)
    assert calls == [(7001, {0, 1})] and "agent cpus=0-1 refused" in caplog.text
    loop.keep_to_pool(agent, leaving=True)
    assert calls[1:] == [(7001, own), (me, own)]


def _with_own_threads(agent, monkeypatch, calls) -> None:
    """A full pass, then this process seen with two threads (7001 and itself) whose affinity
    ``calls`` gets and sets."""
    me, real_listdir = os.getpid(), agent.host.listdir
    monkeypatch.setattr(
        agent.host, "listdir",
        lambda rel: ["7001", str(me)] if rel == f"proc/{me}/task" else real_listdir(rel),
    )  # fmt: skip
    agent.pass_once()
    monkeypatch.setattr(agent.host, "threads", lambda: calls)


def _rename(tree: Path, pid: int, tid: int, comm: str) -> None:
    path = tree / "proc" / str(pid) / "task" / str(tid) / "stat"
    text = path.read_text()
    path.write_text(f"{text[: text.index('(') + 1]}{comm}{text[text.rindex(')') :]}")


@pytest.mark.parametrize("before_scan", [True, False], ids=["read-by-the-full-pass", "unread"])
def test_a_new_thread_skips_the_giveback_lookup_only_when_no_full_pass_read_it(agent, before_scan):
    """A thread's first event pass after its fork event looks up nothing to give back (in a
    storm, most threads), unless a full pass read it in between: its fork event came late, and
    that pass journaled knobs the thread, renamed since, no longer wants."""
    agent.pass_once()
    tid = RANK + 1
    start = agent.cache.tasks[tid].start_time
    # as a layer that set its nice would have journaled it (the fixture's policy sets none)
    agent.journal.record([(f"task/{tid}@{start}/nice", 0)])
    held = {k for k in agent.journal.recorded() if k.startswith(f"task/{tid}@")}
    assert len(held) == 2  # and its affinity, placed by the full pass
    _rename(agent.tree, RANK, tid, "bash")  # now in a layer that sets no nice
    stamp = agent.scanned_ns - 1 if before_scan else time.monotonic_ns()
    if not before_scan:  # as if the full pass had not read it (its fork came after)
        agent.scanned_ns = stamp - 1
    agent.event_pass([Event("fork", tid, RANK, RANK, "", stamp)])
    left = {k for k in agent.journal.recorded() if k.startswith(f"task/{tid}@")}
    if before_scan:
        assert left == held - {f"task/{tid}@{start}/nice"}  # not wanted now: given back
    else:
        assert left == held  # (a thread no full pass read has nothing journaled)


def test_the_records_of_exited_threads_are_closed_when_no_event_waits(agent, monkeypatch):
    """A storm's exits leave its new threads the CPU: their journal records are closed a chunk
    a step once no event waits, or when too many wait to be closed."""
    agent.pass_once()
    rank = [t for t in agent.cache.tasks.values() if t.pid == RANK]
    shutil.rmtree(agent.tree / "proc" / str(RANK))
    closed = {f"task/{t.tid}@" for t in rank}
    assert [k for k in agent.journal.recorded() if k.partition("@")[0] + "@" in closed]
    agent.event_pass([Event("exit", t.tid, RANK) for t in rank])
    assert len(agent.exited) == len(rank) == 12
    agent.sources.connector = _Connector([])
    agent.sources.kind = "events"
    monkeypatch.setattr(parts, "CLOSE_CHUNK", 5)
    busy = [True]
    monkeypatch.setattr(agent.sources, "events_waiting", lambda: busy[0])
    loop.step(agent)
    assert len(agent.exited) == 12  # events wait: not now
    monkeypatch.setattr(parts, "CLOSE_HOLD", 10)
    loop.step(agent)
    assert len(agent.exited) == 7  # too many wait: a chunk
    busy[0] = False
    loop.step(agent)
    loop.step(agent)
    assert not agent.exited
    assert not [k for k in agent.journal.recorded() if k.partition("@")[0] + "@" in closed]
    agent.sources.close()


def test_cpuset_joins_wait_for_a_moment_without_events(agent, monkeypatch):
    """A cpuset join takes the cgroup core's thread-group lock for writing: it waits for every
    fork and exit in flight on the host, and holds up every new one. A join that is due waits
    until no event came for ``JOIN_QUIET_S`` (made between the events of a storm of short
    threads, joins held the workload's forks and exits for seconds)."""
    agent.pass_once()
    joined, joins, state = [], _part(agent, parts.Joins), agent.state
    monkeypatch.setattr(joins, "join", lambda _: joined.append(agent.inc.pending.popitem()))
    monkeypatch.setattr(agent.sources, "events_waiting", lambda: False)  # none between steps
    agent.inc.pending[(4300, 1)] = ("/hostd/trainer", None, time.monotonic() - 1.0)  # due
    agent.sources.kind = "events"
    agent.sources.connector = _Connector([Event("fork", 4300, RANK, RANK)])
    state.join_quiet = 3600.0  # (a quiet no slow step of a loaded test machine outlasts)
    loop.step(agent)  # an event came: the join waits
    assert agent.counters["event_passes"] == 1
    assert not joined and joins.wake() == state.last_event + state.join_quiet
    agent.sources.connector.close()
    agent.sources.connector = None  # no more events: the loop wakes for the join, and makes it
    state.last_event -= state.join_quiet  # (that long ago)
    loop.step(agent)
    assert [key for key, _ in joined] == [(4300, 1)]
    assert joins.wake() is None


def test_a_slow_cpuset_join_makes_the_next_wait_for_a_longer_quiet(agent, monkeypatch, caplog):
    """A storm's creators pause for longer than ``JOIN_QUIET_S`` when the CPU they wait for is
    crowded; a join made in such a pause waited up to a second for the threads in flight, and
    every fork and exit on the host waited for it. A join slower than ``JOIN_SLOW_S`` makes the
    next wait for a second without events (4 times longer at each slow one, at most a minute),
    and each quick one halves that again."""
    agent.pass_once()
    joined, joins, state = [], _part(agent, parts.Joins), agent.state
    monkeypatch.setattr(joins, "join", lambda n: joined.append(agent.inc.pending.popitem()))
    monkeypatch.setattr(agent.sources, "events_waiting", lambda: False)
    monkeypatch.setattr(parts, "JOIN_SLOW_S", -1.0)  # every join is slow
    due = time.monotonic() - 2.0
    agent.inc.pending[(4300, 1)] = ("/hostd/trainer", None, due)
    with caplog.at_level(logging.INFO, logger="hostd"):
        loop.step(agent)  # no event yet: made, and slow
    assert [key for key, _ in joined] == [(4300, 1)]
    assert state.join_quiet == parts.JOIN_BACKOFF_S and agent.counters["slow_joins"] == 1
    assert "the next waits for 1 s without events" in caplog.text
    agent.inc.pending[(4301, 1)] = ("/hostd/trainer", None, due)
    agent.sources.kind = "events"
    agent.sources.connector = _Connector([Event("fork", 4300, RANK, RANK)])
    loop.step(agent)  # an event: the next join waits a second from it, not 20 ms
    assert len(joined) == 1
    assert joins.wake() == state.last_event + parts.JOIN_BACKOFF_S
    agent.sources.connector.close()
    agent.sources.connector = None
    monkeypatch.setattr(parts, "JOIN_SLOW_S", 1e9)  # quick from now on
    state.last_event -= parts.JOIN_BACKOFF_S  # a second went by without events
    loop.step(agent)
    assert [key for key, _ in joined] == [(4300, 1), (4301, 1)]
    assert state.join_quiet == parts.JOIN_BACKOFF_S / 2


def test_slow_joins_back_off_up_to_a_minute_until_quick_ones_or_a_full_pass(agent):
    seen, joins, state = [], _part(agent, parts.Joins), agent.state
    for took in (0.1, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.001):
        joins.backoff(took)
        seen.append(state.join_quiet)
    assert seen == [1.0, 4.0, 16.0, 60.0, 60.0, 30.0, 15.0, 7.5]
    for _ in range(20):
        joins.backoff(0.001)
    assert state.join_quiet == parts.JOIN_QUIET_S
    joins.backoff(0.1)
    loop.full(agent, "drift")  # a full pass joins all that waited: the backoff ends with it
    assert state.join_quiet == parts.JOIN_QUIET_S


@pytest.mark.parametrize(
    ("soft", "hard", "want", "warns"),
    [(1024, 524288, 65536, False), (512, 4096, 4096, False), (256, 256, 256, True)],
)
def test_the_agent_raises_its_file_limit_and_warns_below_its_need(
    monkeypatch, caplog, soft, hard, want, warns
):
    """Issue 44.2: the agent's soft limit of open files goes up to what it wants (65,536) or its
    hard limit; below 1,024 it says so."""
    limits = [(soft, hard)]
    monkeypatch.setattr(loop.resource, "getrlimit", lambda _: limits[-1])
    monkeypatch.setattr(loop.resource, "setrlimit", lambda _, value: limits.append(value))
    with caplog.at_level(logging.INFO, logger="hostd"):
        assert loop.own_files() == want
    assert limits[-1] == (want, hard)
    assert any(r.levelno == logging.WARNING for r in caplog.records) == warns


def test_the_first_run_says_what_it_waits_for_where_no_job_runs(agent):
    """A host without a job: one line says what the agent watches for, what it does when a job
    appears, and `hostd demo`; where the job runs (the fixture's torchrun), no such line."""
    agent.pass_once()
    assert loop.first_run_hint(agent) is None  # the fixture's job: its own lines say it
    agent.inc.layer_counts.clear()  # as on a host without a job
    line = loop.first_run_hint(agent)
    assert line is not None and "\n" not in line
    assert "no job here yet" in line and "trainer" in line and "`hostd demo`" in line
    assert ("gives" in line) == (agent.mode == "enforce")
    agent.state.mode_override = "observe"
    observed = loop.first_run_hint(agent)
    assert observed is not None and "would give" in observed
    assert "(observe mode: it changes nothing)" in observed


def test_the_agent_raises_its_priority_only_while_a_storm_waits(agent, monkeypatch):
    """At rest the agent keeps the nice it started with (its wake-ups must not preempt a rank
    mid-step); a storm raises it to [agent] nice until no backlog has waited for CALM_AFTER."""
    set_to: list[int] = []
    monkeypatch.setattr(loop, "own_priority", lambda _agent, nice: set_to.append(nice))
    agent.calm_nice, nice = 0, agent.policy.agent_nice
    assert nice == -10
    loop.pace(agent, False, 100.0)
    assert set_to == [] and not agent.raised  # at rest: nothing to change
    loop.pace(agent, True, 100.0)
    loop.pace(agent, True, 100.5)  # still busy: no second write
    assert set_to == [nice] and agent.raised
    loop.pace(agent, False, 100.5 + loop.CALM_AFTER - 0.1)
    assert set_to == [nice]  # calm for less than CALM_AFTER: still raised
    loop.pace(agent, False, 100.5 + loop.CALM_AFTER)
    assert set_to == [nice, 0] and not agent.raised
    loop.pace(agent, True, 200.0)
    assert set_to == [nice, 0, nice] and agent.counters["priority_raised"] == 2
    agent.raised, agent.calm_nice = False, -15  # started below [agent] nice: never raised above
    loop.pace(agent, True, 300.0)
    assert set_to == [nice, 0, nice]


def test_a_parent_is_not_busy_with_the_time_of_a_child_it_reaps_that_hostd_saw(agent, monkeypatch):
    """A launcher that reaps its ranks gets their CPU time as its own (proc(5): cutime): that
    time was theirs, counted where they ran (a rank's not at all), so the launcher is not busy
    for it (it was demoted at the end of a job for "18.70 CPUs"); a child hostd never saw (a
    compiler that lived less than a tick) still counts for its parent."""
    from hostd.agent.sampling import CLK_TCK

    agent.pass_once()
    sampler, procs = agent.watcher.sampler, agent.cache.procs
    launcher = procs[RANK].ppid
    assert launcher in procs
    cpu = {pid: ("S", 0, 0) for pid in procs}
    now = [10_000]
    monkeypatch.setattr(agent.host, "process_cpu", lambda pid: cpu.get(pid))
    monkeypatch.setattr(agent.host, "ticks_now", lambda: now[0])

    def tick(**ran: int) -> dict[int, float]:
        now[0] += CLK_TCK  # a second
        for pid, ticks in ((RANK, ran.get("rank", 0)), (launcher, 0)):
            if pid in cpu:
                state, own, reaped = cpu[pid]
                cpu[pid] = (
                    state,
                    own + ticks,
                    reaped + (ran.get("reaped", 0) if pid == launcher else 0),
                )
        sampler.sample(set())
        return sampler.shares

    sampler.sample(set())  # the first look: nothing to compare with
    assert tick(rank=2 * CLK_TCK).get(RANK) == 2.0  # the rank ran on 2 CPUs
    del procs[RANK], cpu[RANK]  # it exits; its parent has not reaped it yet
    assert launcher not in tick()
    assert launcher not in tick(reaped=3 * CLK_TCK)  # reaped now: the rank's time, not its
    assert tick(reaped=CLK_TCK // 2).get(launcher) == 0.5  # a child it never showed: its


def test_the_agent_builds_its_parts_once_in_their_order(agent):
    """Each periodic part is built once, with only what it needs, in ``parts.ORDER``: the loop
    runs them in that order after the event pass."""
    assert tuple(type(part) for part in agent.parts) == parts.ORDER
    assert not any(isinstance(v, type(agent)) for p in agent.parts for v in vars(p).values())


def test_a_job_that_comes_is_watched_at_once_from_the_cpu_read_while_idle(agent, monkeypatch):
    """Issue 43: while no job runs the watch reads each process's CPU time every ``IDLE_S``
    (no thread's); the job's first protected thread makes it tick at once, and that tick
    already knows what each busy session used since the idle read: a busy container is demoted
    when the job comes, not a tick later."""
    from hostd.agent import watch as watch_mod
    from hostd.agent.sampling import CLK_TCK

    agent.pass_once()
    watcher, procs = agent.watcher, agent.cache.procs
    counted = watcher.watch.counted
    busy = next(
        pid
        for pid, proc in procs.items()
        if not proc.is_kthread
        and (item := agent.inc.classified.get(pid)) is not None
        and item.layer in counted
    )
    ticks = [10_000]
    cpu = {pid: ("S", 0, 0) for pid in procs}
    monkeypatch.setattr(agent.host, "process_cpu", lambda pid: cpu.get(pid))
    monkeypatch.setattr(agent.host, "ticks_now", lambda: ticks[0])
    seen: list[dict] = []
    real_update = watcher.watch.update

    def update(now, samples, **kw):
        seen.append(dict(kw["process_demand"] or {}))
        return real_update(now, samples, **kw)

    monkeypatch.setattr(watcher.watch, "update", update)
    counts = dict(agent.inc.layer_counts)
    agent.inc.layer_counts.clear()  # no job on the host
    watcher.run_due(100.0)
    assert not watcher.starting() and not watcher.was_active and seen == []
    assert watcher.sampler.cpu_ticks == ticks[0]  # each process's CPU time, read while idle
    watcher.run_due(100.0 + watch_mod.IDLE_S / 2)  # a tick, no read yet
    assert watcher.sampler.cpu_ticks == ticks[0]
    ticks[0] += 2 * CLK_TCK  # two seconds later: the busy session ran on 2 CPUs meanwhile
    state, own, reaped = cpu[busy]
    cpu[busy] = (state, own + 4 * CLK_TCK, reaped)
    agent.inc.layer_counts.update(counts)  # the job's ranks came
    assert watcher.starting() and watcher.next_due() <= 0.0  # due now, not in a second
    watcher.run_due(101.0)  # before its interval's tick
    assert seen and seen[0].get(procs[busy].session) == pytest.approx(2.0)
    assert watcher.was_active and not watcher.starting() and watcher.next_due() > 101.0
    # The rank's launcher (busy while its ranks start: it was demoted in that first tick) is
    # the job's: its session is kept (here it is also a service's: left out to see the reason).
    import hostd.preempt.kept as kept_mod

    monkeypatch.setattr(kept_mod, "why_place_kept", lambda where, keep: None)
    launcher = procs[RANK].ppid
    assert watcher.sampler.launchers.get(launcher) == "trainer"
    sessions = {procs[launcher].session: [launcher]}
    why = watcher.sampler.kept(procs[launcher].session, sessions)
    assert why is not None and "the job's launcher" in why


def test_the_watch_reads_the_processes_cpu_a_slice_a_step(agent, monkeypatch):
    """Issue 48: a process's stat sums all its threads (45 ms for every process at 100,000
    threads, an event waiting meanwhile): the watch reads them for about ``SLICE_S`` a step
    while events wait and is due again at once until all are read; each process's share is
    over its own span, from when it was read the last time to when it was read now."""
    import time as time_mod

    from hostd.agent import watch as watch_mod

    agent.pass_once()
    watcher, procs = agent.watcher, agent.cache.procs
    wanted = [p for p, proc in procs.items() if not proc.is_kthread and p not in agent.exclude]
    assert len(wanted) >= 3
    ticks = [10_000]
    reads: list[int] = []

    def process_cpu(pid):  # each read takes 0.6 of a slice, and a tick of the clock
        reads.append(pid)
        time_mod.sleep(watch_mod.SLICE_S * 0.6)
        ticks[0] += 1
        return ("S", 2 * ticks[0] if pid == wanted[0] else 0, 0)

    monkeypatch.setattr(agent.host, "process_cpu", process_cpu)
    monkeypatch.setattr(agent.host, "ticks_now", lambda: ticks[0])
    agent.inc.layer_counts.clear()  # no job: the idle read
    steps = 0
    while True:
        steps += 1
        watcher.run_due(100.0)
        if watcher.sampler.left is None:
            break
        assert 1 <= len(reads) < len(wanted) and watcher.next_due() <= 100.0  # due again now
        ticks[0] += 10  # the loop's event passes between two slices
    assert steps >= 2 and sorted(reads) == sorted(wanted)  # each once, over several steps
    assert watcher.next_due() > 100.0
    reads.clear()
    watcher.sampler.processes()  # a read in one piece (the tick's own sample)
    assert sorted(reads) == sorted(wanted)
    # wanted[0] used 2 ticks of CPU per tick of the clock between its two reads: 2 CPUs
    assert watcher.sampler.shares[wanted[0]] == pytest.approx(2.0)
    assert all(watcher.sampler.shares.get(p, 0.0) == 0.0 for p in wanted[1:])
    reads.clear()  # with no event waiting, the read goes past its slice: one piece
    assert watcher.sampler.read(watch_mod.SLICE_S, lambda: False)
    assert sorted(reads) == sorted(wanted)
    watcher.sampler.processes()


def test_a_redo_reads_no_thread_that_has_nothing_to_change(agent, monkeypatch):
    """Issue 48: after a grow and a shrink in a row most of the pool's threads are as the plan
    wants them (given back before their turn came): a redo's thread with nothing wanted and
    nothing journaled is not read again; one with a record, or a knob wanted, is."""
    agent.pass_once()
    recorded = {k.split("/")[1] for k in agent.journal.recorded() if k.startswith("task/")}
    items = list(agent.inc.classified.values())
    held = next(c for c in items if f"{c.task.tid}@{c.task.start_time}" in recorded)
    wanted, plain = [c for c in items if not any(r.startswith(f"{c.task.tid}@") for r in recorded)][
        :2
    ]
    read: list[int] = []
    real = agent.host.start_time
    monkeypatch.setattr(agent.host, "start_time", lambda tid, strict=False: read.append(tid)
                        or real(tid, strict))  # fmt: skip
    monkeypatch.setattr(agent.inc, "take_redo", lambda count: [held, wanted, plain])
    key = f"task/{wanted.task.tid}@{wanted.task.start_time}/nice"
    monkeypatch.setattr(agent.inc, "decide", lambda its, base: {key: 3})
    agent.redo(8)
    assert set(read) == {held.task.tid, wanted.task.tid}  # not plain.task.tid


def test_a_full_pass_looks_at_everything_kept_only_now_and_then(agent, monkeypatch):
    """Issue 48: what the last full passes kept stays frozen through the next one, whose
    collection looks at what it made (at 100k threads the whole heap's took 0.15-0.18 s); every
    ``WHOLE_COLLECTION_S`` a pass unfreezes it all first, so kept objects that became cyclic
    garbage are found."""
    import gc

    unfrozen: list[int] = []
    real = gc.unfreeze
    monkeypatch.setattr(gc, "unfreeze", lambda: unfrozen.append(1) or real())
    try:
        loop.full(agent, "start")
        assert len(unfrozen) == 1 and gc.get_freeze_count() > 0
        loop.full(agent, "drift")
        assert len(unfrozen) == 1  # what was kept stayed frozen
        agent.state.collected -= loop.WHOLE_COLLECTION_S
        loop.full(agent, "drift")
        assert len(unfrozen) == 2
    finally:
        real()

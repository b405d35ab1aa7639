"""The write-ahead journal: first original wins, durable lines, boot-id rules, torn lines."""

from __future__ import annotations

import errno
import json
import os
import threading
import time

import hostd.journal as journal_module
import hostd.journal.compaction as compaction_module
from hostd.journal import Journal


def test_first_original_is_never_overwritten(tmp_path):
    j = Journal(tmp_path, "boot-a", "sha")
    j.record([("irq/5/smp_affinity_list", "0-3"), ("task/10@99/nice", 0)])
    j.record([("irq/5/smp_affinity_list", "2"), ("task/10@99/nice", -5)])
    again = Journal(tmp_path, "boot-a")
    assert again.original("irq/5/smp_affinity_list") == "0-3"
    assert again.original("task/10@99/nice") == 0
    assert again.recorded() == ["irq/5/smp_affinity_list", "task/10@99/nice"]


def test_each_record_carries_boot_version_and_policy(tmp_path):
    j = Journal(tmp_path, "boot-a", "abc123")
    j.record([("cpu/0/scaling_governor", "powersave")])
    line = json.loads((tmp_path / "journal.jsonl").read_text().splitlines()[0])
    assert line["boot"] == "boot-a" and line["policy"] == "abc123"
    assert line["version"] and line["records"] == [["cpu/0/scaling_governor", "powersave"]]


def test_task_and_cgroup_records_of_an_earlier_boot_are_dropped_irqs_kept(tmp_path):
    Journal(tmp_path, "boot-a").record(
        [
            ("task/10@99/affinity", "0-1"),
            ("irq/7/smp_affinity_list", "0-1"),
            ("cgroup/cpuset/hostd", None),
        ]
    )
    after_reboot = Journal(tmp_path, "boot-b")
    assert after_reboot.recorded() == ["irq/7/smp_affinity_list"]
    assert after_reboot.dropped_old_boot == 2


def test_a_torn_last_line_is_ignored(tmp_path):
    j = Journal(tmp_path, "b")
    j.record([("irq/1/smp_affinity_list", "0")])
    with open(tmp_path / "journal.jsonl", "a") as fh:
        fh.write('{"key": "irq/2/smp_aff')  # the agent died mid-append
    assert Journal(tmp_path, "b").recorded() == ["irq/1/smp_affinity_list"]


def test_done_closes_records_and_compact_removes_the_file(tmp_path):
    j = Journal(tmp_path, "b")
    j.record([("irq/1/smp_affinity_list", "0"), ("irq/2/smp_affinity_list", "1")])
    j.done(["irq/1/smp_affinity_list"])
    assert Journal(tmp_path, "b").recorded() == ["irq/2/smp_affinity_list"]
    j.compact()
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 1 and "irq/2" in lines[0]
    j.done(["irq/2/smp_affinity_list"])
    j.compact()
    assert not (tmp_path / "journal.jsonl").exists()
    assert len(Journal(tmp_path, "b")) == 0


def test_a_closed_key_can_be_recorded_anew(tmp_path):
    j = Journal(tmp_path, "b")
    j.record([("task/1@2/nice", 0)])
    j.done(["task/1@2/nice"])
    j.record([("task/1@2/nice", 3)])
    assert Journal(tmp_path, "b").original("task/1@2/nice") == 3


def test_more_lines_than_one_written_chunk_all_survive_a_reload(tmp_path):
    # Lines are written a chunk at a time (4096): every chunk must reach the file, in order.
    j = Journal(tmp_path, "boot-a")
    originals = [(f"task/{tid}@7/affinity", "0-1") for tid in range(10_000)]
    j.record(originals)
    j.done([key for key, _ in originals[:5000]])
    j.close()
    again = Journal(tmp_path, "boot-a")
    assert again.recorded() == [key for key, _ in originals[5000:]]
    assert all(again.original(key) == "0-1" for key in again.recorded())


class HeldSync:
    """The journal's background fsync, held until ``release`` (or failing with ``error``)."""

    def __init__(self, monkeypatch, error: OSError | None = None) -> None:
        self.go = threading.Event()
        self.error = error
        real = compaction_module._sync_and_close

        def held(fd: int) -> None:
            self.go.wait(10)
            if self.error is not None:
                os.close(fd)
                raise self.error
            real(fd)

        monkeypatch.setattr(compaction_module, "_sync_and_close", held)

    def release(self) -> None:
        self.go.set()


class Syncs:
    """Counts the journal's fdatasync (of its file) and fsync (of its folder) calls."""

    def __init__(self, monkeypatch) -> None:
        self.file = self.dir = 0
        real_data, real_sync = os.fdatasync, os.fsync

        def fdatasync(fd: int) -> None:
            self.file += 1
            real_data(fd)

        def fsync(fd: int) -> None:
            self.dir += 1
            real_sync(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "fsync", fsync)


SESSION = {"sched": ["other", 0, False], "leader_start": 5}


def test_records_a_reboot_takes_away_are_not_synced_and_the_others_are(tmp_path, monkeypatch):
    """Thread, session and cgroup records need only the page cache (a reboot takes their knobs
    and the journal drops them after one); an append with an IRQ or cpufreq record is synced,
    and the first such append of a new file syncs its folder too."""
    syncs = Syncs(monkeypatch)
    j = Journal(tmp_path, "b")
    j.record([("task/10@99/nice", 0), ("task/10@99/affinity", "0-3")])
    j.record([("session/7@5/preempted", SESSION), ("cgroup/cpuset/hostd", None)])
    assert (syncs.file, syncs.dir) == (0, 0)
    # what another hostd reads after this one died (the same boot): all of it
    again = Journal(tmp_path, "b")
    assert again.recorded() == j.recorded() and len(again) == 4 and not again.damaged
    j.record([("task/11@99/nice", 0), ("irq/5/smp_affinity_list", "0-3")])
    assert (syncs.file, syncs.dir) == (1, 1)
    j.record([("cpu/0/scaling_governor", "powersave")])
    assert (syncs.file, syncs.dir) == (2, 1)  # the folder once per file
    j.done(j.recorded())
    j.compact()  # removes the file: the next one is new
    j.record([("irq/6/smp_affinity_list", "1")])
    assert syncs.file == 3 and syncs.dir == 3  # (the removal's, then the new file's)


def test_a_failed_sync_records_nothing_and_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    j = Journal(tmp_path, "b")
    j.record([("irq/1/smp_affinity_list", "0")])
    size = (tmp_path / "journal.jsonl").stat().st_size

    def failing(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    try:
        j.record([("task/10@99/nice", 0), ("irq/2/smp_affinity_list", "0")])
    except journal_module.JournalError as exc:
        assert "2 original(s) could not be recorded" in str(exc)
    else:
        raise AssertionError("a failed fsync recorded its originals")
    assert j.recorded() == ["irq/1/smp_affinity_list"]
    assert (tmp_path / "journal.jsonl").stat().st_size == size


def test_task_records_are_a_threads_open_keys_and_no_other_threads(tmp_path):
    from hostd.reconcile import same, task_records

    j = Journal(tmp_path, "b")
    j.record(
        [
            ("task/10@99/nice", 0),
            ("task/10@99/affinity", "0-1"),
            ("task/1@99/nice", 0),
            ("task/10@98/sched", ["other", 0, False]),
            ("irq/10/smp_affinity_list", "0"),
        ]
    )
    j.done(["task/10@99/nice"])
    assert task_records(j, [(10, 99)]) == ["task/10@99/affinity"]
    assert sorted(task_records(j, [(10, 98), (1, 99)])) == ["task/10@98/sched", "task/1@99/nice"]
    # A knob equals what is wanted; a None read from /proc (reset-on-fork) is "not known".
    assert same(["batch", 0, None], ["batch", 0, True]) and same(5, 5) and same("0-1", "0-1")
    assert not same(["batch", 0, None], ["idle", 0, True]) and not same([1], [1, 2])


def test_one_append_shares_lines_and_a_done_line_closes_many(tmp_path):
    from hostd.journal import PER_LINE

    j = Journal(tmp_path, "b", "p")
    keys = [f"task/{tid}@5/nice" for tid in range(310)]
    j.record([(k, 0, {"to": -5, "sid": 1, "tick": 2}) for k in keys])
    j.done(keys[:300])
    lines = [json.loads(t) for t in (tmp_path / "journal.jsonl").read_text().splitlines()]

    def sizes(n: int) -> list[int]:  # n records (or keys), PER_LINE a line
        return [min(PER_LINE, n - i) for i in range(0, n, PER_LINE)]

    assert [len(line.get("records", line.get("done", []))) for line in lines] == sizes(
        len(keys)
    ) + sizes(300)
    assert lines[0]["records"][0] == [keys[0], 0, {"to": -5, "sid": 1, "tick": 2}]
    again = Journal(tmp_path, "b")
    assert again.recorded() == keys[300:] and not again.damaged
    assert again.records[keys[-1]].inherit == {"to": -5, "sid": 1, "tick": 2}


def test_a_bad_record_in_a_shared_line_costs_only_itself(tmp_path):
    from hostd.journal import _summed

    line = _summed(
        {"records": [["task/1@2/nice", 0], ["task/3@4/nice", -40], "junk",
                     ["irq/5/smp_affinity_list", "1"]],
         "boot": "b", "version": "v", "policy": "p", "time": 1.5}
    )  # fmt: skip
    done = _summed({"done": ["irq/5/smp_affinity_list", "nothing/1/nice"]})
    (tmp_path / "journal.jsonl").write_text(line + "\n" + done + "\n")
    j = Journal(tmp_path, "b")
    assert j.recorded() == ["task/1@2/nice"]  # irq/5 closed by the good key of the done line
    assert [n for n, _ in j.damaged] == [1, 1, 2]
    assert "task/3@4/nice" in j.damaged[0][1] + j.damaged[1][1]
    assert "nothing/1/nice" in j.damaged[2][1]


def test_compaction_keeps_each_records_stamps(tmp_path):
    Journal(tmp_path, "boot-a", "p1").record([("irq/7/smp_affinity_list", "0-1")])
    j = Journal(tmp_path, "boot-b", "p2")  # after a reboot, with another policy
    j.record([("task/10@99/nice", 0), ("irq/8/smp_affinity_list", "1")])
    j.done(["task/10@99/nice"])
    j.compact()
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 2  # one per (boot, version, policy, time)
    again = Journal(tmp_path, "boot-b")
    assert again.recorded() == ["irq/7/smp_affinity_list", "irq/8/smp_affinity_list"]
    assert [(r.boot, r.policy) for r in again.records.values()] == [
        ("boot-a", "p1"),
        ("boot-b", "p2"),
    ]


def test_a_journal_of_one_record_a_line_is_still_read(tmp_path):
    """The lines of a hostd before shared lines: one record, or one closed key, each."""
    from hostd.journal import _summed

    old = [
        {"key": "task/1@2/nice", "orig": 0, "boot": "b", "version": "v", "policy": "p", "time": 1,
         "inherit": {"to": 5, "sid": 1, "tick": 1}},
        {"key": "irq/5/smp_affinity_list", "orig": "0-1", "boot": "b", "version": "v",
         "policy": "p", "time": 1},
        {"key": "task/1@2/nice", "done": True},
    ]  # fmt: skip
    (tmp_path / "journal.jsonl").write_text("".join(_summed(e) + "\n" for e in old))
    j = Journal(tmp_path, "b")
    assert j.recorded() == ["irq/5/smp_affinity_list"] and not j.damaged


def _irqs(first: int, n: int) -> list[tuple[str, str]]:
    return [(f"irq/{i}/smp_affinity_list", str(i % 4)) for i in range(first, first + n)]


def _deferred(tmp_path) -> Journal:
    j = Journal(tmp_path, "b")
    j.defer_compaction = True  # as the agent's: compacted when it says so
    return j


def test_a_compaction_in_steps_keeps_what_is_appended_meanwhile(tmp_path):
    """The agent compacts a few milliseconds a step and handles events in between: a record
    closed, a record made and a torn line cut meanwhile are all in the compacted file."""
    j = _deferred(tmp_path)
    j.record(_irqs(0, 3000))
    j.done([k for k, _ in _irqs(0, 1600)])
    with open(tmp_path / "journal.jsonl", "a") as fh:
        fh.write('{"records": [["irq/9')  # a crash mid-append, before this agent
    j = _deferred(tmp_path)
    assert j.torn and j.compact_due
    assert j.compact(budget_s=0) is False and j.compacting  # one chunk, then it yields
    j.done([k for k, _ in _irqs(1600, 10)])  # open when it began: closed meanwhile
    j.record(_irqs(5000, 5))
    assert j.compact(budget_s=0) is False
    j.record([("task/10@99/nice", 0)])
    while not j.compact(budget_s=0):
        pass
    assert not j.compacting and not list(tmp_path.glob("*.tmp"))
    want = [k for k, _ in _irqs(1610, 1390) + _irqs(5000, 5)] + ["task/10@99/nice"]
    assert j.recorded() == want
    again = Journal(tmp_path, "b")
    assert again.recorded() == want and not again.damaged and not again.torn
    text = (tmp_path / "journal.jsonl").read_text()
    assert text.count('"done"') == 1  # only the done line appended meanwhile is left
    j.record(_irqs(6000, 1))  # appends go to the new file
    assert Journal(tmp_path, "b").recorded() == [*want, "irq/6000/smp_affinity_list"]


def test_a_restore_during_a_stepped_compaction_still_removes_the_file(tmp_path):
    """The agent stops mid-compaction: restore closes every record and compacts at once; the
    compaction under way, of records open when it began, must not leave them in a file
    (seen in CI: a clean stop left journal.jsonl with closed records)."""
    j = _deferred(tmp_path)
    j.record(_irqs(0, 3000))
    j.done([k for k, _ in _irqs(0, 1600)])
    assert j.compact(budget_s=0) is False and j.compacting
    assert j.compact(budget_s=0) is False  # records of the time it began written in part
    j.done(j.recorded())  # restore: every record closed
    j.compact()  # and compacted at once
    assert not j.compacting and not list(tmp_path.glob("*.tmp"))
    assert not (tmp_path / "journal.jsonl").exists()


def test_a_compaction_given_up_or_cut_by_a_crash_leaves_the_file_as_it_was(tmp_path):
    j = _deferred(tmp_path)
    j.record(_irqs(0, 2000))
    j.done([k for k, _ in _irqs(0, 1500)])
    before = (tmp_path / "journal.jsonl").read_bytes()
    assert j.compact(budget_s=0) is False
    # a crash now: the next agent reads the old file, the temp file is nobody's
    assert Journal(tmp_path, "b").recorded() == [k for k, _ in _irqs(1500, 500)]
    j.close()  # the agent stops mid-way
    assert not j.compacting and not list(tmp_path.glob("*.tmp"))
    assert (tmp_path / "journal.jsonl").read_bytes() == before
    j.record(_irqs(7000, 1))
    assert Journal(tmp_path, "b").recorded() == [k for k, _ in _irqs(1500, 500) + _irqs(7000, 1)]


def test_a_compaction_that_fails_at_its_end_keeps_the_old_file(tmp_path, monkeypatch):
    j = _deferred(tmp_path)
    j.record(_irqs(0, 2000))
    j.done([k for k, _ in _irqs(0, 1500)])
    assert j.compact(budget_s=0) is False
    j.record(_irqs(8000, 2))

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert j.compact() is True and not j.compacting
    assert "not compacted" in j.problem and not list(tmp_path.glob("*.tmp"))
    monkeypatch.undo()
    want = [k for k, _ in _irqs(1500, 500) + _irqs(8000, 2)]
    assert Journal(tmp_path, "b").recorded() == want
    j.record(_irqs(9000, 1))  # the old file, still appended to
    assert Journal(tmp_path, "b").recorded() == [*want, "irq/9000/smp_affinity_list"]


def test_records_made_while_a_compactions_fsync_runs_are_in_the_compacted_file(
    tmp_path, monkeypatch
):
    j = _deferred(tmp_path)
    j.record(_irqs(0, 2000))
    j.done([k for k, _ in _irqs(0, 1500)])
    assert j.compact(budget_s=0) is False  # begun
    sync = HeldSync(monkeypatch)
    for _ in range(100):
        j.compact(budget_s=0)
    assert j.compacting  # its background fsync is held
    j.record([("task/10@99/affinity", "0-3")])  # an event pass's original, meanwhile
    sync.release()
    while not j.compact(budget_s=0):
        time.sleep(0.001)
    want = [k for k, _ in _irqs(1500, 500)] + ["task/10@99/affinity"]
    assert j.recorded() == want and Journal(tmp_path, "b").recorded() == want


def test_a_compaction_that_cannot_wait_goes_in_steps_as_records_close(tmp_path, monkeypatch):
    """In a storm the agent finds no quiet moment to compact: past ten times its open records
    (or 100,000) of closed ones, closing more records compacts a step at a time (never all at
    once, with its fsyncs, in the middle of an event pass), until it ends."""

    def threads(first: int, n: int) -> list[tuple[str, int]]:  # (never fsynced themselves)
        return [(f"task/{t}@7/nice", 0) for t in range(first, first + n)]

    j = _deferred(tmp_path)
    j.record(threads(0, 200))
    syncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    t = 1000
    while not j.compacting:  # each record made and closed; due early, left to the agent
        assert t < 150_000
        j.record(threads(t, 1000))
        j.done([k for k, _ in threads(t, 1000)])
        t += 1000
    assert t > 100_000 and not syncs  # the first step only lists what to write
    steps = 0
    while j.compacting:
        j.record(threads(t, 1))
        j.done([k for k, _ in threads(t, 1)])
        t, steps = t + 1, steps + 1
    assert steps > 1 and syncs  # more than one step, and it did end, durably
    want = [k for k, _ in threads(0, 200)]
    assert j.recorded() == want and Journal(tmp_path, "b").recorded() == want
    assert j._done_lines <= steps  # only those closed while it went on (one each step)


def test_what_hostd_wrote_survives_a_reload_and_a_compaction_and_is_of_this_boot(tmp_path):
    """Issue 44.4: the values hostd was about to write (``Journal.record``'s ``wrote``), each
    remembered once, at most ``WROTE_MAX`` (then none: a restore writes the original as
    before), read back from the file, kept by a compaction, and only those of this boot."""
    from hostd.journal import WROTE_MAX

    nice, other, irq = "task/7@1/nice", "task/8@1/nice", "irq/5/smp_affinity_list"
    sched, twin = "task/7@1/sched", "task/9@1/sched"
    j = Journal(tmp_path, "b")
    j.record([(nice, 0), (other, 0), (irq, "0-3")], [(nice, 5)])  # (said with its original)
    j.record([(sched, ["other", 0, False]), (twin, ["other", 0, False])])
    j.record([], [(sched, ["idle", 0, False]), (twin, ["idle", 0, False])])
    j.record([], [(sched, ["fifo", 1, True])])
    j.record([], [(nice, 5), ("task/9@1/nice", 5)])  # (a knob with no record: nothing to say)
    j.record([], [(nice, 5), (nice, 10), (irq, "1")])
    for value in range(WROTE_MAX + 1):
        j.record([], [(other, value - 10)])
    want = {
        nice: (5, 10),
        other: (),
        irq: ("1",),
        sched: (["idle", 0, False], ["fifo", 1, True]),
        twin: (["idle", 0, False],),
    }
    assert {k: j.records[k].wrote for k in want} == want
    assert "task/9@1/nice" not in j.records
    assert {k: r.wrote for k, r in Journal(tmp_path, "b").records.items()} == want
    j.compact()
    assert {k: r.wrote for k, r in Journal(tmp_path, "b").records.items()} == want
    later = Journal(tmp_path, "c")  # another boot: its task records are dropped, and what
    assert later.records[irq].wrote is None  # hostd wrote to an IRQ then says nothing now


def test_base_affinities_are_the_journals_affinity_originals_looked_up_as_asked(tmp_path):
    from hostd.journal import base_affinities

    j = Journal(tmp_path, "boot-a", "sha")
    base = base_affinities(j)
    j.record([("task/10@99/nice", 0), ("irq/5/smp_affinity_list", "0-3")])
    assert not base and len(base) == 0 and base.get((10, 99)) is None  # no affinity record
    j.record([("task/10@99/affinity", "0-3"), ("task/11@99/affinity", "0-3")])
    j.record([("task/12@98/affinity", "1")])
    assert base and dict(base) == {
        (10, 99): frozenset(range(4)), (11, 99): frozenset(range(4)), (12, 98): frozenset({1})
    }  # fmt: skip
    assert base[(10, 99)] is base[(11, 99)]  # one set per text, not one per thread
    assert base.get((10, 98)) is None and (12, 98) in base  # the same tid, another thread
    j.done(["task/12@98/affinity"])
    assert base.get((12, 98)) is None and len(base) == 2  # it follows the journal

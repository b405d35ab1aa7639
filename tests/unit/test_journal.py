"""The write-ahead journal: first original wins, durable lines, boot-id rules, torn lines."""

from __future__ import annotations

import errno
import json
import os
import threading

from hypothesis import given
from hypothesis import strategies as st

import hostd.journal as journal_module
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
    assert line["version"] and line["orig"] == "powersave"


def test_task_records_of_an_earlier_boot_are_dropped_host_knobs_kept(tmp_path):
    Journal(tmp_path, "boot-a").record(
        [("task/10@99/affinity", "0-1"), ("irq/7/smp_affinity_list", "0-1")]
    )
    after_reboot = Journal(tmp_path, "boot-b")
    assert after_reboot.recorded() == ["irq/7/smp_affinity_list"]
    assert after_reboot.dropped_old_boot == 1


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
        real = journal_module._sync_and_close

        def held(fd: int) -> None:
            self.go.wait(10)
            if self.error is not None:
                os.close(fd)
                raise self.error
            real(fd)

        monkeypatch.setattr(journal_module, "_sync_and_close", held)

    def release(self) -> None:
        self.go.set()


def test_staged_originals_are_records_only_once_their_fsync_ended(tmp_path, monkeypatch):
    sync = HeldSync(monkeypatch)
    j = Journal(tmp_path, "b")
    j.record([("irq/1/smp_affinity_list", "0")])
    j.stage([("task/10@99/affinity", "0-3"), ("task/11@99/affinity", "0-3")])
    assert "task/10@99/affinity" not in j and not j.settled()  # its knob may not be written
    j.done(["irq/1/smp_affinity_list"])
    j.compact()  # would drop the staged lines: it waits
    assert "task/10@99/affinity" in (tmp_path / "journal.jsonl").read_text()
    sync.release()
    assert j.settled(wait=True)
    assert j.original("task/10@99/affinity") == "0-3" and "task/11@99/affinity" in j
    assert Journal(tmp_path, "b").recorded() == ["task/10@99/affinity", "task/11@99/affinity"]


def test_recording_a_staged_key_waits_for_its_fsync_and_keeps_the_first_original(
    tmp_path, monkeypatch
):
    sync = HeldSync(monkeypatch)
    j = Journal(tmp_path, "b")
    j.stage([("task/10@99/nice", 0)])
    threading.Timer(0.05, sync.release).start()
    j.record([("task/10@99/nice", 5), ("task/12@99/nice", 1)])  # an event pass's write
    assert j.original("task/10@99/nice") == 0 and j.original("task/12@99/nice") == 1
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 2 and not j.staged


def test_a_failed_background_fsync_records_nothing_and_says_why(tmp_path, monkeypatch):
    sync = HeldSync(monkeypatch, OSError(errno.EIO, "Input/output error"))
    j = Journal(tmp_path, "b")
    j.stage([("task/10@99/nice", 0)])
    sync.release()
    assert j.settled(wait=True)
    assert "task/10@99/nice" not in j and not j.staged
    assert "1 original(s) not made durable" in j.unsynced and j.problem == j.unsynced


def test_an_event_record_meanwhile_never_makes_staged_originals_records(tmp_path, monkeypatch):
    """A record of other keys while the staged fsync runs: its own fsync says nothing of the
    staged lines (the kernel reports a writeback error once per open file), so they stay out
    of the journal until their own fsync ends, and are dropped when it fails."""
    sync = HeldSync(monkeypatch, OSError(errno.EIO, "Input/output error"))
    j = Journal(tmp_path, "b")
    j.stage([("task/10@99/nice", 0)])
    j.record([("task/12@99/nice", 1)])  # an event pass's write, meanwhile
    assert "task/12@99/nice" in j and "task/10@99/nice" not in j
    sync.release()
    assert j.settled(wait=True) and "task/10@99/nice" not in j


def test_a_record_line_is_the_json_of_its_entry():
    """``Journal._line`` puts a line together in place (it runs three times per new thread);
    it must be the very text of the entry's JSON, so that every reader and checksum agrees."""
    from hostd.journal import Record, _summed

    records = [
        Record("task/12@34/affinity", "0-1", "boot-id", "0.1.0", "ab" * 32, 1.23456, None),
        Record("task/12@34/sched", ["batch", 0, False], "b", "0.1.0", None, 17e8 + 0.5,
               {"to": ["idle", 0, False], "sid": 3, "tick": 9}),
        Record("irq/5/smp_affinity_list", "ff", 'q"\\\u00e9', "0.1.0", "p", 3.0, None),
        Record("cpu/1/governor", None, "b", "v", "p", 1, None),
        Record("task/7@8/nice", -5, "b", "v", "p", float("nan"), {"to": 19, "sid": 0, "tick": 0}),
    ]  # fmt: skip
    for rec in records:
        entry = {
            "key": rec.key, "orig": rec.orig, "boot": rec.boot, "version": rec.version,
            "policy": rec.policy, "time": round(rec.time, 3),
        }  # fmt: skip
        if rec.inherit is not None:
            entry["inherit"] = rec.inherit
        assert Journal._line(rec) == _summed(entry)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    )
)
def test_a_value_is_written_as_the_json_encoder_writes_it(value):
    from hostd.journal import _COMPACT, _json

    assert _json(value) == _COMPACT.encode(value)


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

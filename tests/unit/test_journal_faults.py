"""The journal under faults: a failed append records nothing, and a damaged file loses only its
damaged lines, each reported with its number; journal content never chooses what is written."""

from __future__ import annotations

import errno
import json
import os
import random

import pytest

from hostd.journal import JOURNAL_NAME, Journal, JournalError

GOOD = [
    ("irq/5/smp_affinity_list", "0-3"),
    ("cpu/2/scaling_governor", "powersave"),
    ("task/10@99/nice", 0),
    ("task/10@99/sched", ["other", 0, False]),
    ("task/10@99/cpuset", "/system.slice/train.service"),
    ("cgroup/cpuset/hostd/trainer", None),
    ("irq/6/smp_affinity_list", "0-1"),
    ("task/11@99/affinity", "0-7"),
]


def _journal(tmp_path) -> list[bytes]:
    """GOOD, one record a line (one append each): damage to a line costs its one record."""
    j = Journal(tmp_path, "boot")
    for original in GOOD:
        j.record([original])
    return (tmp_path / JOURNAL_NAME).read_bytes().splitlines(keepends=True)


def _write(tmp_path, lines: list[bytes]) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join(lines))


def _line(entry: dict) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


# -- a failed append --------------------------------------------------------------------------
def test_a_failed_append_records_nothing_and_leaves_no_half_line(tmp_path, monkeypatch):
    j = Journal(tmp_path, "boot")
    j.record(GOOD[:2])
    size = (tmp_path / JOURNAL_NAME).stat().st_size
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills in the middle of the append
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(JournalError, match="No space left"):
        j.record(GOOD[2:])
    monkeypatch.setattr(os, "write", real_write)
    # Neither in memory (the caller must not write those knobs) nor on disk.
    assert j.recorded() == [k for k, _ in GOOD[:2]]
    assert (tmp_path / JOURNAL_NAME).stat().st_size == size
    j.record(GOOD[2:])  # space is back: the same records go in whole
    again = Journal(tmp_path, "boot")
    assert again.recorded() == [k for k, _ in GOOD] and not again.damaged and not again.torn


def test_done_and_compact_on_a_full_disk_report_instead_of_raising(tmp_path, monkeypatch):
    j = Journal(tmp_path, "boot")
    j.record(GOOD)

    def full(*_args, **_kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    j.done([GOOD[0][0]])
    assert "No space left" in j.problem
    monkeypatch.setattr(os, "fsync", full)
    j.compact()
    assert "not compacted" in j.problem
    monkeypatch.undo()
    # The file still holds every record: a later restore finds the knob already back.
    assert Journal(tmp_path, "boot").recorded() == [k for k, _ in GOOD]
    assert not list(tmp_path.glob("*.tmp"))


# -- damage -------------------------------------------------------------------------------------
def _bad_line(n: int, lines: list[bytes]) -> list[bytes]:
    return [*lines[:n], b"\xff\xfe not utf-8\n", *lines[n:]]


DAMAGE = {
    "a non-UTF-8 byte": (
        lambda ls: [ls[0], ls[1][:10] + b"\xff" + ls[1][11:], *ls[2:]],
        [2],
        ["cpu/2/scaling_governor"],
    ),
    "a record whose key is a list": (
        lambda ls: [*ls[:3], _line({"key": ["a"], "orig": 1}), *ls[3:]],
        [4],
    ),
    "a record whose key is a number": (
        lambda ls: [*ls[:3], _line({"key": 7, "orig": 1}), *ls[3:]],
        [4],
    ),
    "a non-numeric time": (
        lambda ls: [
            *ls[:1],
            _line({"key": "irq/9/smp_affinity_list", "orig": "0", "time": "noon"}),
            *ls[1:],
        ],
        [2],
    ),
    "a cpuset original that climbs out of the cgroup tree": (
        lambda ls: [
            *ls[:1],
            _line({"key": "task/12@99/cpuset", "orig": "/../../../etc/cron.d"}),
            *ls[1:],
        ],
        [2],
    ),
    "a cgroup key that is not hostd's": (
        lambda ls: [*ls[:1], _line({"key": "cgroup/cpuset/system.slice", "orig": None}), *ls[1:]],
        [2],
    ),
    "a nice value no thread can have": (
        lambda ls: [*ls[:1], _line({"key": "task/13@99/nice", "orig": -40}), *ls[1:]],
        [2],
    ),
    "an edited original (its checksum no longer matches)": (
        lambda ls: [ls[0].replace(b'"0-3"', b'"0-9"'), *ls[1:]],
        [1],
        ["irq/5/smp_affinity_list"],
    ),
    "a closing line edited to close another record": (
        lambda ls: [*ls, _summed_done("irq/5/smp_affinity_list").replace(b"irq/5", b"irq/6")],
        [9],
    ),
}


def _summed_done(key: str) -> bytes:
    from hostd.journal import _summed

    return (_summed({"key": key, "done": True}) + "\n").encode()


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_every_readable_record_is_kept_and_each_damaged_line_is_named(tmp_path, case):
    damage, bad_lines, *lost = DAMAGE[case]
    _write(tmp_path, damage(_journal(tmp_path)))
    j = Journal(tmp_path, "boot")
    assert [n for n, _ in j.damaged] == bad_lines
    assert all(why for _, why in j.damaged)
    assert j.recorded() == [k for k, _ in GOOD if k not in (lost[0] if lost else [])]


def test_random_bytes_appended_cost_no_record(tmp_path):
    lines = _journal(tmp_path)
    rng = random.Random(15)
    junk = bytes(rng.randrange(256) for _ in range(300))
    _write(tmp_path, [*lines, junk])
    j = Journal(tmp_path, "boot")
    assert j.recorded() == [k for k, _ in GOOD]
    assert j.damaged or j.torn  # and the junk is reported, line by line


def test_a_file_cut_in_half_keeps_the_first_half_and_says_the_rest_is_cut(tmp_path):
    data = b"".join(_journal(tmp_path))
    (tmp_path / JOURNAL_NAME).write_bytes(data[: len(data) // 2])
    j = Journal(tmp_path, "boot")
    kept = j.recorded()
    assert kept and kept == [k for k, _ in GOOD][: len(kept)]
    assert j.torn == len(kept) + 1 and not j.damaged


def test_a_journal_that_is_a_directory_or_a_symlink_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / JOURNAL_NAME).mkdir()
    with pytest.raises(JournalError, match=r"not a regular file|cannot be read"):
        Journal(tmp_path / "a", "boot")
    (tmp_path / "b").mkdir()
    (tmp_path / "target").write_text("")
    (tmp_path / "b" / JOURNAL_NAME).symlink_to(tmp_path / "target")
    with pytest.raises(JournalError, match="cannot be read"):
        Journal(tmp_path / "b", "boot")


def test_lines_of_a_hostd_before_checksums_are_still_read(tmp_path):
    old = _line({"key": "irq/5/smp_affinity_list", "orig": "0-3", "boot": "boot", "time": 1.5})
    (tmp_path / JOURNAL_NAME).write_bytes(old)
    j = Journal(tmp_path, "boot")
    assert j.recorded() == ["irq/5/smp_affinity_list"] and not j.damaged


def test_set_aside_moves_the_damaged_file_out_of_the_way(tmp_path):
    _write(tmp_path, _bad_line(1, _journal(tmp_path)))
    j = Journal(tmp_path, "boot")
    assert j.damaged
    aside = j.set_aside()
    assert aside is not None and aside.exists() and b"\xff" in aside.read_bytes()
    assert not (tmp_path / JOURNAL_NAME).exists()
    assert not Journal(tmp_path, "boot").damaged


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(tmp_path):
    """A crash cut the last line; the next agent's first record must not be glued to it."""
    Journal(tmp_path, "boot").record(GOOD[:1])
    with open(tmp_path / JOURNAL_NAME, "ab") as fh:
        fh.write(b'{"key":"irq/2/smp_aff')
    j = Journal(tmp_path, "boot")
    assert j.torn == 2
    j.record(GOOD[1:3])
    again = Journal(tmp_path, "boot")
    assert again.recorded() == [k for k, _ in GOOD[:3]]
    assert not again.damaged and not again.torn  # the cut line is gone, not glued

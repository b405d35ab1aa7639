"""A session's knob kept on its leader's key (the autogroup nice) acts through another process of
the session once the leader exited, and only through one of that same session: after a crash,
the session may be gone and its id reused by an unrelated one (issue 44.5)."""

from __future__ import annotations

import pytest

from hostd import knobkinds, knobs
from hostd.host import Gone, Host

SID = 700  # the session (and its leader's pid, gone now)


def _proc(tree, pid: int, start: int, nice: int) -> None:
    folder = tree / "proc" / str(pid)
    folder.mkdir(parents=True)
    # pid (comm) state ppid pgrp session tty ... starttime is field 22
    fields = ["S", "1", str(SID), str(SID), "0"] + ["0"] * 14 + [str(start)] + ["0"] * 30
    (folder / "stat").write_text(f"{pid} (member) " + " ".join(fields) + "\n")
    (folder / "autogroup").write_text(f"/autogroup-9 nice {nice}\n")


@pytest.mark.parametrize(
    ("member_start", "recorded_at", "through"),
    [
        (5_000, 6_000, True),  # in the session when the original was recorded: the same one
        (9_000, 6_000, False),  # born after the record, the leader gone: maybe a reused id
        (9_000, None, True),  # not putting an original back (a pass): any member
    ],
)
def test_a_session_knob_acts_only_through_its_own_session(tmp_path, member_start, recorded_at,
                                                          through):  # fmt: skip
    _proc(tmp_path, 701, member_start, 19)
    host = Host(tmp_path)
    key = knobs.task_key(SID, 1_000, "autogroup")  # its leader, gone
    token = knobs.RECORDED_AT.set(recorded_at)
    try:
        if through:
            assert knobkinds.read(host, key) == 19
        else:
            with pytest.raises(Gone):
                knobkinds.read(host, key)
    finally:
        knobs.RECORDED_AT.reset(token)

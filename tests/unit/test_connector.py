"""The proc connector's message parser, over messages built as the kernel lays them out
(include/uapi/linux/cn_proc.h); the live subscription is tested in tests/privileged."""

from __future__ import annotations

import struct

import pytest

from hostd.host import connector as cn


def message(what: int, data: bytes, ack: int = 0) -> bytes:
    event = struct.pack("=IIQ", what, 1, 123456789) + data
    body = struct.pack("=IIIIHH", cn.CN_IDX_PROC, cn.CN_VAL_PROC, 7, ack, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(body), cn.NLMSG_DONE, 0, 7, 0) + body


@pytest.mark.parametrize(
    ("what", "data", "expected"),
    [
        (cn.EV_FORK, struct.pack("=iiii", 10, 10, 11, 10), cn.Event("fork", 11, 10, 10)),
        (cn.EV_FORK, struct.pack("=iiii", 10, 10, 12, 12), cn.Event("fork", 12, 12, 10)),
        (cn.EV_EXEC, struct.pack("=ii", 12, 12), cn.Event("exec", 12, 12)),
        (
            cn.EV_COMM,
            struct.pack("=ii", 11, 10) + b"pt_nccl_watchdg\0",
            cn.Event("comm", 11, 10, 0, "pt_nccl_watchdg"),
        ),
        (  # the name stops at the first NUL
            cn.EV_COMM,
            struct.pack("=ii", 11, 10) + b"a b\0junk\0\0\0\0\0\0\0\0\0\0\0",
            cn.Event("comm", 11, 10, 0, "a b"),
        ),
        (cn.EV_EXIT, struct.pack("=iiIIii", 11, 10, 0, 17, 1, 1), cn.Event("exit", 11, 10)),
        (0x4, struct.pack("=iiii", 11, 10, 0, 0), None),  # a uid event: not wanted
    ],
)
def test_events_parse(what, data, expected):
    got = cn.parse(message(what, data))
    if expected is None:
        assert got is None
    else:  # and when the kernel sent it (the header's timestamp, CLOCK_MONOTONIC ns)
        assert got == expected._replace(ts=123456789)


def test_ack_parses_to_its_error_code():
    assert cn.parse(message(cn.EV_NONE, struct.pack("=I", 0), ack=8)) == 0
    assert cn.parse(message(cn.EV_NONE, struct.pack("=I", 1), ack=8)) == 1  # EPERM


def test_short_messages_are_ignored():
    assert cn.parse(b"") is None
    assert cn.parse(message(cn.EV_FORK, b"")[:40]) is None


def test_subscription_request_layout():
    raw = cn._request(41, struct.pack("=II", cn.PROC_CN_MCAST_LISTEN, cn.WANTED))
    length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", raw)
    idx, val, cseq, ack, dlen, _ = struct.unpack_from("=IIIIHH", raw, 16)
    assert (length, kind, seq) == (len(raw), cn.NLMSG_DONE, 41)
    assert (idx, val, cseq, ack, dlen) == (cn.CN_IDX_PROC, cn.CN_VAL_PROC, 41, 41, 8)
    assert struct.unpack_from("=II", raw, 36) == (1, 0x80000203)

"""A journal line: the ``Record`` an original is kept as, its lines as written (records that
share their stamps together, up to ``PER_LINE`` a line, each line with its CRC-32) and as read
back (``_parse``: a line's entries, each checked before anything is written with it, and why
any part of it cannot be used). The line format itself is described in ``hostd.journal``.
``hostd.journal.core`` (append, load) and ``hostd.journal.compaction`` (rewrite) use it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

from hostd import knobkinds
from hostd.knobs import Value

PER_LINE = 32  # records (or closed keys) a line holds at most: what a damaged line loses


@dataclass(slots=True)  # not frozen: a storm records three per thread, and frozen cost 4x
class Record:
    """One original, never changed once made."""

    key: str
    orig: Value
    boot: str
    version: str
    policy: str
    time: float
    # For a thread's nice, sched and affinity: what hostd first wrote ("to"), the thread's
    # session ("sid") and the boot tick ("tick") then, so that a restore can find the threads
    # that inherited "to" from it (``hostd.reconcile.sweep_inherited``).
    inherit: dict | None = None
    # For a knob the kernel keeps (``Spec.kept_by_kernel``): every value hostd was about to
    # write to it this boot, recorded before the write (``Journal.record``); () when more than
    # ``WROTE_MAX``, None when none was recorded (a restore then writes the original whatever
    # the value).
    wrote: tuple | None = None


WROTE_MAX = 8  # values hostd wrote to one knob that are remembered; past that, none


# json.dumps with separators builds an encoder per call: a third of a journal line's cost. The
# values are plain data read from the kernel, never circular: the check cost a fifth of encoding.
_COMPACT = json.JSONEncoder(separators=(",", ":"), check_circular=False)


_STAMPS = attrgetter("boot", "version", "policy", "time")  # a Record's stamps


def _record_lines(records: Iterable[Record]) -> Iterator[str]:
    """The lines of these records: those that share boot, version, policy and time (the records
    of one append do) go together, up to ``PER_LINE`` a line, encoded by one encoder call (a
    line per record cost 3.4 us a record; 32 a line, 2.5 us, and a third of the bytes)."""
    for head, group in groupby(records, key=_STAMPS):
        rows = [[r.key, r.orig] if r.inherit is None else [r.key, r.orig, r.inherit] for r in group]
        yield from _shared_lines(rows, *head)


def _wrote_lines(records: list[Record], boot: str) -> Iterator[str]:
    """The lines of what hostd wrote to these records' knobs ([K, V] a value, [K]: more than
    ``WROTE_MAX``)."""
    rows = [
        [r.key] if not r.wrote else [r.key, v]
        for r in records
        if r.wrote is not None
        for v in (r.wrote or (None,))
    ]
    for i in range(0, len(rows), PER_LINE):
        yield _summed({"wrote": rows[i : i + PER_LINE], "boot": boot})


def _shared_lines(rows: list, boot: str, version: str, policy: str, when: float) -> Iterator[str]:
    """The lines of records ([K, V] or [K, V, I]) that share their stamps."""
    for i in range(0, len(rows), PER_LINE):
        yield _summed(
            {"records": rows[i : i + PER_LINE], "boot": boot, "version": version,
             "policy": policy, "time": round(when, 3)}
        )  # fmt: skip


def _summed(entry: dict) -> str:
    """The JSON line of ``entry`` with its CRC-32 as the last member."""
    return _with_sum(_COMPACT.encode(entry))


def _with_sum(text: str) -> str:
    """A JSON object's text with its CRC-32 as the last member."""
    return text[:-1] + f',"sum":"{zlib.crc32(text.encode()):08x}"}}'


_SUM_TAIL = len(',"sum":"00000000"}')


def _parse(raw: bytes) -> tuple[list[dict], list[str]]:
    """A journal line's entries, each checked (a record: key, orig, inherit, boot, version,
    policy, time; or a key it closes: key, done), and why any part of it cannot be used: a line
    that is not whole JSON with its sum gives no entry; in a line of several records, a bad one
    costs only itself."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [f"not UTF-8 (byte {exc.start})"]
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):
        return [], ["not JSON (cut off, or damaged)"]
    if not isinstance(entry, dict):
        return [], ["not a record"]
    if "sum" in entry:
        body = text[:-_SUM_TAIL] + "}"
        if not text.endswith(f',"sum":"{entry["sum"]}"}}') or entry["sum"] != (
            f"{zlib.crc32(body.encode()):08x}"
        ):
            return [], ["its checksum does not match (damaged or edited)"]
        del entry["sum"]
    if "records" in entry:  # records of one append
        items = entry["records"]
        if not isinstance(items, list):
            return [], [f"records {items!r:.60} is not a list"]
        shaped = [i for i in items if isinstance(i, list) and len(i) in (2, 3)]
        whys = [
            f"record {i!r:.60} is not [key, original(, inherit)]" for i in items if i not in shaped
        ]
        return _checked(
            [{**entry, "key": i[0], "orig": i[1], "inherit": i[2] if len(i) == 3 else None}
             for i in shaped],
            whys,
        )  # fmt: skip
    if "wrote" in entry:  # values hostd was to write (Journal.record)
        items, boot = entry["wrote"], entry.get("boot")
        if not isinstance(items, list) or not isinstance(boot, str):
            return [], [f"wrote {items!r:.60} is not a list with its boot"]
        good, whys = [], []
        for item in items:
            if not isinstance(item, list) or len(item) not in (1, 2):
                whys.append(f"wrote {item!r:.60} is not [key(, value)]")
                continue
            why = knobkinds.check_key(item[0])
            if why is None and len(item) == 2:
                why = knobkinds.check_value(item[0], item[1])
            if why:
                whys.append(why)
            else:
                good.append({"key": item[0], "wrote": item[1] if len(item) == 2 else None,
                             "boot": boot})  # fmt: skip
        return good, whys
    if isinstance(entry.get("done"), list):  # keys closed at once
        closed, whys = [], []
        for key in entry["done"]:
            why = knobkinds.check_key(key)
            if why:
                whys.append(why)
            else:
                closed.append({"key": key, "done": True})
        return closed, whys
    # one record, or one closed key, a line (the journal of a hostd before 2026-11-27)
    why = knobkinds.check_key(entry.get("key"))
    if why:
        return [], [why]
    if entry.get("done") is True:
        return [entry], []
    if "orig" not in entry:
        return [], [f"{entry['key']}: no original value"]
    return _checked([{**entry, "inherit": entry.get("inherit")}], [])


def _checked(records: list[dict], whys: list[str]) -> tuple[list[dict], list[str]]:
    """The records whose key, original, inherit and stamps are ones hostd can have written;
    why each other one is not (added to ``whys``)."""
    good = []
    for rec in records:
        why = knobkinds.check_key(rec["key"]) or _record_problem(rec)
        if why:
            whys.append(why)
        else:
            good.append(rec)
    return good, whys


def _record_problem(rec: dict) -> str | None:
    key = rec["key"]
    why = knobkinds.check_value(key, rec["orig"])
    if why:
        return why
    inherit = rec["inherit"]
    if inherit is not None:
        ok = (
            isinstance(inherit, dict)
            and set(inherit) == {"to", "sid", "tick"}
            and all(type(inherit[n]) is int and inherit[n] >= 0 for n in ("sid", "tick"))
        )
        why = None if ok else f"{key}: inherit {inherit!r} is not (to, sid, tick)"
        why = why or knobkinds.check_value(key, inherit["to"])
        if why:
            return why
    for name in ("boot", "version", "policy"):
        rec.setdefault(name, "")
        if not isinstance(rec[name], str):
            return f"{key}: {name} {rec[name]!r} is not a string"
    rec.setdefault("time", 0)
    if type(rec["time"]) not in (int, float) or rec["time"] != rec["time"]:
        return f"{key}: time {rec['time']!r} is not a number"
    return None

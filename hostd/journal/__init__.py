"""The write-ahead journal of original values: what makes every change hostd makes restorable.

Before the first write to a knob, its original value is appended to ``journal.jsonl`` (and the
file fsynced when the record is one kept across a reboot; see ``record``); only then is the knob
written. An append that fails (a full disk) leaves the file as it was (cut back to its length
before) and the journal's memory unchanged, and raises ``JournalError``: the caller writes none
of those knobs. A knob's original is recorded once and never overwritten, so however many times
hostd changes it, restore puts back what was there before hostd. Each record carries the boot
id, hostd's version, the policy hash and a CRC-32 of the line (``sum``), which tells a line
damaged or edited since from one cut off by a crash. Task keys include the thread's start time,
so a reused tid is never "restored".

On load, every line is checked before anything is written with it: it must be UTF-8 JSON, its
sum must match, its key must name a knob hostd may have changed and its value must be one that
knob kind can hold (``hostd.knobkinds.check_key``/``check_value``: journal content never chooses
which file hostd writes). A line that fails is listed in ``damaged`` (line number, why), the
readable ones are all kept: ``hostd restore`` restores them and reports the rest, and the agent
refuses to start on a damaged journal. A last line without its newline is a crash mid-append,
whose knobs were never written (write-ahead): it is left out, noted in ``torn`` and cut from the
file before the next append. Task, session and cgroup records from an earlier boot are dropped
(those threads and cgroups are gone); IRQ and cpufreq records are kept and restored.
``compact()`` rewrites the file (temp file, fsync, rename, fsync of the folder) without records
that are done, all at once or a few milliseconds a step (the agent's loop: events are handled in
between, and what they append meanwhile is copied in at the end); ``restore`` in
``hostd.reconcile`` replays it in reverse. ``done`` and ``compact`` never raise: a failure is
kept in ``problem`` (the record stays open on disk, and a later restore finds its knob already
back).

Lines: ``{"records": [[K, V], [K, V, I], ...], "boot": B, "version": X, "policy": H, "time": T,
"sum": S}`` holds the records of one append (up to ``PER_LINE``; I: ``inherit``), and
``{"done": [K, ...], "sum": S}`` closes records (restored, or their thread is gone). A line
that fails its sum loses all of its records; a bad record in a good line only itself. The lines
of a hostd before 2026-11-27, one record (``{"key": K, "orig": V, ...}``) or one closed key
(``{"key": K, "done": true}``) each, are read too, and those before sums without one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, groupby, islice
from operator import attrgetter
from pathlib import Path

from hostd import __version__, knobkinds, knobs
from hostd.host import paths
from hostd.knobs import BOOT_BOUND, Value, is_boot_bound
from hostd.model.cpus import parse_cpulist

log = logging.getLogger("hostd")

JOURNAL_NAME = "journal.jsonl"
_CHUNK = 4096  # lines encoded and written at a time
PER_LINE = 32  # records (or closed keys) a line holds at most: what a damaged line loses
COMPACT_LINES = 16  # lines a compaction encodes between looks at its time (about a millisecond)
FORCED_STEP_S = 0.001  # a compaction ``done`` starts (the agent found no quiet moment): a step


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


def _frozen(value: Value) -> object:
    return tuple(value) if type(value) is list else value


class JournalError(Exception):
    """The journal could not be written (nothing was recorded) or read at all."""


def read_boot_id(host) -> str:
    return (host.read_line(paths.sysctl("kernel/random/boot_id")) or "unknown").strip()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """Originals by key, in the order they were first recorded."""

    def __init__(self, state_dir: str | Path, boot_id: str, policy_sha: str = "") -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / JOURNAL_NAME
        self.boot_id = boot_id
        self.policy_sha = policy_sha
        self.records: dict[str, Record] = {}
        self.dropped_old_boot = 0
        self.damaged: list[tuple[int, str]] = []  # (line number, why it was not read)
        self.torn: int | None = None  # the number of a last line cut off by a crash
        self.problem = ""  # the last failure to write a done line or to compact
        self._done_lines = 0
        self._wrote: dict[tuple, tuple] = {}  # one tuple for the records that say the same
        # The agent compacts when it has nothing else to do, a few milliseconds a step (a
        # compaction rewrites every open record: a second at 100k threads); only a file ten
        # times its open records is compacted at once.
        self.defer_compaction = False
        self._fd: int | None = None
        self._dir_synced = True  # whether the file's name in its folder is durable
        self._compaction: _Compaction | None = None
        self._syncer: ThreadPoolExecutor | None = None  # a compaction's background work
        self._load()

    # -- reading -----------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot be read ({exc.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise JournalError(f"{self.path}: not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as fh:
                data = fh.read()
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot be read ({exc.strerror})") from None
        finally:
            os.close(fd)
        lines = data.split(b"\n")
        last = len(lines) if lines[-1] else len(lines) - 1  # the line after the final newline
        shared: dict[str, dict] = {}  # one inherit dict for the records that say the same
        for number, raw in enumerate(lines[:last], start=1):
            if not raw.strip():
                continue
            entries, whys = _parse(raw)
            cut = not entries and whys == ["not JSON (cut off, or damaged)"]
            if cut and number == last and not data.endswith(b"\n"):
                self.torn = number  # a crash mid-append: its knobs were never written
                continue
            self.damaged += [(number, why) for why in whys]
            for entry in entries:
                self._take(entry, shared)

    def _take(self, entry: dict, shared: dict[str, dict]) -> None:
        """One checked entry of a line read back: a record, or a key it closes. ``shared``:
        the inherit dicts read so far, by their JSON (a re-layer's 100,000 records say a few)."""
        key = entry["key"]
        if "wrote" in entry:
            record = self.records.get(key)
            if record is not None and entry["boot"] == self.boot_id:
                self._add_wrote(record, entry["wrote"])
            return
        if entry.get("done") is True:
            self.records.pop(key, None)
            self._done_lines += 1
            return
        if key in self.records:
            return  # the first original wins
        inherit = entry["inherit"]
        if inherit is not None:
            inherit = shared.setdefault(_COMPACT.encode(inherit), inherit)
        record = Record(
            key,
            entry["orig"],
            entry["boot"],
            entry["version"],
            entry["policy"],
            float(entry["time"]),
            inherit,
        )
        if is_boot_bound(key) and record.boot != self.boot_id:
            self.dropped_old_boot += 1
            return
        self.records[key] = record

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def original(self, key: str) -> Value:
        return self.records[key].orig

    def recorded(self) -> list[str]:
        return list(self.records)

    # -- writing -----------------------------------------------------------------------------
    def _append(self, lines: Iterable[str], sync: bool = True) -> None:
        """Append lines; ``sync``: durable (fdatasync) before returning. The file stays open
        between appends: the agent appends on every event pass. Lines are encoded and written
        a chunk at a time: a first pass at 100k threads appends 100k lines (18 MB), and
        holding them all at once, as text and again as bytes, is what set the agent's peak
        memory."""
        it = iter(lines)
        chunk = list(islice(it, _CHUNK))
        if not chunk:
            return
        self._open()
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        try:
            while chunk:
                _write_all(self._fd, ("\n".join(chunk) + "\n").encode())
                chunk = list(islice(it, _CHUNK))
            if sync:
                os.fdatasync(self._fd)
                if not self._dir_synced:
                    _fsync_dir(self.dir)
                    self._dir_synced = True
        except OSError:
            # Nothing of this append may count: cut the file back, so that no half line is
            # left for the next append to run into.
            try:
                os.ftruncate(self._fd, size)
                os.fdatasync(self._fd)
            except OSError:
                self.close()
            raise

    def _open(self) -> None:
        """Open the file for appends, unless it is open (and still there)."""
        if self._fd is not None and self.path.exists():
            return
        self.close()  # (gone: a compaction of it under way too)
        created = not self.path.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(self.path, flags, 0o600)
        self._dir_synced = not created  # its name is made durable by the first synced append
        if not created:
            # A line a crash cut off (write-ahead: its knobs were never written) goes, so that
            # the next line does not glue onto it.
            os.ftruncate(self._fd, _whole_lines(self._fd))

    def close(self) -> None:
        """Close the file (a compaction under way is given up: the file stays as it was)."""
        self._abort_compaction()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _new(self, originals: list[tuple]) -> tuple[dict[str, Record], Iterator[str]]:
        """The records of these originals not yet recorded, and their journal lines."""
        now, boot, policy = time.time(), self.boot_id, self.policy_sha
        records = self.records
        new: dict[str, Record] = {}
        rows: list[tuple] = []  # what the lines say of each: the tuples given (a storm's 30k/s)
        for item in originals:
            key = item[0]
            if key in records or key in new:
                continue
            how = item[2] if len(item) > 2 else None
            new[key] = Record(key, item[1], boot, __version__, policy, now, how)
            rows.append(item if how is not None or len(item) == 2 else item[:2])
        return new, _shared_lines(rows, boot, __version__, policy, now)

    def record(self, originals: list[tuple], wrote: Iterable[tuple[str, Value]] = ()) -> None:
        """Durably record originals of keys not yet recorded: (key, original) or (key,
        original, inherit), and ``wrote``: (key, value) that hostd is about to write to knobs
        the kernel keeps (``Spec.kept_by_kernel``), so that a restore can tell a value someone
        else wrote since from one of hostd's (``hostd.reconcile.restore_keys``). Call before
        writing the knobs; on ``JournalError`` nothing was recorded, and none of them may be
        written. Durably: an append that holds a record kept across a reboot is fsynced; one
        of boot-bound records only (threads, sessions, cgroups: ``knobs.is_boot_bound``) is
        not, since what write(2) put in the page cache outlives hostd (a kill -9, an OOM kill)
        and is lost only with the kernel, which takes those knobs with it (a new boot drops
        their records); nor is one of values only (a value hostd wrote matters this boot)."""
        new, lines = self._new(originals)
        records = self.records
        rows: list[list] = []
        for key, value in wrote:
            have = records[key].wrote if key in records else None if key in new else ()
            if have != () and (have is None or value not in have):
                rows.append([key, value])
        if not new and not rows:
            return
        said = (
            _summed({"wrote": rows[i : i + PER_LINE], "boot": self.boot_id})
            for i in range(0, len(rows), PER_LINE)
        )
        try:
            self._append(chain(lines, said), sync=not all(k.startswith(BOOT_BOUND) for k in new))
        except OSError as exc:
            values = f" and {len(rows)} value(s) to write" if rows else ""
            raise JournalError(
                f"{self.path}: {len(new)} original(s){values} could not be recorded "
                f"({exc.strerror})"
            ) from None
        records.update(new)
        for key, value in rows:
            self._add_wrote(records[key], value)

    def _add_wrote(self, record: Record, value: Value | None) -> None:
        """``value`` (None: more than anyone remembers) joins what hostd wrote to the knob."""
        have = record.wrote
        if have == () or (have is not None and value in have):
            return
        if value is None or (have is not None and len(have) >= WROTE_MAX):
            record.wrote = ()
            return
        said = (tuple(map(_frozen, have or ())), _frozen(value))
        shared = self._wrote.get(said)
        if shared is None:
            shared = self._wrote[said] = (*(have or ()), value)
        record.wrote = shared

    def _background(self, fn: Callable[[int], None], fd: int) -> Future:
        """``fn(fd)`` in the journal's background thread."""
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(1, thread_name_prefix="hostd-journal")
        return self._syncer.submit(fn, fd)

    def done(self, keys: list[str]) -> None:
        """Close records (restored, or their thread is gone). Not synced: a lost done line
        only makes a later restore find the knob already back, or its thread gone."""
        records = self.records
        keys = [k for k in keys if records.pop(k, None) is not None]  # (a record is never None)
        if not keys:  # (every event pass asks)
            return
        self._done_lines += len(keys)
        try:
            lines = (
                _summed({"done": keys[i : i + PER_LINE]}) for i in range(0, len(keys), PER_LINE)
            )
            self._append(lines, sync=False)
        except OSError as exc:
            self.problem = f"{self.path}: {len(keys)} done line(s) not written ({exc.strerror})"
            return
        if not self.compact_due:
            return
        if not self.defer_compaction:
            self.compact()
        elif self._done_lines > 10 * max(len(self.records), 10_000):
            # The agent found no quiet moment to compact (a storm of threads that end): a
            # step each time more records close, until it ends. All at once it held the
            # event pass that closed them for 64 ms (its fsyncs), mid-storm.
            self.compact(FORCED_STEP_S)

    @property
    def compact_due(self) -> bool:
        """More done lines than open records: a compaction would at least halve the file."""
        return self._done_lines > 1000 and self._done_lines > len(self.records)

    @property
    def compacting(self) -> bool:
        """Whether a compaction is under way (``compact`` with a budget left it to go on)."""
        return self._compaction is not None

    def compact(self, budget_s: float | None = None) -> bool:
        """Rewrite the journal with only open records: temp file, fsync, rename, fsync dir.
        Returns whether it ended (``budget_s``: at most that long a call, the agent's loop
        calls again while ``compacting``; None: all at once). It writes the records open when
        it began, then the lines appended since (records, done lines) as they are, so what
        the file says is the same at every step. On failure the old file stays (and
        ``problem`` says why); so does a damaged one, to be set aside with its damaged lines
        (``set_aside``)."""
        stepped = budget_s is not None
        if not stepped and self._compaction is not None:
            # All at once (a restore, a stop) while steps were under way: those write the
            # records open when they began, which may all be closed now. Start afresh from
            # what is open now, which removes the file when nothing is.
            self._abort_compaction()
        if self._compaction is None:
            if not self._begin_compaction():
                return True
            if stepped:
                return False  # a step of its own: listing 300k records takes milliseconds
        c = self._compaction
        assert c is not None
        deadline = None if budget_s is None else time.monotonic() + budget_s
        try:
            for lines in iter(lambda: list(islice(c.lines, COMPACT_LINES)), []):
                _write_all(c.fd, ("\n".join(lines) + "\n").encode())
                if deadline is not None and time.monotonic() >= deadline:
                    return False
            if stepped:  # the records' lines made durable in the background (70 ms at 300k)
                if c.synced is None:
                    fd = os.open(c.tmp, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                    c.synced = self._background(_sync_and_close, fd)
                if not c.synced.done():
                    return False
                c.synced.result()  # (its OSError, if it failed)
            assert self._fd is not None  # (opened by _begin_compaction, kept by appends)
            end = os.fstat(self._fd).st_size
            for at in range(c.since, end, 1 << 20):  # the lines appended since it began
                _write_all(c.fd, os.pread(self._fd, min(1 << 20, end - at), at))
            os.fdatasync(c.fd)  # (its data and length: all a rename needs of it)
            os.replace(c.tmp, self.path)
            # The old file's descriptor: the next append opens the new file. Its last close
            # frees the old file's blocks (24 ms at 300k records): in the background, stepped.
            old, self._fd = self._fd, None
            if stepped:
                self._background(os.close, old)
            else:
                os.close(old)
            _fsync_dir(self.dir)
            self._done_lines -= c.done_lines
        except OSError as exc:
            self.problem = f"{self.path}: not compacted ({exc.strerror}); its records stay open"
            self._abort_compaction()
            return True
        os.close(c.fd)
        self._compaction = None
        return True

    def _begin_compaction(self) -> bool:
        """Start a compaction (False: none is to be made, or it cannot start now)."""
        if self.damaged:
            return False  # set aside first
        tmp = self.path.with_suffix(".tmp")
        try:
            if not self.records:
                self._close_fd()
                if self.path.exists():
                    self.path.unlink()
                    _fsync_dir(self.dir)
                self._done_lines = 0
                return False
            self._open()
            assert self._fd is not None
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(tmp, flags, 0o600)
        except OSError as exc:
            self.problem = f"{self.path}: not compacted ({exc.strerror}); its records stay open"
            return False
        records = list(self.records.values())
        lines = chain(_record_lines(records), _wrote_lines(records, self.boot_id))
        since = os.fstat(self._fd).st_size
        self._compaction = _Compaction(tmp, fd, lines, since, self._done_lines)
        return True

    def _abort_compaction(self) -> None:
        c, self._compaction = self._compaction, None
        if c is not None:
            with contextlib.suppress(OSError):
                os.close(c.fd)
            with contextlib.suppress(OSError):
                c.tmp.unlink()

    def set_aside(self) -> Path | None:
        """Move a damaged journal out of the way (``journal.jsonl.damaged-TIME``), once every
        record it could read is restored; the damaged lines stay there to be looked at."""
        self.close()
        if not self.path.exists():
            return None
        dest = self.path.with_name(f"{JOURNAL_NAME}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(self.path, dest)
        _fsync_dir(self.dir)
        self.damaged, self.torn = [], None
        return dest


@dataclass(slots=True)
class _Compaction:
    """A compaction under way: the temp file, the lines of the records open when it began
    still to write, the file's length then (what was appended since is copied at the end), the
    done lines counted then, and the fsync of what it wrote."""

    tmp: Path
    fd: int
    lines: Iterator[str]
    since: int
    done_lines: int
    synced: Future | None = None  # the background fsync of the records' lines


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_and_close(fd: int) -> None:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _whole_lines(fd: int) -> int:
    """The length of the file up to and including its last newline."""
    end = os.fstat(fd).st_size
    pos = end
    while pos > 0:
        start = max(0, pos - 65536)
        block = os.pread(fd, pos - start, start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


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


def open_checked(state_dir: Path, boot_id: str, policy_sha: str) -> Journal:
    """The journal an agent may start on; JournalError says why not (a damaged file: an
    agent started on it would take its own values for originals)."""
    try:
        journal = Journal(state_dir, boot_id, policy_sha)
    except JournalError as exc:
        raise JournalError(f"{exc}: `hostd restore` reports what it holds") from None
    if journal.damaged:
        number, why = journal.damaged[0]
        raise JournalError(
            f"{journal.path} is damaged ({len(journal.damaged)} unreadable line(s); line "
            f"{number}: {why}): an agent started on it would take its own values for originals. "
            "Run `hostd restore`: it restores every readable record and sets the file aside"
        )
    if journal.torn:
        log.info("journal line=%d reason=cut-off-by-a-crash (never applied)", journal.torn)
    if journal.dropped_old_boot:
        n = journal.dropped_old_boot
        log.info("journal dropped=%d reason=records-from-an-earlier-boot (threads, cgroups)", n)
    return journal


def base_affinities(journal: Journal) -> dict[tuple[int, int], frozenset[int]]:
    """Each thread's affinity before hostd changed it, by (tid, start time): what the planner
    starts from for a thread hostd already placed (the agent's pass and ``hostd plan`` alike)."""
    return {
        knobs.parse_task_key(k): parse_cpulist(str(journal.original(k)))
        for k in journal.recorded()
        if k.endswith("/affinity")
    }

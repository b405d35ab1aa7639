"""The journal itself: ``Journal``, the originals by key, read back from ``journal.jsonl``
(each line checked, ``hostd.journal.lines``), appended to before any knob is written
(``record``), closed once restored (``done``) and compacted (``hostd.journal.compaction``).
``hostd.reconcile`` records and restores through it; the agent and the commands open it.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, islice
from pathlib import Path

from hostd import __version__
from hostd.journal.compaction import FORCED_STEP_S, Compacting, _Compaction
from hostd.journal.files import JOURNAL_NAME, JournalError, _fsync_dir, _whole_lines, _write_all
from hostd.journal.lines import (
    _COMPACT,
    PER_LINE,
    WROTE_MAX,
    Record,
    _parse,
    _shared_lines,
    _summed,
)
from hostd.knobs import BOOT_BOUND, Value, is_boot_bound

_CHUNK = 4096  # lines encoded and written at a time


def _frozen(value: Value) -> object:
    return tuple(value) if type(value) is list else value


class Journal(Compacting):
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

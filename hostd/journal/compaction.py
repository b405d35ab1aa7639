"""The journal's compaction: rewriting ``journal.jsonl`` with only its open records (temp
file, fsync, rename, fsync of the folder), all at once or a few milliseconds a step. It is a
part of ``hostd.journal.core.Journal`` (``Compacting`` is its base class), split off to be read
on its own; ``Journal.done`` starts one when it is due, and the agent's loop steps it
(``compacting``, ``compact(budget_s)``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

from hostd.journal.files import _fsync_dir, _write_all
from hostd.journal.lines import Record, _record_lines, _wrote_lines

COMPACT_LINES = 16  # lines a compaction encodes between looks at its time (about a millisecond)
FORCED_STEP_S = 0.001  # a compaction ``done`` starts (the agent found no quiet moment): a step


class Compacting:
    """The compaction of a ``Journal``. What it uses of the journal, set by
    ``Journal.__init__``: its folder, file and boot id, its open records, its damaged lines,
    its file descriptor for appends (``_open``, ``_close_fd``) and the count of done lines."""

    dir: Path
    path: Path
    boot_id: str
    records: dict[str, Record]
    damaged: list[tuple[int, str]]
    problem: str
    _done_lines: int
    _fd: int | None
    _compaction: _Compaction | None
    _syncer: ThreadPoolExecutor | None

    def _background(self, fn: Callable[[int], None], fd: int) -> Future:
        """``fn(fd)`` in the journal's background thread."""
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(1, thread_name_prefix="hostd-journal")
        return self._syncer.submit(fn, fd)

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


def _sync_and_close(fd: int) -> None:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)

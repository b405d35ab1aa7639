"""The write-ahead journal of original values: what makes every change hostd makes restorable.

Before the first write to a knob, its original value is appended to ``journal.jsonl`` and the
file is fsynced; only then is the knob written. A knob's original is recorded once and never
overwritten, so however many times hostd changes it, restore puts back what was there before
hostd. Each record carries the boot id, hostd's version and the policy hash. Task keys include
the thread's start time, so a reused tid is never "restored".

On load, task and session records from an earlier boot are dropped (those threads are gone);
host knobs (IRQs, governors, cgroups) are kept and restored. A torn last line (a crash
mid-append) is ignored. ``compact()`` rewrites the file (temp file, fsync, rename, fsync of the
folder) without records that are done; ``restore`` in ``hostd.reconcile`` replays it in reverse.

Record lines: ``{"key": K, "orig": V, "boot": B, "version": X, "policy": H, "time": T}``;
a line ``{"key": K, "done": true}`` closes a record (restored, or its thread is gone).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from hostd import __version__
from hostd.knobs import Value, is_boot_bound

JOURNAL_NAME = "journal.jsonl"
_CHUNK = 4096  # lines encoded and written at a time


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    orig: Value
    boot: str
    version: str
    policy: str
    time: float


def read_boot_id(host) -> str:
    return (host.read_line("proc/sys/kernel/random/boot_id") or "unknown").strip()


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
        self._done_lines = 0
        self._fd: int | None = None
        self._load()

    # -- reading -----------------------------------------------------------------------------
    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        for line in lines:
            try:
                entry = json.loads(line)
                key = entry["key"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from a crash mid-append
            if entry.get("done"):
                self.records.pop(key, None)
                self._done_lines += 1
                continue
            if key in self.records:
                continue  # the first original wins
            record = Record(
                key,
                entry.get("orig"),
                str(entry.get("boot", "")),
                str(entry.get("version", "")),
                str(entry.get("policy", "")),
                float(entry.get("time", 0)),
            )
            if is_boot_bound(key) and record.boot != self.boot_id:
                self.dropped_old_boot += 1
                continue
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
    @staticmethod
    def _line(rec: Record) -> str:
        return json.dumps(
            {
                "key": rec.key,
                "orig": rec.orig,
                "boot": rec.boot,
                "version": rec.version,
                "policy": rec.policy,
                "time": round(rec.time, 3),
            },
            separators=(",", ":"),
        )

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
        if self._fd is None or not self.path.exists():
            self.close()
            created = not self.path.exists()
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            if created:
                _fsync_dir(self.dir)
        while chunk:
            view = memoryview(("\n".join(chunk) + "\n").encode())
            while view:
                view = view[os.write(self._fd, view) :]
            chunk = list(islice(it, _CHUNK))
        if sync:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def record(self, originals: list[tuple[str, Value]]) -> None:
        """Durably record originals of keys not yet recorded. Call before writing the knobs."""
        now = time.time()

        def new_lines() -> Iterator[str]:
            for key, orig in originals:
                if key not in self.records:
                    rec = Record(key, orig, self.boot_id, __version__, self.policy_sha, now)
                    self.records[key] = rec
                    yield self._line(rec)

        self._append(new_lines())

    def done(self, keys: list[str]) -> None:
        """Close records (restored, or their thread is gone). Not synced: a lost done line
        only makes a later restore find the knob already back, or its thread gone."""
        keys = [k for k in keys if k in self.records]
        for key in keys:
            del self.records[key]
        self._done_lines += len(keys)
        self._append(
            (json.dumps({"key": k, "done": True}, separators=(",", ":")) for k in keys), sync=False
        )
        if self._done_lines > 1000 and self._done_lines > len(self.records):
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal with only open records: temp file, fsync, rename, fsync dir."""
        self.close()
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.records:
            if self.path.exists():
                self.path.unlink()
                _fsync_dir(self.dir)
            self._done_lines = 0
            return
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(self._line(rec) + "\n" for rec in self.records.values())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
        _fsync_dir(self.dir)
        self._done_lines = 0

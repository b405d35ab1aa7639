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

The parts, each a module: ``core`` (``Journal``: load, record, done), ``compaction`` (its
rewrite), ``lines`` (``Record`` and the line format, written and read back checked), ``files``
(the file's name, ``JournalError``, the boot id, file steps) and ``start`` (``open_checked``,
``base_affinities``).
"""

from __future__ import annotations

from hostd.journal.compaction import COMPACT_LINES, FORCED_STEP_S
from hostd.journal.core import Journal
from hostd.journal.files import JOURNAL_NAME, JournalError, read_boot_id
from hostd.journal.lines import PER_LINE, WROTE_MAX, Record
from hostd.journal.lines import _summed as _summed  # (tests write lines of their own)
from hostd.journal.start import base_affinities, open_checked

__all__ = [
    "COMPACT_LINES",
    "FORCED_STEP_S",
    "JOURNAL_NAME",
    "PER_LINE",
    "WROTE_MAX",
    "Journal",
    "JournalError",
    "Record",
    "base_affinities",
    "open_checked",
    "read_boot_id",
]

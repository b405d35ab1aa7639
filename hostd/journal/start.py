"""What an agent or a plan starts from: the journal an agent may start on (``open_checked``,
which refuses a damaged one), and each thread's affinity before hostd changed it
(``base_affinities``, for the agent's pass and ``hostd plan``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hostd import knobs
from hostd.journal.core import Journal
from hostd.journal.files import JournalError
from hostd.model.cpus import parse_cpulist

log = logging.getLogger("hostd")


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

"""What an agent or a plan starts from: the journal an agent may start on (``open_checked``,
which refuses a damaged one), and each thread's affinity before hostd changed it
(``base_affinities``, for the agent's pass and ``hostd plan``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
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


class BaseAffinities(Mapping[tuple[int, int], frozenset[int]]):
    """Each thread's affinity before hostd changed it, by (tid, start time), looked up in the
    journal as it is asked for: what the planner starts from for a thread hostd already placed
    (the agent's passes and ``hostd plan`` alike). At 100,000 placed threads, a dict of them
    all, each with its own set, was 15 MB of the agent's peak memory in a full pass; here one
    set stands for every record of the same text."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._cpus: dict[str, frozenset[int]] = {}

    def __getitem__(self, ident: tuple[int, int]) -> frozenset[int]:
        record = self.journal.records.get(f"task/{ident[0]}@{ident[1]}/affinity")
        if record is None:
            raise KeyError(ident)
        text = str(record.orig)
        cpus = self._cpus.get(text)
        if cpus is None:
            cpus = self._cpus[text] = parse_cpulist(text)
        return cpus

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return (knobs.parse_task_key(k) for k in self.journal.recorded() if k.endswith(AFFINITY))

    def __len__(self) -> int:
        return sum(1 for k in self.journal.records if k.endswith(AFFINITY))

    def __bool__(self) -> bool:
        return any(k.endswith(AFFINITY) for k in self.journal.records)


AFFINITY = "/affinity"


def base_affinities(journal: Journal) -> BaseAffinities:
    """Each thread's affinity before hostd changed it (``BaseAffinities``)."""
    return BaseAffinities(journal)

"""What a pass reports: one ``Result`` per knob, gathered in a ``PassReport``, and the outcome
a ``HostError`` stands for.

Made by ``hostd.reconcile``'s apply (``prepare``, ``finish``) and restore
(``hostd.reconcile.restoring``); read by the agent, its status and metrics, and the CLI.
"""

from __future__ import annotations

import errno
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from hostd.host import HostError


class Result(NamedTuple):
    """What became of one knob (a tuple: a pass makes one per knob, and a frozen dataclass cost
    four times as much to make)."""

    key: str
    outcome: str
    value: object = None
    detail: str = ""


# What went as it should: a full pass counts these and keeps only the others (``fold``).
ROUTINE = frozenset({"applied", "skipped", "restored", "gone", "would-apply", "would-restore"})


@dataclass
class PassReport:
    results: list[Result] = field(default_factory=list)
    tally: Counter[str] = field(default_factory=Counter)  # outcomes of results not kept

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r.outcome for r in self.results) + self.tally)

    def fold(self, other: PassReport) -> None:
        """Add ``other``'s results: those of ``ROUTINE`` outcomes counted only (a full pass
        at 100,000 threads kept a result for each, 8 MB of its peak memory), the rest kept."""
        tally = self.tally
        for r in other.results:
            if r.outcome in ROUTINE:
                tally[r.outcome] += 1
            else:
                self.results.append(r)
        tally.update(other.tally)


def _outcome(exc: HostError) -> str:
    if exc.errno == errno.EOPNOTSUPP:
        return "unsupported"
    return exc.outcome

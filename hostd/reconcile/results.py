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


@dataclass
class PassReport:
    results: list[Result] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r.outcome for r in self.results))


def _outcome(exc: HostError) -> str:
    if exc.errno == errno.EOPNOTSUPP:
        return "unsupported"
    return exc.outcome

"""What the agent shares with its parts in place of itself: the running state (``AgentState``) and
the one way a pass's problems are logged (``log_problems``).

``hostd.agent.core.Agent`` makes one ``AgentState`` and hands it to the parts that need what
changes while the agent runs: the policy in force and its classifier (a reload replaces both),
the mode, the switch (``hostd disable``), when the last event pass ended (the loop stamps it),
how long cpuset joins wait without events (``hostd.agent.parts.Joins``; a full pass resets it)
and whether a re-layer kept objects for the collector to freeze (``hostd.agent.parts.freeze``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hostd.classify import Classifier
from hostd.policy import Policy
from hostd.reconcile import PassReport
from hostd.statedir import owned_file

log = logging.getLogger("hostd")
JOIN_QUIET_S = 0.02  # cpuset joins wait this long without events (``hostd.agent.parts``)


@dataclass
class AgentState:
    policy: Policy
    classifier: Classifier
    mode_override: str | None  # ``hostd run --mode``
    switch: str  # RUN_DIR/disabled (looked at a few times a step)
    last_event: float = 0.0  # monotonic time the last event pass ended
    join_quiet: float = JOIN_QUIET_S  # cpuset joins wait this long without events
    refreeze: bool = False  # a re-layer or its redo kept objects: frozen (``parts.freeze``)
    collected: float | None = None  # monotonic time of the last whole collection (``loop.full``)

    @property
    def mode(self) -> str:
        return self.mode_override or self.policy.mode

    @property
    def disabled(self) -> bool:
        # Only a flag root could have made counts (the run dir is checked at start).
        return owned_file(self.switch)


def log_problems(report: PassReport) -> None:
    unjournaled = [r for r in report.results if r.outcome == "unjournaled"]
    if unjournaled:
        log.error(
            "journal write failed: %d change(s) not made: %s",
            len(unjournaled),
            unjournaled[0].detail,
        )
    for r in report.results:
        if r.outcome == "error":
            log.error("action key=%s outcome=%s detail=%r", r.key, r.outcome, r.detail)
        elif r.outcome in ("not-permitted", "unsupported"):
            log.warning("action key=%s outcome=%s detail=%r", r.key, r.outcome, r.detail)
        elif r.outcome == "unchangeable" and r.detail != "refused before":
            log.info("action key=%s outcome=unchangeable (remembered, not retried)", r.key)

"""The values of the watch (``hostd.preempt``): a thread's key, its sample, a demoted session and
one round's decisions. ``Watch`` (``hostd.preempt.watch``) makes them; the agent
(``hostd.agent.sampling``, ``hostd.agent.watch``, ``hostd.agent.guard``) reads and applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Key = tuple[int, int]  # (tid, start_time)


@dataclass(frozen=True, slots=True)
class Sample:
    """One thread's scheduler totals (ns since it started) at one moment."""

    key: Key
    pid: int
    session: int
    layer: str
    run_ns: int
    wait_ns: int
    state: str = "S"  # its state letter (proc(5)): 'R' runnable
    uid: int = -1  # its user (-1: not known)


@dataclass(slots=True)
class Demotion:
    """A demoted session: since when, what it wanted then, and since when it wants little."""

    sid: int
    since: float
    demand: float
    low_since: float | None = None
    demand_now: float = 0.0
    waiting_since: float | None = None  # since when it wants a CPU and got none (the floor)


@dataclass
class Decisions:
    demote: list[Demotion] = field(default_factory=list)
    release: list[tuple[int, str]] = field(default_factory=list)  # (sid, why)
    boost: list[Sample] = field(default_factory=list)
    runaway: list[Sample] = field(default_factory=list)
    lifted: list[int] = field(default_factory=list)  # released at the floor (also in release)

    def __bool__(self) -> bool:
        return bool(self.demote or self.release or self.boost or self.runaway)

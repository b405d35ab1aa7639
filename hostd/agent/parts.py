"""The agent's periodic parts, as the loop schedules them: each says when the loop must wake for
it (``Part.wake``) and what it does once woken (``Part.run``, which looks at its own state and
may find nothing to do yet).

``ORDER`` is the order they run in after the event pass of a step (``hostd.agent.loop.step``,
which adds the drift rescan and the status file last): the records of exited threads first (a
storm's exits hold memory), then cpuset joins and the pool's threads after a re-layer, each
only while no event waits and within a few milliseconds; the journal's compaction when nothing
else is left; then the timers: a layer due to give CPUs back, the watch (preemption and the
starvation guard), a second look at unsettled job threads, the sizer, the layers' statistics.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from hostd.reconcile import PassReport

if TYPE_CHECKING:
    from hostd.agent.core import Agent
    from hostd.agent.layerstats import LayerStats

log = logging.getLogger("hostd")
JOIN_BUDGET_S = 0.002  # cpuset joins per step, while no event waits
JOIN_QUIET_S = 0.02  # ... and none came for this long (``join_at``)
# A join slower than this held the host's forks and exits (a grace period, 5-16 ms on an idle
# 2-CPU VM, is the most a join waits for on a quiet host): the next waits for a longer quiet,
# at least a second, 4 times longer at each slow one, up to the drift rescan's minimum; each
# quick one halves it again, a full pass (which joins all that waited) ends it (``join_backoff``)
JOIN_SLOW_S, JOIN_BACKOFF_S, JOIN_QUIET_MAX_S = 0.05, 1.0, 60.0
REDO_BUDGET_S = 0.005  # threads decided again after a re-layer, per step
REDO_HOLD_S, REDO_FLOOR_S = 0.02, 0.05  # ... not within 20 ms of an event, unless 50 ms without
COMPACT_POLL_S = 0.001  # how often a compaction's background fsync is seen to
COMPACT_STEP_S = 0.003  # the journal's compaction, per step, while no event waits
CLOSE_CHUNK = 256  # exited threads whose journal records are closed per step (about 1 ms)
# ... while events wait, only beyond this many (then a chunk a step): their records are held in
# memory meanwhile (1.5 KB a thread; with 50,000 the agent's RSS stayed 78 MB higher after a
# storm at 100,000 threads)
CLOSE_HOLD = 4096
STATS_STEP_S = 0.001  # the layers' statistics (a sample's reads), per step, while no event waits
STATS_FLOOR_S = 0.1  # ... and a step's worth at least this often whatever comes


class Part(NamedTuple):
    """One thing the loop does when its time comes."""

    name: str
    wake: Callable[[Agent], float | None]  # the monotonic time to wake for it (None: no need)
    run: Callable[[Agent], None]  # what it does, once woken (it checks that its time has come)


def waiting(agent: Agent) -> bool:
    """Whether events, or threads they named, wait: other work leaves them the CPU."""
    return bool(agent.inc.backlog) or agent.sources.events_waiting()


def ready(due: float | None) -> bool:
    return due is not None and due <= time.monotonic()


def freeze(agent: Agent, collect: bool) -> None:
    """What the agent keeps (100k threads' objects at the goal size) goes out of the cyclic
    collector's sight until the next full pass (``gc.freeze``): its full collections, scanning
    all of it, held events for 18-50 ms at 20k threads. At a full pass, after one collection
    (20-23 ms after a 0.7-0.9 s pass at 20k threads); after a re-layer and each step of its
    redo, without (it kept 60k journal records at 20k threads, and a collection of them took
    14-30 ms that an event would wait for): the cyclic garbage frozen with them waits for the
    next full pass's collection."""
    if collect:
        gc.collect()
    gc.freeze()
    agent.refreeze = False


# -- the records of exited threads -----------------------------------------------------------
def _close(agent: Agent) -> None:
    if agent.exited and (not waiting(agent) or len(agent.exited) > CLOSE_HOLD):
        agent.close_exited(CLOSE_CHUNK)


# -- cpuset joins --------------------------------------------------------------------------
def join_at(agent: Agent) -> float | None:
    """When the waiting cpuset joins may be made (None: none waits): once the oldest is due and
    no event came for ``agent.join_quiet`` (``JOIN_QUIET_S``; longer after a slow join). A join
    takes the cgroup core's thread-group lock for writing: it waits for every fork and exit in
    flight on the host, and every fork and exit waits for it. Made between the events of a storm
    of 0.1 s threads on one crowded CPU, joins held the workload's threads in their fork or exit
    for seconds (BENCHMARKS.md, "Cpuset joins in a storm"). A host that is never quiet this long
    gets its joins from the drift rescan: the threads' affinity keeps them on their layer's CPUs
    meanwhile."""
    due = agent.inc.joins_due()
    return None if due is None else max(due, agent.last_event + agent.join_quiet)


def join_backoff(agent: Agent, took: float) -> None:
    """How long the next joins wait without events, after one that took ``took`` seconds. A
    storm's own pauses (its creators waiting for a crowded CPU) outlast ``JOIN_QUIET_S``: a join
    made in one waited up to a second for the threads in flight, and the storm's forks and
    exits, and the agent's events, waited for it (BENCHMARKS.md, "A slow join backs off")."""
    quiet = agent.join_quiet
    if took > JOIN_SLOW_S:
        agent.join_quiet = min(max(quiet * 4, JOIN_BACKOFF_S), JOIN_QUIET_MAX_S)
        agent.counters["slow_joins"] += 1
        log.info(
            "cpuset join took %.0f ms (forks and exits on the host waited for it): the next "
            "waits for %.0f s without events", took * 1000, agent.join_quiet,
        )  # fmt: skip
    else:
        agent.join_quiet = max(quiet / 2, JOIN_QUIET_S)


def _joins(agent: Agent) -> None:
    deadline = time.monotonic() + JOIN_BUDGET_S
    while ready(join_at(agent)) and time.monotonic() < deadline and not waiting(agent):
        began = time.monotonic()
        agent.join_cpusets(1)  # one at a time: each is timed (``join_backoff``)
        join_backoff(agent, time.monotonic() - began)


# -- the pool's threads after a re-layer ------------------------------------------------------
def redo_at(agent: Agent) -> float | None:
    """When the pool's threads left by a re-layer may be worked on (None: none are left):
    ``REDO_HOLD_S`` after the last event pass (events come in bursts, a job starting its
    threads: the burst first), but a chunk at least every ``REDO_FLOOR_S`` whatever comes."""
    inc = agent.inc
    if not inc.redo_left:
        return None
    return min(agent.last_event + REDO_HOLD_S, agent.last_redo + REDO_FLOOR_S)


def _redo(agent: Agent) -> None:
    deadline = time.monotonic() + REDO_BUDGET_S
    while ready(redo_at(agent)) and time.monotonic() < deadline and not waiting(agent):
        agent.redo(8)  # about a millisecond each: an event waits at most that long
        agent.last_redo = time.monotonic()
    if agent.refreeze:
        freeze(agent, collect=False)  # what a re-layer and its redo kept, out of the way too


# -- the journal's compaction ---------------------------------------------------------------
def _compact_wake(agent: Agent) -> float | None:
    # its next step (or its fsync, looked at)
    return time.monotonic() + COMPACT_POLL_S if agent.journal.compacting else None


def _compact(agent: Agent) -> None:
    inc, journal = agent.inc, agent.journal
    idle = not (inc.pending or inc.redo_left)
    if (journal.compacting or (idle and journal.compact_due)) and not waiting(agent):
        began, problem = journal.compacting, journal.problem
        if journal.compact(COMPACT_STEP_S) and began:  # a step; the next goes on
            if journal.problem != problem:
                log.warning("journal %s", journal.problem)
            else:
                log.info("journal compacted records=%d", len(journal))


# -- the timers -------------------------------------------------------------------------------
def _shrink(agent: Agent) -> None:
    inc = agent.inc
    if ready(inc.shrink_due) and not agent.disabled:
        agent.relayer("shrink", inc.why)


def _watch(agent: Agent) -> None:
    now = time.monotonic()
    if now >= agent.watcher.next_due() and not agent.disabled:
        agent.watcher.run_due(now)


def _relook_wake(agent: Agent) -> float | None:
    return agent.relook_at if agent.cache.unsettled and not agent.disabled else None


def _relook(agent: Agent) -> None:
    # a relook waits for a step without events
    if ready(_relook_wake(agent)) and not waiting(agent):
        agent.relook()


def _sizer_wake(agent: Agent) -> float | None:
    return agent.sizer.due if agent.sizer.wanted and not agent.disabled else None


def _sizer(agent: Agent) -> None:
    if ready(_sizer_wake(agent)) and agent.sizer.tick():
        agent.relayer("resize")  # a layer's count changed


def stats_overdue(stats: LayerStats) -> bool:
    """Whether a sample has waited ``STATS_FLOOR_S`` past its due time (to begin) or its last
    slice (to go on): in a storm that lasts, events always wait, and a sample still begins and
    ends (1 % of a CPU)."""
    return time.monotonic() - max(stats.due, stats.last_slice) >= STATS_FLOOR_S


def _stats(agent: Agent) -> None:
    stats = agent.layer_stats  # no reads when nobody scrapes or records
    due = ready(stats.due) and stats.wanted and not agent.disabled
    if due and (not waiting(agent) or stats_overdue(stats)) and stats.sample(STATS_STEP_S):
        agent.write_status(PassReport(), None, state="running")  # what it found, said now


ORDER: tuple[Part, ...] = (
    Part("close", lambda a: 0.0 if a.exited else None, _close),
    Part("joins", join_at, _joins),
    Part("redo", redo_at, _redo),
    Part("compact", _compact_wake, _compact),
    Part("shrink", lambda a: a.inc.shrink_due, _shrink),
    Part("watch", lambda a: a.watcher.next_due(), _watch),
    Part("relook", _relook_wake, _relook),
    Part("sizer", _sizer_wake, _sizer),
    Part("stats", lambda a: a.layer_stats.due if a.layer_stats.wanted else None, _stats),
)

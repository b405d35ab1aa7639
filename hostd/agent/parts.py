"""The agent's periodic parts, as the loop schedules them: each says when the loop must wake for
it (``wake``: a monotonic time, None for no need) and what it does once woken (``run``, which
looks at its own state and may find nothing to do yet). Each is built once by the agent
(``hostd.agent.core``) with only what it needs: the incremental state, the journal, the
``AgentState`` (policy, mode, switch, the last event's time), a callable for each agent action
it triggers, and ``waiting`` (whether events wait: other work leaves them the CPU).

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
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from hostd.agent.state import JOIN_QUIET_S, AgentState

if TYPE_CHECKING:
    from hostd.agent.incremental import Incremental
    from hostd.agent.layerstats import LayerStats
    from hostd.agent.sizer import Sizer
    from hostd.agent.watch import WatchLoop
    from hostd.journal import Journal
    from hostd.tasks import TaskCache

log = logging.getLogger("hostd")
JOIN_BUDGET_S = 0.002  # cpuset joins per step, while no event waits
# ... and none came for JOIN_QUIET_S (``Joins.wake``). A join slower than this held the host's
# forks and exits (a grace period, 5-16 ms on an idle 2-CPU VM, is the most a join waits for on
# a quiet host): the next waits for a longer quiet, at least a second, 4 times longer at each
# slow one, up to the drift rescan's minimum; each quick one halves it again, a full pass (which
# joins all that waited) ends it (``Joins.backoff``)
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
RELOOK_S = 0.25  # how often unsettled unnamed job threads are looked at again (TaskCache.relook)
STATS_STEP_S = 0.001  # the layers' statistics (a sample's reads), per step, while no event waits
STATS_FLOOR_S = 0.1  # ... and a step's worth at least this often whatever comes

Waiting = Callable[[], bool]  # whether events, or threads they named, wait


def ready(due: float | None) -> bool:
    return due is not None and due <= time.monotonic()


def freeze(state: AgentState, collect: bool) -> None:
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
    state.refreeze = False


class Close:
    """The journal records of threads that exited (``Agent.close_exited``), a chunk a step."""

    def __init__(self, exited: list, close: Callable[[int], None], waiting: Waiting) -> None:
        self.exited, self.close, self.waiting = exited, close, waiting

    def wake(self) -> float | None:
        return 0.0 if self.exited else None

    def run(self) -> None:
        if self.exited and (not self.waiting() or len(self.exited) > CLOSE_HOLD):
            self.close(CLOSE_CHUNK)


class Joins:
    """Cpuset joins that events left for later (``Agent.join_cpusets``), one at a time."""

    def __init__(
        self,
        inc: Incremental,
        state: AgentState,
        counters: Counter[str],
        join: Callable[[int], None],
        waiting: Waiting,
    ) -> None:
        self.inc, self.state, self.counters = inc, state, counters
        self.join, self.waiting = join, waiting

    def wake(self) -> float | None:
        """When the waiting cpuset joins may be made (None: none waits): once the oldest is due
        and no event came for ``state.join_quiet`` (``JOIN_QUIET_S``; longer after a slow join).
        A join takes the cgroup core's thread-group lock for writing: it waits for every fork and
        exit in flight on the host, and every fork and exit waits for it. Made between the
        events of a storm of 0.1 s threads on one crowded CPU, joins held the workload's threads
        in their fork or exit for seconds (BENCHMARKS.md, "Cpuset joins in a storm"). A host that
        is never quiet this long gets its joins from the drift rescan: the threads' affinity
        keeps them on their layer's CPUs meanwhile."""
        due = self.inc.joins_due()
        return None if due is None else max(due, self.state.last_event + self.state.join_quiet)

    def backoff(self, took: float) -> None:
        """How long the next joins wait without events, after one that took ``took`` seconds. A
        storm's own pauses (its creators waiting for a crowded CPU) outlast ``JOIN_QUIET_S``: a
        join made in one waited up to a second for the threads in flight, and the storm's forks
        and exits, and the agent's events, waited for it (BENCHMARKS.md, "A slow join backs
        off")."""
        state = self.state
        quiet = state.join_quiet
        if took > JOIN_SLOW_S:
            state.join_quiet = min(max(quiet * 4, JOIN_BACKOFF_S), JOIN_QUIET_MAX_S)
            self.counters["slow_joins"] += 1
            log.info(
                "cpuset join took %.0f ms (forks and exits on the host waited for it): the next "
                "waits for %.0f s without events", took * 1000, state.join_quiet,
            )  # fmt: skip
        else:
            state.join_quiet = max(quiet / 2, JOIN_QUIET_S)

    def run(self) -> None:
        deadline = time.monotonic() + JOIN_BUDGET_S
        while ready(self.wake()) and time.monotonic() < deadline and not self.waiting():
            began = time.monotonic()
            self.join(1)  # one at a time: each is timed (``backoff``)
            self.backoff(time.monotonic() - began)


class Redo:
    """The pool's threads after a re-layer (``Agent.redo``), a few at a time."""

    def __init__(
        self, inc: Incremental, state: AgentState, redo: Callable[[int], None], waiting: Waiting
    ) -> None:
        self.inc, self.state, self.redo, self.waiting = inc, state, redo, waiting
        self.last = 0.0  # monotonic time the last chunk ended

    def wake(self) -> float | None:
        """When the pool's threads left by a re-layer may be worked on (None: none are left):
        ``REDO_HOLD_S`` after the last event pass (events come in bursts, a job starting its
        threads: the burst first), but a chunk at least every ``REDO_FLOOR_S`` whatever comes."""
        if not self.inc.redo_left:
            return None
        return min(self.state.last_event + REDO_HOLD_S, self.last + REDO_FLOOR_S)

    def run(self) -> None:
        deadline = time.monotonic() + REDO_BUDGET_S
        while ready(self.wake()) and time.monotonic() < deadline and not self.waiting():
            self.redo(4)  # 0.3-0.6 ms each (8 took up to 2 ms): an event waits at most that long
            self.last = time.monotonic()
        if self.state.refreeze:
            freeze(self.state, collect=False)  # what a re-layer and its redo kept, out of the way


class Compact:
    """The journal's compaction, a few milliseconds a step while nothing else waits."""

    def __init__(self, inc: Incremental, journal: Journal, waiting: Waiting) -> None:
        self.inc, self.journal, self.waiting = inc, journal, waiting

    def wake(self) -> float | None:
        # its next step (or its fsync, looked at)
        return time.monotonic() + COMPACT_POLL_S if self.journal.compacting else None

    def run(self) -> None:
        inc, journal = self.inc, self.journal
        idle = not (inc.pending or inc.redo_left)
        if (journal.compacting or (idle and journal.compact_due)) and not self.waiting():
            began, problem = journal.compacting, journal.problem
            if journal.compact(COMPACT_STEP_S) and began:  # a step; the next goes on
                if journal.problem != problem:
                    log.warning("journal %s", journal.problem)
                else:
                    log.info("journal compacted records=%d", len(journal))


class Shrink:
    """A layer due to give CPUs back (``Incremental.shrink_due``): a re-layer."""

    def __init__(self, inc: Incremental, state: AgentState, relayer: Callable[..., object]) -> None:
        self.inc, self.state, self.relayer = inc, state, relayer

    def wake(self) -> float | None:
        return self.inc.shrink_due

    def run(self) -> None:
        if ready(self.inc.shrink_due) and not self.state.disabled:
            self.relayer("shrink", self.inc.why)


class Watch:
    """The watch's tick and the ends of its boosts (``hostd.agent.watch``)."""

    def __init__(self, watcher: WatchLoop, state: AgentState, waiting: Waiting) -> None:
        self.watcher, self.state, self.waiting = watcher, state, waiting

    def wake(self) -> float | None:
        return self.watcher.next_due()

    def run(self) -> None:
        now = time.monotonic()
        if now >= self.watcher.next_due() and not self.state.disabled:
            self.watcher.run_due(now, self.waiting)


class Relook:
    """A second look at unsettled unnamed job threads (``Agent.relook``), while there are some,
    in a step without events."""

    def __init__(
        self, cache: TaskCache, state: AgentState, relook: Callable[[], None], waiting: Waiting
    ) -> None:
        self.cache, self.state, self.relook, self.waiting = cache, state, relook, waiting
        self.at = 0.0  # monotonic time of the next relook (while threads are unsettled)

    def wake(self) -> float | None:
        return self.at if self.cache.unsettled and not self.state.disabled else None

    def run(self) -> None:
        if ready(self.wake()) and not self.waiting():
            self.at = time.monotonic() + RELOOK_S
            self.relook()


class Resize:
    """The sizer's tick (``hostd.agent.sizer``): a re-layer when a layer's count changed."""

    def __init__(self, sizer: Sizer, state: AgentState, relayer: Callable[..., object]) -> None:
        self.sizer, self.state, self.relayer = sizer, state, relayer

    def wake(self) -> float | None:
        return self.sizer.due if self.sizer.wanted and not self.state.disabled else None

    def run(self) -> None:
        if ready(self.wake()) and self.sizer.tick():
            self.relayer("resize")  # a layer's count changed


def stats_overdue(stats: LayerStats) -> bool:
    """Whether a sample has waited ``STATS_FLOOR_S`` past its due time (to begin) or its last
    slice (to go on): in a storm that lasts, events always wait, and a sample still begins and
    ends (1 % of a CPU)."""
    return time.monotonic() - max(stats.due, stats.last_slice) >= STATS_FLOOR_S


class Stats:
    """The layers' statistics (``hostd.agent.layerstats``), a slice a step; what a sample found
    goes into the status file at once (``say``)."""

    def __init__(
        self, stats: LayerStats, state: AgentState, say: Callable[[], None], waiting: Waiting
    ) -> None:
        self.stats, self.state, self.say, self.waiting = stats, state, say, waiting

    def wake(self) -> float | None:
        return self.stats.due if self.stats.wanted else None

    def run(self) -> None:
        stats = self.stats  # no reads when nobody scrapes or records
        due = ready(stats.due) and stats.wanted and not self.state.disabled
        if due and (not self.waiting() or stats_overdue(stats)) and stats.sample(STATS_STEP_S):
            self.say()


ORDER = (Close, Joins, Redo, Compact, Shrink, Watch, Relook, Resize, Stats)

"""The watch's hands: what its parts (``sampling``, ``demotion``, ``weights``, ``guard``) share to
find threads and change them, in place of the agent.

``Applier`` looks threads up in the agent's ``TaskCache`` (one by its key, a session's by its
processes), decides threads again with the planner of the last full plan (``Incremental``) and
applies the difference through the agent's reconcile (``redecide``, its outcomes counted with
the agent's); it also keeps the watch's own counters and its recent decisions (``note``), which
the status document shows. ``hostd.agent.watch.WatchLoop`` makes one.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from hostd.agent.state import log_problems
from hostd.plan import may_touch
from hostd.preempt import Key
from hostd.reconcile import Observed, PassReport, desired_for_tasks

if TYPE_CHECKING:
    from hostd.agent.incremental import Incremental
    from hostd.model.tasks import Task
    from hostd.tasks import TaskCache


class Applier:
    def __init__(
        self,
        cache: TaskCache,
        inc: Incremental,
        exclude: frozenset[int],
        base_affinity: Callable[[tuple[int, int]], frozenset[int] | None],
        reconcile: Callable[..., PassReport],
        outcomes: Counter[str],
    ) -> None:
        self.cache, self.inc, self.exclude = cache, inc, exclude
        self.base_affinity, self.reconcile = base_affinity, reconcile
        self.outcomes = outcomes  # the agent's counters, where every write's outcome is counted
        self.counters: Counter[str] = Counter()  # the watch's own
        self.recent: deque[dict] = deque(maxlen=20)

    def task(self, key: Key) -> Task | None:
        task = self.cache.tasks.get(key[0])
        return task if task is not None and task.start_time == key[1] else None

    def session_tasks(self, pids: list[int]) -> list[Task]:
        cache = self.cache
        return [
            task
            for pid in pids
            for tid in sorted(cache.members.get(pid, ()))
            if (task := cache.tasks.get(tid)) is not None
        ]

    def redecide(self, tasks: list[Task], override: dict | None = None) -> PassReport:
        """Decide these threads again with the planner and apply the difference (``override``:
        knob values that win over the plan's, a boost)."""
        planner = self.inc.planner
        if planner is None or not tasks:
            return PassReport()
        items = [
            item
            for task in tasks
            if (item := self.inc.classified.get(task.tid)) is not None
            and may_touch(item, planner.layers, self.exclude)
        ]
        plans = []
        for item in items:
            tp, _ = planner.decide(item, self.base_affinity(item.task.key))
            if tp is not None:
                plans.append(tp)
        want = desired_for_tasks(plans)
        want.update(override or {})
        report = self.reconcile(
            want, Observed(item.task for item in items), only=[item.task.key for item in items]
        )
        for r in report.results:
            self.outcomes[r.outcome] += 1
        log_problems(report)
        return report

    def note(self, what: str, why: str, **about: object) -> None:
        self.recent.append({"time": round(time.time(), 3), "what": what, "why": why, **about})

"""The incremental planner: the last full pass's decisions, kept true thread by thread.

A full pass sets ``plan`` (every layer's CPUs), ``planner`` (``hostd.plan.TaskPlanner``: one
thread's knobs from that plan) and what every thread was classified as. An event pass then
``classify``-es just the threads its events name (keeping the per-layer counts), ``decide``-s
them with the same planner and applies the difference: milliseconds, however many threads the
host has. Two things it leaves for later:

* joining a cpuset (``pending``): it takes the cgroup core's thread-group lock for writing,
  which waits out every fork in flight (milliseconds per thread in a thread storm); a new
  thread's affinity already keeps it on its layer's CPUs, so it joins a moment later, when no
  event waits (``take_joins``). Going back home from a hostd cpuset cannot wait: its affinity
  would not fit the cpuset it is in;
* a layer whose CPU share changes because events moved threads into or out of it
  (``check_sizes``): a full re-plan soon, at most one per 20 times a full pass's cost; a layer
  that grew within a second, one that shrank after 30 s (a short-lived matching process must
  not make the host flap).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable

from hostd import knobkinds, knobs
from hostd.agent.events import Batch
from hostd.classify import Classified, Classifier
from hostd.host.syscalls import POLICY_NUMBERS
from hostd.model.cpus import home_of, parse_cpulist
from hostd.model.tasks import Task
from hostd.model.topology import Topology
from hostd.plan import NumaPlan, Plan, TaskPlan, TaskPlanner, layer_want, may_touch, smt_width_of
from hostd.policy import Policy
from hostd.reconcile import PassReport, desired_for_tasks
from hostd.tasks import TaskCache

log = logging.getLogger("hostd")
GROW_S, SHRINK_S = 1.0, 30.0  # how soon a layer that grew / shrank is planned again
REPLAN_COST = 20  # at most one re-plan per this many times a full pass's cost


class Incremental:
    def __init__(self, cache: TaskCache) -> None:
        self.cache = cache
        self.topology: Topology | None = None
        self.plan: Plan | None = None
        self.planner: TaskPlanner | None = None
        self.classified: dict[int, Classified] = {}
        self.layer_counts: Counter[str] = Counter()
        self.replan_due: float | None = None  # monotonic time of a full re-plan, if one is due
        # cpuset joins left for a quiet moment: key -> (cgroup path, the thread's affinity key,
        # its affinity value).
        self.pending: dict[str, tuple[object, str, object]] = {}

    def clear(self) -> None:
        """Before a full pass: the last pass's per-thread state goes before the next one's is
        built, not after (at 100k threads holding both was the agent's peak memory)."""
        self.plan, self.planner, self.classified = None, None, {}
        self.replan_due = None
        self.pending.clear()  # a full pass places every thread in its cpuset, or none

    def start(
        self, topology: Topology, plan: Plan, planner: TaskPlanner, items: list[Classified]
    ) -> None:
        self.topology, self.plan, self.planner = topology, plan, planner
        self.classified = {c.task.tid: c for c in items}
        # counted as the read-only commands count: every thread but hostd's own
        me = os.getpid()
        self.layer_counts = Counter(c.layer for c in items if c.task.pid != me)

    def drop(self, tid: int, cached: bool = True) -> Task | None:
        """Forget an exited thread everywhere (``cached``: the cache still holds it)."""
        task = self.cache.forget(tid) if cached else None
        item = self.classified.pop(tid, None)
        if item is not None:
            self.layer_counts[item.layer] -= 1
            task = task or item.task
        if task is not None and self.planner is not None:
            self.planner.forget(task.key, task.pid if task.pid not in self.cache.procs else None)
        return task

    def read(self, batch: Batch) -> tuple[list[Task], list[Task], dict[int, Task]]:
        """Bring the cache up to a batch of events: (threads that exited, threads named that
        are gone, the threads read again by tid)."""
        cache = self.cache
        exited = [t for t in map(self.drop, batch.exits) if t is not None]
        # A renamed leader changes the leader comm of all its threads; then read the named.
        renamed = (cache.renamed_leader(pid, comm) for pid, comm in batch.leaders.items())
        touched = {t.tid: t for tasks in renamed for t in tasks}
        touched.update((t.tid, t) for t in cache.refresh(batch.named.items(), batch.exec_pids))
        gone = (self.drop(tid, cached=False) for tid in batch.named if tid not in cache.tasks)
        return exited, [t for t in gone if t is not None], touched

    def classify(
        self, tasks: Iterable[Task], classifier: Classifier, exclude: frozenset[int]
    ) -> list[Classified]:
        """Classify threads read again; those hostd may change, to decide."""
        assert self.planner is not None
        layers = self.planner.layers
        items: list[Classified] = []
        for task in tasks:
            layer, group = classifier.matched_group(task)
            item = Classified(task, layer.name, group)
            old = self.classified.get(task.tid)
            if old is not None:
                self.layer_counts[old.layer] -= 1
                if old.layer != item.layer:
                    self.planner.forget(task.key)
            self.layer_counts[item.layer] += 1
            self.classified[task.tid] = item
            if may_touch(item, layers, exclude):
                items.append(item)
        return items

    def decide(
        self,
        items: list[Classified],
        base_affinity: Callable[[tuple[int, int]], frozenset[int] | None],
    ) -> dict:
        """The knobs ``items`` want now, less the cpuset joins, which wait in ``pending``."""
        assert self.planner is not None
        task_plans: list[TaskPlan] = []
        numa_plans: list[NumaPlan] = []
        for item in items:
            tp, np_ = self.planner.decide(item, base_affinity(item.task.key))
            if tp is not None:
                task_plans.append(tp)
            if np_ is not None:
                numa_plans.append(np_)
        want = desired_for_tasks(task_plans, numa_plans)
        joins = [
            k for k, v in want.items() if knobkinds.kind_of(k) == "cpuset" and home_of(str(v)) != v
        ]
        for key in joins:
            affinity_key = key.rsplit("/", 1)[0] + "/affinity"
            self.pending[key] = (want.pop(key), affinity_key, want.get(affinity_key))
        return want

    def take_joins(self, budget: int) -> tuple[dict, dict]:
        """Up to ``budget`` waiting joins: (cpuset knobs, then the affinities to set again
        after them: joining a cpuset resets a thread's affinity)."""
        keys = list(itertools.islice(self.pending, budget))
        pending = [self.pending.pop(k) for k in keys]
        joins = {k: p[0] for k, p in zip(keys, pending, strict=True)}
        return joins, {p[1]: p[2] for p in pending if p[2] is not None}

    def check_sizes(self, policy: Policy, last_full: float, full_cost: float) -> None:
        """When events changed a layer's CPU share, set ``replan_due``."""
        if self.plan is None or self.topology is None or self.replan_due is not None:
            return
        total = len(self.topology.online)
        width = smt_width_of(self.topology)
        for lp in self.plan.layers:
            if lp.kind == "open" or policy.layer(lp.name).self_sizing:
                continue  # a self-sizing layer's count is the sizer's (hostd.agent.sizer)
            want = layer_want(policy.layer(lp.name), self.layer_counts[lp.name], total, width)
            if want != lp.wanted:
                wait = GROW_S if want > lp.wanted else SHRINK_S
                self.replan_due = max(
                    time.monotonic(), last_full + max(wait, REPLAN_COST * full_cost)
                )
                log.info("replan layer=%s wanted=%d now=%d", lp.name, lp.wanted, want)
                return

    def note_applied(self, report: PassReport) -> None:
        """Keep the cached threads true to what was just written, so that the next event pass
        (which decides from the cache) sees hostd's own changes: a thread created in a cpuset
        hostd moved its process into, a second write skipped."""
        for r in report.results:
            if r.outcome not in ("applied", "restored") or not knobs.is_task_key(r.key):
                continue
            tid, start = knobs.parse_task_key(r.key)
            task = self.cache.tasks.get(tid)
            if task is None or task.start_time != start:
                continue
            kind, value = knobkinds.kind_of(r.key), r.value
            if kind == "affinity":
                task.affinity = parse_cpulist(str(value))
            elif kind == "nice" and isinstance(value, int):
                task.nice = value
            elif kind == "sched" and isinstance(value, list):
                task.policy, task.rt_priority = POLICY_NUMBERS.get(value[0], task.policy), value[1]
            elif kind == "cpuset" and tid == task.pid:
                self.cache.moved(task.pid, str(value))

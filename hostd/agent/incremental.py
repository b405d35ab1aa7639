"""The incremental planner: the last full pass's decisions, kept true thread by thread.

A full pass sets ``plan`` (every layer's CPUs), ``planner`` (``hostd.plan.TaskPlanner``: one
thread's knobs from that plan) and what every thread was classified as. An event pass then
``classify``-es just the threads its events name (keeping the per-layer counts), ``decide``-s
them with the same planner and applies the difference: milliseconds, however many threads the
host has. Three things it does apart:

* a layer whose CPU count changes (its first member, its last one gone, a resize by the sizer):
  ``relayer`` plans the layers' CPUs again from their members alone (``hostd.plan.layers``), with
  a new planner, and gives back the knobs to write now (the cpusets, the members of the layers
  whose CPUs changed); the threads that only use the shared pool, which may be most of the host,
  wait in ``redo`` and are decided again a few at a time (``take_redo``), as are the IRQs and
  cpufreq settings. A layer grows at once (``check_sizes``), and gives CPUs back only after its
  count stayed lower for ``[sizing] shrink_after`` (a short-lived matching process must not make
  the host flap);
* joining a cpuset (``pending``): it takes the cgroup core's thread-group lock for writing,
  which waits out every fork and exit in flight and holds up every new one (milliseconds per
  thread in a thread storm, seconds when those in flight wait for a crowded CPU), and records
  one more original; a new thread's affinity already keeps it on its layer's CPUs, so it joins
  once it has lived ``JOIN_AFTER_S`` and no event came for a moment (``take_joins``,
  ``hostd.agent.parts.Joins``), a longer one after a join that was slow (``Joins.backoff``):
  the threads a crowded CPU keeps alive past ``JOIN_AFTER_S`` in a storm make one slow join at
  most, then wait for the storm's end. Going back home from a hostd cpuset cannot wait: its
  affinity would not fit the cpuset it is in;
* what the kernel and the planner of a full pass know better (a topology change, a cpuset no
  layer uses any more): the next full pass.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from hostd import knobkinds, knobs
from hostd.agent.events import Batch
from hostd.classify import Classified, Classifier
from hostd.host.syscalls import POLICY_NUMBERS
from hostd.model.cpus import format_cpulist, home_of, parse_cpulist, v2_group
from hostd.model.tasks import Task
from hostd.model.topology import Topology
from hostd.plan import NumaPlan, Plan, TaskPlan, TaskPlanner, layer_want, may_touch, smt_width_of
from hostd.plan.cpufreq import plan_cpufreq
from hostd.plan.irq import plan_irqs
from hostd.plan.layers import may_split, plan_cpusets, plan_layers
from hostd.plan.numa import _target_node
from hostd.plan.values import LayerPlan
from hostd.policy import Policy
from hostd.reconcile import HOST_PREFIXES, PassReport, desired_for_tasks, desired_state
from hostd.tasks import TaskCache

log = logging.getLogger("hostd")
JOIN_AFTER_S = 1.0  # a new thread joins its layer's cpuset once it has lived this long
READ_CHUNK = 256  # threads read per event pass, newest first; the older ones wait (``backlog``)
OVERDUE_S = 1.0  # a thread named this long ago is read before the newest (a quarter of a pass)


class Incremental:
    def __init__(self, cache: TaskCache) -> None:
        self.cache = cache
        self.topology: Topology | None = None
        self.plan: Plan | None = None
        self.planner: TaskPlanner | None = None
        self.classified: dict[int, Classified] = {}
        self.layer_counts: Counter[str] = Counter()
        # threads hostd may touch, per layer (the plan's count), and their tids in the layers
        # that have CPUs of their own
        self.counts: Counter[str] = Counter()
        self.members: dict[str, set[int]] = {}
        self.shrink_due: float | None = None  # monotonic time a layer gives CPUs back
        self.why = ""  # what the last check_sizes found, in words
        # After a re-layer: the layers whose threads are decided again, the tids still to look
        # at (listed at the first take_redo: a copy of 100k keys takes a millisecond, picking
        # out a layer's threads twenty), and the IRQ and cpufreq knobs it wants.
        self.redo_layers: set[str] = set()
        self.redo: list[int] | None = None
        self.redo_host: dict | None = None
        self.redo_stale: set[str] = set()  # IRQ and cpufreq keys earlier plans wanted
        # cpuset joins left for a quiet moment: (tid, start time) -> (cgroup path, the thread's
        # affinity value or None, when it is due), oldest first. Keyed by the thread, not by
        # its knob keys: in a storm every new thread of a layer with a cpuset waits here, and
        # most exit first (their keys are built only for the joins that are due).
        self.pending: dict[tuple[int, int], tuple[object, object, float]] = {}
        # threads named by events and not read yet (tid -> (tgid, when named, its fork event's
        # stamp or 0)), oldest first: in a storm of new threads the newest are read first, as
        # they have the most life left to use what they get; an older one that exits meanwhile
        # costs nothing.
        self.backlog: dict[int, tuple[int, float, int]] = {}
        self.born: dict[int, int] = {}  # the threads the last ``read`` read: their fork stamps

    def clear(self) -> None:
        """Before a full pass: the last pass's per-thread state goes before the next one's is
        built, not after (at 100k threads holding both was the agent's peak memory)."""
        self.plan, self.planner, self.classified = None, None, {}
        self.members, self.counts = {}, Counter()
        self.shrink_due, self.redo, self.redo_host = None, None, None
        self.redo_layers, self.redo_stale = set(), set()
        self.pending.clear()  # a full pass places every thread in its cpuset, or none
        self.backlog.clear()  # and reads every thread
        self.born = {}

    def start(
        self, topology: Topology, plan: Plan, planner: TaskPlanner, items: list[Classified]
    ) -> None:
        self.topology, self.plan, self.planner = topology, plan, planner
        # the threads hostd may touch per layer: the plan counted them (one pass over 100k
        # threads, not two); the members of the layers with CPUs, by tid
        self.counts = Counter({lp.name: lp.threads for lp in plan.layers if lp.threads})
        self.members = members = {
            ly.name: set() for ly in planner.layers.values() if ly.kind != "open"
        }
        layers, exclude = planner.layers, planner.exclude_pids
        self.classified = classified = {}
        counts: dict[str, int] = {}  # as the read-only commands count: all but hostd's own
        me = os.getpid()
        for c in items:  # one loop over every thread
            task, layer = c.task, c.layer
            classified[task.tid] = c
            if task.process.pid != me:
                counts[layer] = counts.get(layer, 0) + 1
            tids = members.get(layer)
            if tids is not None and may_touch(c, layers, exclude):
                tids.add(task.tid)
        self.layer_counts = Counter(counts)

    def _count(self, item: Classified, delta: int) -> None:
        """Count a thread hostd may touch in (or out of) its layer."""
        assert self.planner is not None
        if not may_touch(item, self.planner.layers, self.planner.exclude_pids):
            return
        self.counts[item.layer] += delta
        tids = self.members.get(item.layer)
        if tids is not None:
            (tids.add if delta > 0 else tids.discard)(item.task.tid)

    def drop(self, tid: int, cached: bool = True) -> Task | None:
        """Forget an exited thread everywhere (``cached``: the cache still holds it)."""
        task = self.cache.forget(tid) if cached else None
        item = self.classified.pop(tid, None)
        if item is not None:
            self.layer_counts[item.layer] -= 1
            self._count(item, -1)
            task = task or item.task
        if task is not None:
            if self.pending:  # a join it waited for: nothing to move any more
                self.pending.pop(task.key, None)
            if self.planner is not None:
                pid = task.pid if task.pid not in self.cache.procs else None
                self.planner.forget(task.key, pid)
        return task

    def read(self, batch: Batch) -> tuple[list[Task], list[Task], dict[int, Task]]:
        """Bring the cache up to a batch of events: (threads that exited, threads named that
        are gone, the threads read again by tid). Of the threads named, in this batch and
        before, ``READ_CHUNK`` are read: first up to a quarter of them among those named
        ``OVERDUE_S`` ago or more (a storm's own threads are gone by then; an endless storm must
        not keep a long-lived thread waiting for ever), then the newest. The rest stay in
        ``backlog`` for the next passes. Those of processes that exec'd are read at once, with
        their whole process."""
        cache, backlog = self.cache, self.backlog
        for tid in batch.exits:
            backlog.pop(tid, None)
        exited = [t for t in map(self.drop, batch.exits) if t is not None]
        # A renamed leader changes the leader comm of all its threads; then read the named.
        renamed = (cache.renamed_leader(pid, comm) for pid, comm in batch.leaders.items())
        touched = {t.tid: t for tasks in renamed for t in tasks}
        named = {t: p for t, p in batch.named.items() if p in batch.exec_pids}
        self.born = {t: batch.born[t] for t in named if t in batch.born}
        now = time.monotonic()
        for tid, pid in batch.named.items():
            if pid not in batch.exec_pids:
                old = backlog.pop(tid, None)  # named again: among the newest now
                backlog[tid] = (pid, now, batch.born.get(tid) or (old[2] if old else 0))
        taken = []
        if len(backlog) > READ_CHUNK:
            overdue = itertools.takewhile(lambda t: now - backlog[t][1] >= OVERDUE_S, backlog)
            taken = [(t, backlog.pop(t)) for t in list(itertools.islice(overdue, READ_CHUNK // 4))]
        while backlog and len(named) + len(taken) < READ_CHUNK:
            taken.append(backlog.popitem())  # the newest
        for tid, (pid, _, born) in taken:
            named[tid] = pid
            if born:
                self.born[tid] = born
        touched.update((t.tid, t) for t in cache.refresh(named.items(), batch.exec_pids))
        gone = (self.drop(tid, cached=False) for tid in named if tid not in cache.tasks)
        return exited, [t for t in gone if t is not None], touched

    def classify(
        self, tasks: Iterable[Task], classifier: Classifier, exclude: frozenset[int]
    ) -> list[Classified]:
        """Classify threads read again; those hostd may change, to decide."""
        assert self.planner is not None
        layers = self.planner.layers
        items: list[Classified] = []
        for task in tasks:
            layer, group = classifier.twin(task)
            item = Classified(task, layer.name, group)
            old = self.classified.get(task.tid)
            if old is not None:
                self.layer_counts[old.layer] -= 1
                self._count(old, -1)
                if old.layer != item.layer:
                    self.planner.forget(task.key)
            self.layer_counts[item.layer] += 1
            self._count(item, 1)
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
        joins: list[TaskPlan] = []
        for item in items:
            tp, np_ = self.planner.decide(item, base_affinity(item.task.key))
            if tp is not None:
                task_plans.append(tp)
                if tp.cpuset is not None and home_of(tp.cpuset) != tp.cpuset:  # a join
                    joins.append(tp)
            if np_ is not None:
                numa_plans.append(np_)
        want = desired_for_tasks(task_plans, numa_plans, held={tp.tid for tp in joins})
        if self.pending:  # decided again: a join decided before no longer holds
            for item in items:
                self.pending.pop(item.task.key, None)
        due = time.monotonic() + JOIN_AFTER_S
        for tp in joins:
            affinity = None if tp.affinity is None else format_cpulist(tp.affinity)
            self.pending[(tp.tid, tp.start_time)] = (tp.cpuset, affinity, due)
        return want

    def joins_due(self) -> float | None:
        """When the oldest waiting join is due (None: none waits)."""
        return next(iter(self.pending.values()))[2] if self.pending else None

    def take_joins(self, budget: int) -> tuple[dict, dict]:
        """Up to ``budget`` waiting joins that are due: (cpuset knobs, then the affinities to
        set again after them: joining a cpuset resets a thread's affinity)."""
        now = time.monotonic()
        due = itertools.takewhile(lambda k: self.pending[k][2] <= now, self.pending)
        threads = list(itertools.islice(due, budget))
        joins, affinities = {}, {}
        for tid, start in threads:
            cpuset, affinity, _ = self.pending.pop((tid, start))
            joins[knobs.task_key(tid, start, "cpuset")] = cpuset
            if affinity is not None:
                affinities[knobs.task_key(tid, start, "affinity")] = affinity
        return joins, affinities

    def check_sizes(self, policy: Policy, sizes: dict[str, int]) -> bool:
        """Whether a layer's CPU count must change now (True: it grows, ``relayer`` now; ``why``
        says which). A layer that wants fewer sets ``shrink_due``, cleared when none does."""
        if self.plan is None or self.topology is None:
            return False
        total = len(self.topology.online)
        width = smt_width_of(self.topology)
        shrink = ""
        for lp in self.plan.layers:
            if lp.kind == "open":
                continue
            layer, n = policy.layer(lp.name), self.counts[lp.name]
            if layer.self_sizing and n and lp.name in sizes:
                want = sizes[lp.name]  # the sizer's count (hostd.agent.sizer)
            else:
                want = layer_want(layer, n, total, width)
            if want > lp.wanted:
                self.why = f"layer={lp.name} threads={n} wanted={lp.wanted}->{want}"
                return True
            if want < lp.wanted and not shrink:
                shrink = f"layer={lp.name} threads={n} wanted={lp.wanted}->{want}"
        if not shrink:
            self.shrink_due = None
        elif self.shrink_due is None:
            self.shrink_due = time.monotonic() + policy.sizing.shrink_after
            self.why = shrink
        return False

    def homeless(self, items: list[Classified], policy: Policy) -> bool:
        """On cgroup v2: whether one of these members of a layer with CPUs of its own lives in a
        home cgroup without that layer's cpuset (``G/hostd.<layer>``) yet, where the policy lets
        hostd make one (``may_split``); ``relayer`` makes it (``why`` says which)."""
        planner = self.planner
        if planner is None or not planner.v2:
            return False
        for item in items:
            name, cpuset = item.layer, item.task.process.cpuset
            if not cpuset or not planner.layer_cpus.get(name):
                continue
            if item.task.tid in self.members.get(name, ()):
                home = home_of(cpuset)
                if v2_group(home, name) not in planner.groups and may_split(home, policy):
                    self.why = f"layer={name} home={home}"
                    return True
        return False

    def relayer(
        self, policy: Policy, sizes: dict[str, int], homes_only: bool = False
    ) -> tuple[dict, list[Classified], str] | None:
        """Plan the layers' CPUs again from their members now, keeping every other decision
        (``homes_only``: keep the layers' CPUs too, and only add the v2 cpusets that members'
        new home cgroups lack; a shrink still waits for its time).

        Returns the knobs to write now (hostd's cpusets), the threads of the layers whose CPUs
        changed, to decide now, and what moved, in words; the threads that use the pool, and the
        IRQ and cpufreq knobs, wait in ``redo``/``redo_host``. None when nothing changes.
        """
        old, topo, planner = self.plan, self.topology, self.planner
        assert old is not None and topo is not None and planner is not None
        if homes_only:
            return self._relayer(policy, {lp.name: lp for lp in old.layers}, old.pool)
        self.shrink_due = None
        targets: dict[str, Counter[int]] = {}
        for name, tids in self.members.items():
            if planner.layers[name].numa == "gpu-local":
                for tid in tids:  # a new member's process may not have its target yet
                    process = self.classified[tid].task.process
                    if process.pid not in planner.targets:
                        planner.targets[process.pid] = _target_node(topo, process)
                nodes = (planner.targets[self.classified[t].task.pid] for t in tids)
                targets[name] = Counter(n for n in nodes if n is not None)
        current = {lp.name: lp.cpus for lp in old.layers}
        layer_plans, pool = plan_layers(
            topo, policy, self.counts, targets, sizes=sizes, current=current
        )
        return self._relayer(policy, layer_plans, pool)

    def _relayer(
        self, policy: Policy, layer_plans: dict[str, LayerPlan], pool: frozenset[int]
    ) -> tuple[dict, list[Classified], str] | None:
        old, topo, planner = self.plan, self.topology, self.planner
        assert old is not None and topo is not None and planner is not None
        current = {lp.name: lp.cpus for lp in old.layers}
        layer_cpus = {n: lp.cpus for n, lp in layer_plans.items() if lp.kind != "open"}
        moved = {n for n, cpus in layer_cpus.items() if cpus != current.get(n)}
        if pool != old.pool:  # every layer whose threads may use the pool
            moved |= {
                ly.name for ly in policy.layers if ly.kind != "confined" or not layer_cpus[ly.name]
            }
        homes: dict[str, set[str]] = {}
        for name, tids in self.members.items():
            for tid in tids:
                cpuset = self.classified[tid].task.process.cpuset
                if cpuset:
                    homes.setdefault(name, set()).add(home_of(cpuset))
        groups = plan_cpusets(topo, policy, layer_cpus, pool, homes)
        added = sorted(set(groups) - set(planner.groups))  # v2: a member's new home
        if not moved and not added:
            self.plan = replace(old, layers=tuple(layer_plans.values()))
            return None
        before = desired_state(replace(old, tasks=(), numa=()), ())
        self.redo_stale |= {k for k in before if k.startswith(HOST_PREFIXES)}
        scratch: list[str] = []  # the full pass's notes stay those of the full pass
        self.plan = replace(
            old,
            pool=pool,
            layers=tuple(layer_plans.values()),
            tasks=(),  # the full pass's per-thread decisions; since then, the planner's
            irqs=tuple(sorted(plan_irqs(topo, policy, layer_cpus, scratch), key=lambda p: p.irq)),
            cpufreq=tuple(plan_cpufreq(topo, policy, layer_cpus, scratch)),
            cpusets=tuple(groups[path] for path in sorted(groups)),
        )
        new = TaskPlanner(
            topo, policy, layer_cpus, pool, groups.values(), allow_rt=planner.allow_rt,
            exclude_pids=planner.exclude_pids, demoted=planner.demoted,
            runaways=planner.runaways, spared=planner.spared, weighted=planner.weighted,
        )  # fmt: skip
        new.targets, new.numa_done = planner.targets, planner.numa_done
        new.cpuset_pids, new.rt_holders = planner.cpuset_pids, planner.rt_holders
        self.planner = new
        host = desired_state(replace(self.plan, numa=()), ())
        self.redo_host = {k: v for k, v in host.items() if k.startswith(HOST_PREFIXES)}
        want = {k: v for k, v in host.items() if not k.startswith(HOST_PREFIXES)}
        now = [self.classified[t] for n in sorted(moved) for t in self.members.get(n, ())]
        # the open layers' threads (maybe most of the host): listed at the next take_redo
        later = {n for n in moved if n not in self.members}
        if later:
            self.redo_layers |= later
            self.redo = None
        moved_cpus = " ".join(
            f"{n}={format_cpulist(layer_cpus[n]) or '-'}" for n in sorted(moved & set(layer_cpus))
        )
        said = f"{moved_cpus} pool={format_cpulist(pool)}".strip()
        if added:
            said += f" cgroups=+{',+'.join(added)}"
        return want, now, said

    @property
    def redo_left(self) -> bool:
        """Whether a re-layer left threads or host knobs to decide again."""
        return bool(self.redo_layers or self.redo_host)

    def take_redo(self, count: int) -> list[Classified]:
        """Up to ``count`` threads of the layers a re-layer left (looking at a few hundred)."""
        assert self.planner is not None
        if self.redo is None:
            self.redo = list(self.classified)
        layers, exclude = self.planner.layers, self.planner.exclude_pids
        out: list[Classified] = []
        for _ in range(min(len(self.redo), 64 * count)):
            item = self.classified.get(self.redo.pop())
            wanted = item is not None and item.layer in self.redo_layers
            if wanted and may_touch(item, layers, exclude):
                out.append(item)
                if len(out) == count:
                    break
        if not self.redo:
            self.redo_layers, self.redo = set(), None
        return out

    def note_applied(self, report: PassReport) -> None:
        """Keep the cached threads true to what was just written, so that the next event pass
        (which decides from the cache) sees hostd's own changes: a thread created in a cpuset
        hostd moved its process into, a second write skipped."""
        made = knobs.MADE
        for r in report.results:
            if r.outcome not in ("applied", "restored") or not knobs.is_task_key(r.key):
                continue
            said = made.get(r.key)  # (the keys of an event pass: made by it)
            (tid, start), kind = said or (knobs.parse_task_key(r.key), knobkinds.kind_of(r.key))
            task = self.cache.tasks.get(tid)
            if task is None or task.start_time != start:
                continue
            value = r.value
            if kind in ("affinity", "nice", "sched"):
                task.line = 0  # no longer its stat line's values: the next full pass reads it
            if kind == "affinity":
                task.affinity = parse_cpulist(str(value))
            elif kind == "nice" and isinstance(value, int):
                task.nice = value
            elif kind == "sched" and isinstance(value, list):
                task.policy, task.rt_priority = POLICY_NUMBERS.get(value[0], task.policy), value[1]
            elif kind == "cpuset" and tid == task.pid:
                self.cache.moved(task.pid, str(value))

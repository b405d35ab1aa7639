"""Preemptible work, applied: a busy session demoted while the job runs, and given back.

* **demote** a session: its record ``session/SID@TICK/preempted`` (the original policy of its
  threads) is journaled first, then its preemptible threads get SCHED_IDLE and its leader's
  autogroup the ``session_nice`` (the planner decides them, knowing the session is demoted);
  threads born in it later are decided idle by the planner and journaled with the session's
  original (``inherited``), never with the SCHED_IDLE they were born with; its own cgroup is
  weighed down too where nothing else is in it (``hostd.agent.weights``); what it is on the node
  is kept for the status (``where_of``);
* **release** it: the record is restored first (a sweep of every SCHED_IDLE thread born in the
  session since), then its threads are decided again, which gives back their own records.

It works through the host door, the journal, the watch's ``Applier`` (threads found, decided
again and applied) and its ``GroupWeights``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from hostd import knobkinds, knobs
from hostd.journal import JournalError
from hostd.plan import NORMAL_POLICIES
from hostd.policy import Preempt
from hostd.preempt import Watch, why_place_kept
from hostd.reconcile import DONE, restore_keys

if TYPE_CHECKING:
    from hostd.agent.applier import Applier
    from hostd.agent.state import AgentState
    from hostd.agent.weights import GroupWeights
    from hostd.host import Host
    from hostd.journal import Journal
    from hostd.model.node import Place

log = logging.getLogger("hostd")
DEFAULT_KEEP = Preempt()  # what the default [preempt] keep_* never demotes: the infrastructure


def where_of(places: list[Place]) -> dict:
    """What a demoted session is on the node (status.json, ``hostd_demoted_sessions_by_kind``):
    the kind of its leader's place (``places[0]``), its pod's namespace, and whether the default
    ``[preempt] keep_*`` keep any of its places: the node's infrastructure, which only a policy
    edited so demotes."""
    first = places[0] if places else None
    return {
        "kind": first.kind if first is not None else "other",
        "namespace": first.namespace if first is not None else "",
        "infrastructure": any(why_place_kept(p, DEFAULT_KEEP) is not None for p in places),
    }


class Demotions:
    def __init__(
        self,
        host: Host,
        journal: Journal,
        state: AgentState,
        watch: Watch,
        applier: Applier,
        weights: GroupWeights,
    ) -> None:
        self.host, self.journal, self.state = host, journal, state
        self.watch, self.applier, self.weights = watch, applier, weights
        self.keys: dict[int, str] = {}  # demoted session -> its journal key
        self.since: dict[int, int] = {}  # demoted session -> the tick it was demoted at
        self.typical: dict[int, list] = {}  # demoted session -> its threads' original policy
        self.where: dict[int, dict] = {}  # demoted session -> what it is on the node (where_of)

    def clear(self) -> None:
        self.keys.clear()
        self.since.clear()
        self.typical.clear()
        self.where.clear()

    def inherited(self, key: str, current: object) -> object:
        """The original to journal for ``key``: a thread born SCHED_IDLE in a demoted session
        (it inherited that from a thread hostd demoted) has its session's original policy."""
        if type(current) is not list or current[0] != "idle" or knobkinds.kind_of(key) != "sched":
            return current
        tid, start = knobs.parse_task_key(key)
        task = self.applier.cache.tasks.get(tid)
        if task is None:
            return current
        sid = task.process.session
        since = self.since.get(sid)
        if since is None or start < since:
            return current
        return list(self.typical[sid])

    def demote(self, sid: int, demand: float, sessions: dict[int, list[int]]) -> None:
        applier, journal = self.applier, self.journal
        planner, cache = applier.inc.planner, applier.cache
        assert planner is not None
        tasks = applier.session_tasks(sessions.get(sid, []))
        preemptible = self.state.policy.preemptible
        originals: Counter[tuple] = Counter()
        for task in tasks:
            item = applier.inc.classified.get(task.tid)
            if item is None or item.layer not in preemptible or task.policy not in NORMAL_POLICIES:
                continue
            key = knobs.task_key(task.tid, task.start_time, "sched")
            orig = journal.original(key) if key in journal else None
            if not isinstance(orig, list):
                orig = [task.policy_name, task.rt_priority, False]
            originals[tuple(orig)] += 1
        typical = list(originals.most_common(1)[0][0]) if originals else ["other", 0, False]
        since = max(0, self.host.ticks_now() - 1)
        leader = cache.procs.get(sid)
        key = knobs.session_key(sid, since)
        if self.state.mode == "enforce":
            leader_start = leader.start_time if leader is not None else None
            try:
                journal.record([(key, {"sched": typical, "leader_start": leader_start})])
            except JournalError as exc:  # no durable record: no demotion
                self.watch.demoted.pop(sid, None)
                applier.outcomes["unjournaled"] += 1
                log.error("preempt demote session=%d not done: %s", sid, exc)
                return
        self.keys[sid], self.since[sid], self.typical[sid] = key, since, typical
        leads = [leader.node] if leader is not None else []
        nodes = sorted({t.process.node for t in tasks}, key=lambda p: (p.kind, p.unit))
        self.where[sid] = where_of(leads + nodes)
        planner.demoted.add(sid)
        report = applier.redecide(tasks)
        who = f"{leader.comm}({sid})" if leader is not None else f"session {sid}"
        log.info(
            "preempt demote session=%d leader=%r wants=%.2f-cpus threads=%d applied=%d",
            sid, leader.comm if leader is not None else "", demand, len(tasks),
            report.counts.get("applied", 0),
        )  # fmt: skip
        applier.counters["demotions"] += 1
        applier.note("demote", f"session of {who} wanted {demand:.2f} CPUs", session=sid)
        self.weights.weigh(sid, sessions)

    def release(self, sid: int, why: str, sessions: dict[int, list[int]]) -> None:
        applier, journal = self.applier, self.journal
        planner = applier.inc.planner
        if planner is not None:
            planner.demoted.discard(sid)
        self.weights.leave(sid, why)
        key = self.keys.pop(sid, None)
        self.since.pop(sid, None)
        self.typical.pop(sid, None)
        self.where.pop(sid, None)
        if key is not None and self.state.mode == "enforce" and key in journal:
            for r in restore_keys(self.host, journal, [key]):
                applier.outcomes[r.outcome] += 1
                if r.outcome not in DONE:
                    log.warning("preempt release key=%s outcome=%s %s", key, r.outcome, r.detail)
        applier.redecide(applier.session_tasks(sessions.get(sid, [])))
        log.info("preempt release session=%d why=%r", sid, why)
        applier.counters["releases"] += 1
        applier.note("release", why, session=sid)

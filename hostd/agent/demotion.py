"""Preemptible work, applied: a busy session demoted while the job runs, and given back.

* **demote** a session: its record ``session/SID@TICK/preempted`` (the original policy of its
  threads) is journaled first, then its preemptible threads get SCHED_IDLE and its leader's
  autogroup the ``session_nice`` (the planner decides them, knowing the session is demoted);
  threads born in it later are decided idle by the planner and journaled with the session's
  original (``inherited``), never with the SCHED_IDLE they were born with; its own cgroup is
  weighed down too where nothing else is in it (``hostd.agent.weights``);
* **release** it: the record is restored first (a sweep of every SCHED_IDLE thread born in the
  session since), then its threads are decided again, which gives back their own records.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from hostd import knobkinds, knobs
from hostd.journal import JournalError
from hostd.plan import NORMAL_POLICIES
from hostd.reconcile import DONE, restore_keys

if TYPE_CHECKING:
    from hostd.agent.watch import WatchLoop

log = logging.getLogger("hostd")


class Demotions:
    def __init__(self, loop: WatchLoop) -> None:
        self.loop = loop
        self.keys: dict[int, str] = {}  # demoted session -> its journal key
        self.since: dict[int, int] = {}  # demoted session -> the tick it was demoted at
        self.typical: dict[int, list] = {}  # demoted session -> its threads' original policy

    def clear(self) -> None:
        self.keys.clear()
        self.since.clear()
        self.typical.clear()

    def inherited(self, key: str, current: object) -> object:
        """The original to journal for ``key``: a thread born SCHED_IDLE in a demoted session
        (it inherited that from a thread hostd demoted) has its session's original policy."""
        if type(current) is not list or current[0] != "idle" or knobkinds.kind_of(key) != "sched":
            return current
        tid, start = knobs.parse_task_key(key)
        task = self.loop.agent.cache.tasks.get(tid)
        if task is None:
            return current
        sid = task.process.session
        since = self.since.get(sid)
        if since is None or start < since:
            return current
        return list(self.typical[sid])

    def demote(self, sid: int, demand: float, sessions: dict[int, list[int]]) -> None:
        loop = self.loop
        agent = loop.agent
        planner, journal, cache = agent.planner, agent.journal, agent.cache
        assert planner is not None
        tasks = loop.session_tasks(sessions.get(sid, []))
        preemptible = agent.policy.preemptible
        originals: Counter[tuple] = Counter()
        for task in tasks:
            item = agent.inc.classified.get(task.tid)
            if item is None or item.layer not in preemptible or task.policy not in NORMAL_POLICIES:
                continue
            key = knobs.task_key(task.tid, task.start_time, "sched")
            orig = journal.original(key) if key in journal else None
            if not isinstance(orig, list):
                orig = [task.policy_name, task.rt_priority, False]
            originals[tuple(orig)] += 1
        typical = list(originals.most_common(1)[0][0]) if originals else ["other", 0, False]
        since = max(0, agent.host.ticks_now() - 1)
        leader = cache.procs.get(sid)
        key = knobs.session_key(sid, since)
        if agent.mode == "enforce":
            leader_start = leader.start_time if leader is not None else None
            try:
                journal.record([(key, {"sched": typical, "leader_start": leader_start})])
            except JournalError as exc:  # no durable record: no demotion
                loop.watch.demoted.pop(sid, None)
                log.error("preempt demote session=%d not done: %s", sid, exc)
                return
        self.keys[sid], self.since[sid], self.typical[sid] = key, since, typical
        planner.demoted.add(sid)
        report = loop.redecide(tasks)
        who = f"{leader.comm}({sid})" if leader is not None else f"session {sid}"
        log.info(
            "preempt demote session=%d leader=%r wants=%.2f-cpus threads=%d applied=%d",
            sid, leader.comm if leader is not None else "", demand, len(tasks),
            report.counts.get("applied", 0),
        )  # fmt: skip
        loop.counters["demotions"] += 1
        loop.note("demote", f"session of {who} wanted {demand:.2f} CPUs", session=sid)
        loop.weights.weigh(sid, sessions)

    def release(self, sid: int, why: str, sessions: dict[int, list[int]]) -> None:
        loop = self.loop
        agent = loop.agent
        planner, journal = agent.planner, agent.journal
        if planner is not None:
            planner.demoted.discard(sid)
        loop.weights.leave(sid, why)
        key = self.keys.pop(sid, None)
        self.since.pop(sid, None)
        self.typical.pop(sid, None)
        if key is not None and agent.mode == "enforce" and key in journal:
            for r in restore_keys(agent.host, journal, [key]):
                agent.counters[r.outcome] += 1
                if r.outcome not in DONE:
                    log.warning("preempt release key=%s outcome=%s %s", key, r.outcome, r.detail)
        loop.redecide(loop.session_tasks(sessions.get(sid, [])))
        log.info("preempt release session=%d why=%r", sid, why)
        loop.counters["releases"] += 1
        loop.note("release", why, session=sid)

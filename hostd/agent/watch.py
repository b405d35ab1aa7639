"""The agent's watch: preemptible work and the starvation guard (``hostd.preempt``), applied.

Every ``[preempt] interval`` seconds while it has something to watch (a protected layer with
threads, a demoted session, a real-time thread hostd made), ``WatchLoop.tick`` reads one
``/proc/PID/stat`` per process hostd knows (its CPU time and its leader's state) and, for the
processes that ran or are runnable, the threads of demoted sessions and hostd's real-time
threads, one ``/proc/PID/task/TID/schedstat`` and one ``stat`` (its state) per thread.
``hostd.preempt.Watch`` decides; this module applies through the agent's planner and journal:

* **demote** a session: its record ``session/SID@TICK/preempted`` (the original policy of its
  threads) is journaled first, then its preemptible threads get SCHED_IDLE and its leader's
  autogroup the ``session_nice``; threads born in it later are decided idle by the planner and
  journaled with the session's original (``inherited``), never with the SCHED_IDLE they were
  born with;
* a demoted session in a cgroup of its own: that cgroup's CPU weight (``cpu.idle = 1``, else
  the least weight, ``hostd.sched.group``) is journaled and written too, when everything in it
  is demoted work (``hostd.preempt.why_group_kept``), checked again every tick: a process of
  another session that joins it gives the cgroup its weight back at once;
* **release** it: the record is restored first (a sweep of every SCHED_IDLE thread born in the
  session since), then its threads are decided again, which gives back their own records;
* **boost** a starving thread: SCHED_FIFO one priority above the policy's real-time layers
  (journaled like any write) for ``boost_ms``, then the thread is decided again; the agent's
  own thread is SCHED_FIFO one above that while a boost is on, so that it wakes on time to end
  it, and at most all CPUs but one are boosted at once; where real-time is not allowed, a
  demoted thread gets its original policy back for that time;
* **runaway**: the real-time thread is decided again as SCHED_OTHER at nice -20.

Its own cost is measured; the interval is stretched to 20 times it (at most 5 % of a CPU).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from typing import TYPE_CHECKING

from hostd import knobkinds, knobs
from hostd.host import HostError
from hostd.host.parsers import parse_cgroup
from hostd.journal import JournalError
from hostd.model.cpus import home_of
from hostd.plan import NORMAL_POLICIES, may_touch
from hostd.policy import Policy
from hostd.preempt import (
    Key,
    Sample,
    Watch,
    demoted_summary,
    shielding_layers,
    why_group_kept,
    why_kept,
)
from hostd.reconcile import Observed, PassReport, desired_for_tasks, restore_keys
from hostd.sched import group

if TYPE_CHECKING:
    from hostd.agent import Agent
    from hostd.model.tasks import Task

log = logging.getLogger("hostd")
CLK_TCK = os.sysconf("SC_CLK_TCK")
MAX_GROUPS = 64  # a demoted session's cgroup with more cgroups below it is not weighed


def boost_value(policy: Policy) -> list:
    """What a starving thread gets for a moment: SCHED_FIFO above every real-time layer of the
    policy (so a runaway of hostd's cannot hold it off), with reset-on-fork."""
    top = max((ly.sched.priority or 0 for ly in policy.layers if ly.sched.realtime), default=0)
    return ["fifo", min(99, top + 1), True]


class WatchLoop:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        policy = agent.policy
        self.watch = Watch(policy.preempt, policy.guard, policy.preemptible)
        self.shielding = shielding_layers(policy)
        self.due = 0.0  # monotonic time of the next tick
        self.cost = 0.0  # seconds the last tick took
        self.boosted: dict[Key, float] = {}  # thread -> monotonic time its boost ends
        self.session_keys: dict[int, str] = {}  # demoted session -> its journal key
        self.since: dict[int, int] = {}  # demoted session -> the tick it was demoted at
        self.typical: dict[int, list] = {}  # demoted session -> its threads' original policy
        self.groups: dict[str, set[int]] = {}  # weighed-down cgroup's key -> sessions in it
        self._cpu: dict[int, tuple[int, int]] = {}  # pid -> (start time, CPU ticks)
        self._cpu_ticks = 0  # boot ticks when ``_cpu`` was read
        self._rt_self = False  # the agent holds SCHED_FIFO while a boost is on
        self.counters: Counter[str] = Counter()
        self.recent: deque[dict] = deque(maxlen=20)
        self._own_sid = os.getsid(0)
        self.changed = False  # something for status.json since it was last written

    def configure(self, policy: Policy) -> None:
        self.watch.configure(policy.preempt, policy.guard, policy.preemptible)
        self.shielding = shielding_layers(policy)

    # -- what is watched -------------------------------------------------------------------------
    def active(self) -> bool:
        """A protected layer has threads (the job is on this host)."""
        counts = self.agent.layer_counts
        return any(counts[name] > 0 for name in self.agent.policy.protected)

    def rt_keys(self) -> set[Key]:
        planner = self.agent.planner
        if planner is None:
            return set()
        return set().union(*planner.rt_holders.values()) if planner.rt_holders else set()

    def next_due(self) -> float:
        return min([self.due, *self.boosted.values()])

    def run_due(self, now: float) -> None:
        """Undo boosts that ended, and tick when due."""
        ended = [key for key, until in self.boosted.items() if until <= now]
        if ended:
            for key in ended:
                del self.boosted[key]
            self._redecide([t for key in ended if (t := self._task(key)) is not None])
            if not self.boosted:
                self._hold_rt(False)
        if now >= self.due:
            self.tick(now)

    def _hold_rt(self, on: bool) -> bool:
        """The agent's own thread SCHED_FIFO, one above the boost, while a boost is on: the
        boosted thread may spin, and only the agent, waking on time, ends its boost (else RT
        throttling would, after up to 0.95 s: measured, BENCHMARKS.md). Its own process: not
        journaled (the kernel forgets it with the process)."""
        if on == self._rt_self:
            return True
        try:
            if on:
                prio = min(99, boost_value(self.agent.policy)[1] + 1)
                flags = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
                os.sched_setscheduler(0, flags, os.sched_param(prio))
            else:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:
            log.info("guard agent real-time %s refused (%s)", "on" if on else "off", exc)
            return False
        self._rt_self = on
        return True

    # -- a tick ----------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        agent = self.agent
        interval = agent.policy.preempt.interval
        self.due = now + interval
        if agent.planner is None:
            return
        active = self.active()
        rt = self.rt_keys()
        if not (active or self.watch.demoted or (rt and agent.policy.guard.enabled)):
            self._cpu.clear()
            self._cpu_ticks = 0
            return
        started = time.perf_counter()
        samples, sessions, used = self.sample(rt)
        decisions = self.watch.update(
            now,
            samples,
            active=active,
            rt_keys=rt,
            kept=lambda sid: self.kept(sid, sessions),
            sessions_alive=lambda sid: sid in sessions,
            process_demand=used,
        )
        for dem in decisions.demote:
            self.demote(dem.sid, dem.demand, sessions)
        for sid, why in decisions.release:
            self.release(sid, why, sessions)
        for s in decisions.runaway:
            self.runaway(s)
        for s in decisions.boost:
            self.boost(s, now)
        self.check_groups()
        self.cost = time.perf_counter() - started
        self.counters["ticks"] += 1
        self.changed = self.changed or bool(decisions) or bool(self.watch.demoted)
        self.due = now + max(interval, 20 * self.cost)

    def sample(self, rt: set[Key]) -> tuple[list[Sample], dict[int, list[int]], dict[int, float]]:
        """Schedstat samples of the threads worth a look, every session's processes, and the
        CPUs each session's preemptible processes used since the last tick (their own CPU time
        and their reaped children's: a compiler that lived a tenth of a second shows in its
        parent's)."""
        agent = self.agent
        cache, host, demoted = agent.cache, agent.host, self.watch.demoted
        preemptible = agent.policy.preemptible
        rt_pids = {task.pid for tid, _ in rt if (task := cache.tasks.get(tid)) is not None}
        sessions: dict[int, list[int]] = {}
        used: dict[int, float] = {}
        looked: list[int] = []
        cpu: dict[int, tuple[int, int]] = {}
        now_ticks = host.ticks_now()
        since = self._cpu_ticks  # boot ticks at the last tick (0: none yet)
        span = (now_ticks - since) / CLK_TCK if since else 0.0
        for pid, proc in cache.procs.items():
            if proc.is_kthread or pid in agent.exclude:
                continue
            sessions.setdefault(proc.session, []).append(pid)
            got = host.process_cpu(pid)
            if got is None:
                continue
            state, ticks, reaped = got
            total = ticks + reaped
            prev = self._cpu.get(pid)
            cpu[pid] = (proc.start_time, total)
            same = prev is not None and prev[0] == proc.start_time
            ran = same and total != prev[1]
            if ran or state == "R" or proc.session in demoted or pid in rt_pids:
                looked.append(pid)
            if span <= 0:
                continue
            item = agent.classified.get(pid)
            if item is None or item.layer not in preemptible:
                continue
            if same:
                delta = total - prev[1]
            elif proc.start_time >= since:  # born since the last tick: all of it is new
                delta = total
            else:
                continue
            if delta > 0:
                used[proc.session] = used.get(proc.session, 0.0) + delta / CLK_TCK / span
        self._cpu = cpu
        self._cpu_ticks = now_ticks
        samples: list[Sample] = []
        for pid in looked:
            session = cache.procs[pid].session
            for tid in cache.members.get(pid, ()):
                task, item = cache.tasks.get(tid), agent.classified.get(tid)
                if task is None or item is None:
                    continue
                got = host.schedstat(pid, tid)
                state = host.thread_state(pid, tid)
                if got is not None and state is not None:
                    samples.append(
                        Sample(task.key, pid, session, item.layer, got[0], got[1], state)
                    )
        self.counters["samples"] += len(samples)
        return samples, sessions, used

    def kept(self, sid: int, sessions: dict[int, list[int]]) -> str | None:
        agent = self.agent
        cache = agent.cache
        pids = sessions.get(sid, [])
        layers = {
            item.layer
            for pid in pids
            for tid in cache.members.get(pid, ())
            if (item := agent.classified.get(tid)) is not None
        }
        return why_kept(
            sid,
            layers=layers,
            tty=any(cache.procs[pid].tty for pid in pids if pid in cache.procs),
            own_sid=self._own_sid,
            protected=agent.policy.protected,
            shielding=self.shielding,
        )

    # -- applying ------------------------------------------------------------------------------
    def _task(self, key: Key) -> Task | None:
        task = self.agent.cache.tasks.get(key[0])
        return task if task is not None and task.start_time == key[1] else None

    def _session_tasks(self, pids: list[int]) -> list[Task]:
        cache = self.agent.cache
        return [
            task
            for pid in pids
            for tid in sorted(cache.members.get(pid, ()))
            if (task := cache.tasks.get(tid)) is not None
        ]

    def _redecide(self, tasks: list[Task], override: dict | None = None) -> PassReport:
        """Decide these threads again with the planner and apply the difference (``override``:
        knob values that win over the plan's, a boost)."""
        agent = self.agent
        planner = agent.planner
        if planner is None or not tasks:
            return PassReport()
        items = [
            item
            for task in tasks
            if (item := agent.classified.get(task.tid)) is not None
            and may_touch(item, planner.layers, agent.exclude)
        ]
        plans = []
        for item in items:
            tp, _ = planner.decide(item, agent._base_affinity(item.task.key))
            if tp is not None:
                plans.append(tp)
        want = desired_for_tasks(plans)
        want.update(override or {})
        report = agent._reconcile(
            want, Observed(item.task for item in items), only=[item.task.key for item in items]
        )
        for r in report.results:
            agent.counters[r.outcome] += 1
        agent._log_problems(report)
        return report

    def inherited(self, key: str, current: object) -> object:
        """The original to journal for ``key``: a thread born SCHED_IDLE in a demoted session
        (it inherited that from a thread hostd demoted) has its session's original policy."""
        if (
            knobkinds.kind_of(key) != "sched"
            or not isinstance(current, list)
            or current[0] != "idle"
        ):
            return current
        tid, start = knobs.parse_task_key(key)
        task = self.agent.cache.tasks.get(tid)
        if task is None:
            return current
        sid = task.process.session
        since = self.since.get(sid)
        if since is None or start < since:
            return current
        return list(self.typical[sid])

    def demote(self, sid: int, demand: float, sessions: dict[int, list[int]]) -> None:
        agent = self.agent
        planner, journal, cache = agent.planner, agent.journal, agent.cache
        assert planner is not None
        tasks = self._session_tasks(sessions.get(sid, []))
        preemptible = agent.policy.preemptible
        originals: Counter[tuple] = Counter()
        for task in tasks:
            item = agent.classified.get(task.tid)
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
                self.watch.demoted.pop(sid, None)
                log.error("preempt demote session=%d not done: %s", sid, exc)
                return
        self.session_keys[sid], self.since[sid], self.typical[sid] = key, since, typical
        planner.demoted.add(sid)
        report = self._redecide(tasks)
        who = f"{leader.comm}({sid})" if leader is not None else f"session {sid}"
        applied = report.counts.get("applied", 0)
        log.info(
            "preempt demote session=%d leader=%r wants=%.2f-cpus threads=%d applied=%d",
            sid,
            leader.comm if leader is not None else "",
            demand,
            len(tasks),
            applied,
        )
        self.counters["demotions"] += 1
        self._note("demote", f"session of {who} wanted {demand:.2f} CPUs", session=sid)
        self.weigh_groups(sid, sessions)

    # -- a demoted session's own cgroup --------------------------------------------------------
    def cpu_group(self, pid: int) -> str | None:
        """The cgroup of process ``pid`` in the cpu controller's hierarchy (v2: its home, not
        hostd's threaded cpuset group in it)."""
        host = self.agent.host
        found = group.mount(host.root)
        if found is None:
            return None
        cgroups = parse_cgroup(host.read_quiet(f"proc/{pid}/cgroup") or "")
        path = cgroups.get("cpu" if found[0] == 1 else "")
        return None if path is None else home_of(path) if found[0] == 2 else path

    def group_members(self, path: str) -> dict[int, int | None] | None:
        """The session of every process in cgroup ``path`` and below it (None: one hostd does
        not watch), or None when they cannot all be listed."""
        agent = self.agent
        host, procs = agent.host, agent.cache.procs
        found = group.mount(host.root)
        if found is None:
            return None
        members: dict[int, int | None] = {}
        todo, seen = [found[1] + path.rstrip("/")], 0
        while todo:
            rel = todo.pop()
            seen += 1
            text = host.read_quiet(f"{rel}/cgroup.procs")
            if text is None or seen > MAX_GROUPS:
                return None
            for word in text.split():
                proc = procs.get(int(word))
                ok = proc is not None and not proc.is_kthread and proc.pid not in agent.exclude
                members[int(word)] = proc.session if ok and proc is not None else None
            todo += [f"{rel}/{e}" for e in host.listdir(rel) if host.inode(f"{rel}/{e}")]
        return members

    def weigh_groups(self, sid: int, sessions: dict[int, list[int]]) -> None:
        """Weigh down the cgroups that hold demoted session ``sid``, where nothing else is in
        them: the CPU is shared between cgroups before a thread's policy or a session's weight
        counts (BENCHMARKS.md)."""
        agent = self.agent
        paths = {p for pid in sessions.get(sid, []) if (p := self.cpu_group(pid)) is not None}
        for path in sorted(paths):
            key = group.key_of(path)
            if key in self.groups:
                self.groups[key].add(sid)
                continue
            why = why_group_kept(path, self.group_members(path), self.watch.demoted)
            if why is None and knobkinds.check_key(key) is not None:
                why = "its name is not a plain cgroup path"
            if why is not None:
                if path.strip("/"):
                    log.info("preempt group kept cgroup=%s session=%d why=%r", path, sid, why)
                continue
            try:
                want = group.yielding(group.read(agent.host, key))
            except HostError as exc:
                log.info("preempt group cgroup=%s not weighed: %s", path, exc)
                continue
            report = agent._reconcile({key: want}, Observed(()), only=())
            outcome = report.results[0].outcome if report.results else "none"
            log.info(
                "preempt group demote cgroup=%s session=%d %s=%d outcome=%s",
                path, sid, want["file"], want["value"], outcome,
            )  # fmt: skip
            if outcome in ("applied", "would-apply"):
                self.groups[key] = {sid}
                self.counters["group_demotions"] += 1
                self._note("demote", f"cgroup {path}: {want['file']} {want['value']}", session=sid)

    def release_groups(self, keys: list[str], why: str) -> None:
        agent = self.agent
        for key in keys:
            self.groups.pop(key, None)
            if agent.mode == "enforce" and key in agent.journal:
                for r in restore_keys(agent.host, agent.journal, [key]):
                    agent.counters[r.outcome] += 1
                    if r.outcome not in ("restored", "gone"):
                        log.warning("preempt group release key=%s outcome=%s %s",
                                    key, r.outcome, r.detail)  # fmt: skip
            log.info("preempt group release cgroup=%s why=%r", key[len(group.PREFIX) :], why)

    def check_groups(self) -> None:
        """A weighed-down cgroup that now holds anything but demoted work gets its weight back."""
        for key in list(self.groups):
            path = key[len(group.PREFIX) :]
            why = why_group_kept(path, self.group_members(path), self.watch.demoted)
            if why is not None:
                self.release_groups([key], why)

    def release(self, sid: int, why: str, sessions: dict[int, list[int]]) -> None:
        agent = self.agent
        planner, journal = agent.planner, agent.journal
        if planner is not None:
            planner.demoted.discard(sid)
        self.release_groups([k for k, sids in self.groups.items() if sid in sids], why)
        key = self.session_keys.pop(sid, None)
        self.since.pop(sid, None)
        self.typical.pop(sid, None)
        if key is not None and agent.mode == "enforce" and key in journal:
            for r in restore_keys(agent.host, journal, [key]):
                agent.counters[r.outcome] += 1
                if r.outcome not in ("restored", "gone"):
                    log.warning("preempt release key=%s outcome=%s %s", key, r.outcome, r.detail)
        self._redecide(self._session_tasks(sessions.get(sid, [])))
        log.info("preempt release session=%d why=%r", sid, why)
        self.counters["releases"] += 1
        self._note("release", why, session=sid)

    def runaway(self, s: Sample) -> None:
        agent = self.agent
        task = self._task(s.key)
        if agent.planner is None or task is None:
            return
        agent.planner.runaways.add(s.key)
        self._redecide([task])
        g = agent.policy.guard
        why = (
            f"real-time thread kept {g.rt_runaway_share:.0%}+ of a CPU busy for "
            f"{g.rt_runaway_after:g} s: SCHED_OTHER at nice -20 from now on"
        )
        log.warning("guard runaway tid=%d comm=%r layer=%s %s", task.tid, task.comm, s.layer, why)
        self.counters["runaways"] += 1
        self._note("runaway", why, tid=task.tid, comm=task.comm, layer=s.layer)

    def boost(self, s: Sample, now: float) -> None:
        agent = self.agent
        task = self._task(s.key)
        if agent.planner is None or task is None or s.key in self.boosted:
            return
        key = knobs.task_key(task.tid, task.start_time, "sched")
        if len(self.boosted) >= max(1, len(os.sched_getaffinity(0)) - 1):
            self.counters["boosts_deferred"] += 1
            return  # never every CPU at once: the others wait for a next round
        if agent.caps.rt and self._hold_rt(True):
            override: dict = {key: boost_value(agent.policy)}
        elif key in agent.journal:  # no real-time here: its own policy back for a moment
            override = {key: agent.journal.original(key)}
        else:
            return  # not demoted, and nothing stronger allowed: nothing a boost could do
        self.boosted[s.key] = now + agent.policy.guard.boost_ms / 1000
        self._redecide([task], override)
        why = f"runnable for {agent.policy.guard.starve_after:g} s without running"
        log.info("guard boost tid=%d comm=%r layer=%s %s", task.tid, task.comm, s.layer, why)
        self.counters["boosts"] += 1
        self._note("boost", why, tid=task.tid, comm=task.comm, layer=s.layer)

    def _note(self, what: str, why: str, **about: object) -> None:
        self.recent.append({"time": round(time.time(), 3), "what": what, "why": why, **about})

    # -- the agent's hooks ---------------------------------------------------------------------
    def forget(self, keys: list[Key]) -> None:
        self.watch.forget(keys)
        for key in keys:
            self.boosted.pop(key, None)

    def reset(self) -> None:
        """Everything was restored (switched off): nothing is demoted or boosted any more."""
        self.watch.release_all()
        self.watch.runaways.clear()
        self.boosted.clear()
        self._hold_rt(False)
        self.session_keys.clear()
        self.since.clear()
        self.typical.clear()
        self.groups.clear()

    def status(self) -> dict:
        agent = self.agent
        policy = agent.policy
        now = time.monotonic()
        runaways = []
        for key in sorted(self.watch.runaways):
            task = self._task(key)
            if task is not None:
                runaways.append({"tid": task.tid, "comm": task.comm})
        return {
            "enabled": bool(policy.preemptible),
            "active": self.active(),
            "protected_layers": sorted(policy.protected),
            "preemptible_layers": sorted(policy.preemptible),
            "busy_cpus": policy.preempt.busy,
            "demoted": demoted_summary(self.watch.demoted, now),
            "demoted_cgroups": sorted(key[len(group.PREFIX) :] for key in self.groups),
            "guard": policy.guard.enabled,
            "boosting": len(self.boosted),
            "runaways": runaways,
            "counts": dict(self.counters),
            "tick_ms": round(self.cost * 1000, 2),
            "recent": list(self.recent),
        }

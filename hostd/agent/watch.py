"""The agent's watch: preemptible work and the starvation guard (``hostd.preempt``), applied.

Every ``[preempt] interval`` seconds while it has something to watch (a protected layer with
threads, a demoted session, a real-time thread hostd made), ``WatchLoop.tick`` reads one
``/proc/PID/stat`` per process hostd knows (its CPU time and its leader's state) and, for the
processes that ran or are runnable, the threads of demoted sessions and hostd's real-time
threads, one ``/proc/PID/task/TID/schedstat`` and one ``stat`` (its state) per thread.
``hostd.preempt.Watch`` decides; this module applies through the planner and the journal:

The parts: ``sampling`` (what a tick reads; the sessions never demoted), ``demotion`` (demote
and release a session), ``weights`` (a demoted session's own cgroup) and ``guard`` (boosts and
runaways); they find and change threads through ``applier`` (``Applier.redecide``: threads
decided again with the planner and applied through the agent's reconcile). The agent gives the
watch its host, journal, ``AgentState``, what the host allows and an ``Applier``, never itself;
its loop runs ``run_due`` when ``next_due`` comes (``hostd.agent.parts.Watch``).

Its own cost is measured; the interval is stretched to 20 times it (at most 5 % of a CPU).
While nothing is watched it keeps only each process's CPU time, read every ``IDLE_S`` or 100
times the read's cost (``Sampler.processes``: one ``stat`` per process, no thread's; read a
``SLICE_S`` slice per step of the loop, ``Sampler.read``, events served between): a job's
first protected thread makes it tick at once (``next_due``), and a busy competing session is
demoted in that tick, from its CPU since that read, not a tick later (issue 43: the job's start
beside a busy container).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hostd.agent.demotion import Demotions
from hostd.agent.guard import Guard, boost_value
from hostd.agent.sampling import Sampler
from hostd.agent.weights import GroupWeights, path_of
from hostd.policy import Policy
from hostd.preempt import Key, Watch, counted_layers, demoted_summary, shielding_layers

log = logging.getLogger("hostd")

if TYPE_CHECKING:
    from hostd.agent.applier import Applier
    from hostd.agent.state import AgentState
    from hostd.doctor import Capabilities
    from hostd.host import Host
    from hostd.journal import Journal

__all__ = ["WatchLoop", "boost_value"]

IDLE_S = 5.0  # while nothing is watched, how often each process's CPU time is read
SLICE_S = 0.001  # processes' CPU times read per step of the loop (``Sampler.read``), about


class WatchLoop:
    def __init__(
        self, host: Host, journal: Journal, state: AgentState, caps: Capabilities, applier: Applier
    ) -> None:
        self.state, self.applier = state, applier
        policy = state.policy
        self.watch = Watch(policy.preempt, policy.guard, policy.preemptible, counted_layers(policy))
        self.due = 0.0  # monotonic time of the next tick
        self.cost = 0.0  # seconds the last tick took
        self.changed = False  # something for status.json since it was last written
        self.spared: set[int] = set()  # processes of demoted sessions left alone (bystanders)
        self.was_active = False  # a protected layer had threads at the last tick
        self.idle_read = -IDLE_S  # monotonic time of the last read while nothing was watched
        self.idle_every = IDLE_S  # stretched to 100 times the read's cost
        self.sampler = Sampler(host, state, self.watch, applier)
        self.weights = GroupWeights(host, journal, state, self.watch, applier, self.spared)
        self.demotions = Demotions(host, journal, state, self.watch, applier, self.weights)
        self.guard = Guard(host, journal, state, caps, applier, self.weights.capped)

    def configure(self, policy: Policy) -> None:
        self.watch.configure(
            policy.preempt, policy.guard, policy.preemptible, counted_layers(policy)
        )
        self.sampler.shielding = shielding_layers(policy)

    # -- what is watched -------------------------------------------------------------------------
    def active(self) -> bool:
        """A protected layer has threads (the job is on this host)."""
        counts = self.applier.inc.layer_counts
        return any(counts[name] > 0 for name in self.state.policy.protected)

    def rt_keys(self) -> set[Key]:
        planner = self.applier.inc.planner
        if planner is None:
            return set()
        return set().union(*planner.rt_holders.values()) if planner.rt_holders else set()

    def starting(self) -> bool:
        """A protected layer has threads since the last tick: a job came (tick at once)."""
        return not self.was_active and self.active() and not self.state.disabled

    def next_due(self) -> float:
        due = min([self.due, *self.guard.boosted.values()])
        return min(due, 0.0) if self.starting() else due

    def run_due(self, now: float, waiting: Callable[[], bool] | None = None) -> None:
        """Undo boosts that ended, and tick when due (or a job came)."""
        self.guard.end_boosts(now)
        if now >= self.due or self.starting():
            self.tick(now, waiting)

    # -- a tick ----------------------------------------------------------------------------------
    def tick(self, now: float, waiting: Callable[[], bool] | None = None) -> None:
        """``waiting``: whether events wait; the processes' CPU read stops for them (``read``)."""
        policy = self.state.policy
        interval = policy.preempt.interval
        self.due = now + interval
        active = self.was_active = self.active()
        if self.applier.inc.planner is None:
            return
        rt = self.rt_keys()
        sampler = self.sampler
        if not (active or self.watch.demoted or (rt and policy.guard.enabled)):
            if now - self.idle_read >= self.idle_every:  # each process's CPU, for a job to come
                if not sampler.read(SLICE_S, waiting):
                    self.due = now  # the next slice at the loop's next step
                    return
                self.idle_read = now
                sampler.processes()
                # at most 1 % of a CPU on a host of many processes
                self.idle_every = max(IDLE_S, 100 * sampler.busy)
            return
        if not sampler.read(SLICE_S, waiting):
            self.due = now
            return
        read = sampler.busy
        started = time.perf_counter()
        samples, sessions, used = sampler.sample(rt)
        decisions = self.watch.update(
            now,
            samples,
            active=active,
            rt_keys=rt,
            kept=lambda sid: self.sampler.kept(sid, sessions),
            sessions_alive=lambda sid: sid in sessions,
            process_demand=used,
            interactive=lambda sid: self.sampler.interactive(sid, sessions),
        )
        self.spare(sessions)  # (of the sessions demoted now too: before their threads are)
        for dem in decisions.demote:
            self.demotions.demote(dem.sid, dem.demand, sessions)
        for sid in decisions.lifted:
            self.applier.counters["lifts"] += 1
            log.warning(
                "preempt lift session=%d: runnable %g s without running while demoted (the "
                "floor); not demoted again for %g s", sid, policy.preempt.floor,
                policy.preempt.release_after,
            )  # fmt: skip
        for sid, why in decisions.release:
            self.demotions.release(sid, why, sessions)
        for s in decisions.runaway:
            self.guard.runaway(s)
        for s in decisions.boost:
            self.guard.boost(s, now)
        self.weights.check()
        self.settle_weight(sessions)
        self.cost = read + time.perf_counter() - started
        self.applier.counters["ticks"] += 1
        self.changed = self.changed or bool(decisions) or bool(self.watch.demoted)
        self.due = now + max(interval, 20 * self.cost)

    def spare(self, sessions: dict[int, list[int]]) -> None:
        """The bystanders of the demoted sessions (``Sampler.bystanders``) are left alone: the
        planner gives them no SCHED_IDLE and no session weight, and they stay in their cgroup.
        One that becomes one, or stops being one, is decided again at once."""
        busy = self.state.policy.preempt.busy / 4
        spared: set[int] = set()
        for sid in self.watch.demoted:
            spared |= self.sampler.bystanders(sid, sessions, busy)
        changed = spared ^ self.spared
        if not changed:
            return
        self.spared.clear()  # (in place: ``GroupWeights`` holds it too)
        self.spared.update(spared)
        planner = self.applier.inc.planner
        if planner is not None:
            planner.spared = set(spared)
        for pid in sorted(changed & spared):
            log.info("preempt spare pid=%d: another user's bystander of a busy session", pid)
        self.applier.redecide(self.applier.session_tasks(sorted(changed)))

    def settle_weight(self, sessions: dict[int, list[int]]) -> None:
        """With ``[preempt] weigh_job = "while-needed"``, the job's sessions weigh more than the
        default (a layer's negative ``group_nice``) only while some demoted work is not
        contained (``GroupWeights.contained``): that weight is taken from every other cgroup at
        the root, the node's own slices included (BENCHMARKS.md, "A node with its
        infrastructure"). When that changes, the sessions' leaders are decided again at once."""
        policy, applier = self.state.policy, self.applier
        planner, cache = applier.inc.planner, applier.cache
        if planner is None:
            return
        want = policy.preempt.weigh_job == "always" or any(
            not self.weights.contained(sid, sessions) for sid in self.watch.demoted
        )
        if planner.weighted == want:
            return
        planner.weighted = want
        layers = {ly.name for ly in policy.layers if (ly.sched.group_nice or 0) < 0}
        leaders = [
            task
            for pid, proc in cache.procs.items()
            if pid == proc.session
            and (item := applier.inc.classified.get(pid)) is not None
            and item.layer in layers
            and (task := cache.tasks.get(pid)) is not None
        ]
        report = applier.redecide(leaders)
        log.info("preempt session weight %s leaders=%d applied=%d restored=%d",
                 "given" if want else "taken back: nothing demoted needs outweighing",
                 len(leaders), report.counts.get("applied", 0),
                 report.counts.get("restored", 0))  # fmt: skip
        applier.counters["weight_given" if want else "weight_taken"] += 1
        applier.note("weight", "given: demoted work the job must outweigh" if want
                     else "taken back: no demoted work needs outweighing")  # fmt: skip

    # -- the agent's hooks ---------------------------------------------------------------------
    @property
    def inherited(self) -> Callable[[str, object], object] | None:
        """What a pass records as the original of a knob a thread inherited from one hostd
        demoted (``Demotions.inherited``); None while no session is demoted (a storm's
        threads: nothing to look at)."""
        return self.demotions.inherited if self.demotions.since else None

    def forget(self, keys: list[Key]) -> None:
        self.watch.forget(keys)
        for key in keys:
            self.guard.boosted.pop(key, None)

    def reset(self) -> None:
        """Everything was restored (switched off): nothing is demoted or boosted any more."""
        self.spared.clear()
        self.watch.release_all()
        self.watch.runaways.clear()
        self.guard.boosted.clear()
        self.guard.hold_rt(False)
        self.demotions.clear()
        self.weights.groups.clear()

    def status(self) -> dict:
        policy, applier = self.state.policy, self.applier
        planner = applier.inc.planner
        now = time.monotonic()
        runaways = []
        for key in sorted(self.watch.runaways):
            task = applier.task(key)
            if task is not None:
                runaways.append({"tid": task.tid, "start": task.start_time, "comm": task.comm})
        return {
            "enabled": bool(policy.preemptible),
            "active": self.active(),
            "protected_layers": sorted(policy.protected),
            "preemptible_layers": sorted(policy.preemptible),
            "busy_cpus": policy.preempt.busy,
            "demoted": [  # each with what it is on the node (``demotion.where_of``)
                {**d, **self.demotions.where.get(d["session"], {})}
                for d in demoted_summary(self.watch.demoted, now)
            ],
            "demoted_cgroups": sorted({path_of(key) for key in self.weights.groups}),
            "sessions_weighted": planner.weighted if planner is not None else True,
            "guard": policy.guard.enabled,
            "boosting": len(self.guard.boosted),
            "runaways": runaways,
            "counts": dict(applier.counters),
            "tick_ms": round(self.cost * 1000, 2),
            "recent": list(applier.recent),
        }

"""The starvation guard, applied: boosts for starving threads, and runaway real-time threads
returned to normal scheduling (``hostd.preempt.Watch`` decides both).

* **boost**: a thread runnable for ``[guard] starve_after`` seconds without running gets
  SCHED_FIFO one priority above the policy's real-time layers (``boost_value``; journaled like
  any write) for ``boost_ms``, then it is decided again. The agent's own thread holds SCHED_FIFO
  one above that while a boost is on, so that it wakes on time to end it, and at most all CPUs
  but one are boosted at once; where real-time is not allowed (on the host, or for the thread:
  ``rt_refused``), a demoted thread gets its original policy back for that time. A child born
  during a boost is born SCHED_OTHER (reset-on-fork, or the original inherited), not demoted:
  the agent decides it from the fork event like any new thread (tests/privileged/test_preempt).
* **runaway**: a real-time thread of a hostd layer that keeps a CPU busy is decided again as
  SCHED_OTHER at nice -20 from then on.

It works through the host door, the journal, what the host allows (``Capabilities``) and the
watch's ``Applier``; ``capped`` (``GroupWeights.capped``) says whose cgroup hostd capped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from hostd import knobs
from hostd.host import Host
from hostd.model.topology import Topology
from hostd.policy import Policy
from hostd.preempt import Key, Sample

if TYPE_CHECKING:
    from hostd.agent.applier import Applier
    from hostd.agent.state import AgentState
    from hostd.doctor import Capabilities
    from hostd.journal import Journal

log = logging.getLogger("hostd")


def boost_value(policy: Policy) -> list:
    """What a starving thread gets for a moment: SCHED_FIFO above every real-time layer of the
    policy (so a runaway of hostd's cannot hold it off), with reset-on-fork."""
    top = max((ly.sched.priority or 0 for ly in policy.layers if ly.sched.realtime), default=0)
    return ["fifo", min(99, top + 1), True]


def rt_refused(host: Host, topo: Topology | None, tid: int) -> bool:
    """Whether the kernel refuses the thread real-time for its cgroup: with RT group scheduling
    (v1 ``cpu``, CONFIG_RT_GROUP_SCHED) a cgroup's real-time budget is ``cpu.rt_runtime_us``,
    0 in every cgroup made below the root unless its manager gave one (the kubelet, docker and
    systemd do not): SCHED_FIFO there is EPERM (FACTS.md). The thread's cgroup, as root reads
    it from /proc: a user cannot move a thread into a cgroup that has a budget."""
    mount = topo.cgroup.v1_mount("cpu") if topo is not None else None
    path = (host.cgroups(tid) or {}).get("cpu") if mount else None
    if not path or path == "/":
        return False
    text = host.read_quiet(f"{mount.strip('/')}/{path.strip('/')}/cpu.rt_runtime_us")
    return text is not None and text.strip() == "0"


class Guard:
    def __init__(
        self,
        host: Host,
        journal: Journal,
        state: AgentState,
        caps: Capabilities,
        applier: Applier,
        capped: Callable[[int], bool],
    ) -> None:
        self.host, self.journal, self.state, self.caps = host, journal, state, caps
        self.applier, self.capped = applier, capped
        self.boosted: dict[Key, float] = {}  # thread -> monotonic time its boost ends
        self.rt_self = False  # the agent holds SCHED_FIFO while a boost is on

    def end_boosts(self, now: float) -> None:
        """Decide again the threads whose boost has ended."""
        ended = [key for key, until in self.boosted.items() if until <= now]
        if not ended:
            return
        for key in ended:
            del self.boosted[key]
        applier = self.applier
        applier.redecide([t for key in ended if (t := applier.task(key)) is not None])
        if not self.boosted:
            self.hold_rt(False)

    def hold_rt(self, on: bool) -> bool:
        """The agent's own thread SCHED_FIFO, one above the boost, while a boost is on: the
        boosted thread may spin, and only the agent, waking on time, ends its boost (else RT
        throttling would, after up to 0.95 s: measured, BENCHMARKS.md). Its own process: not
        journaled (the kernel forgets it with the process)."""
        if on == self.rt_self:
            return True
        try:
            if on:
                prio = min(99, boost_value(self.state.policy)[1] + 1)
                flags = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
                os.sched_setscheduler(0, flags, os.sched_param(prio))
            else:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:
            log.info("guard agent real-time %s refused (%s)", "on" if on else "off", exc)
            return False
        self.rt_self = on
        return True

    def runaway(self, s: Sample) -> None:
        applier = self.applier
        planner, task = applier.inc.planner, applier.task(s.key)
        if planner is None or task is None:
            return
        planner.runaways.add(s.key)
        applier.redecide([task])
        g = self.state.policy.guard
        why = (
            f"real-time thread kept {g.rt_runaway_share:.0%}+ of a CPU busy for "
            f"{g.rt_runaway_after:g} s: SCHED_OTHER at nice -20 from now on"
        )
        log.warning("guard runaway tid=%d comm=%r layer=%s %s", task.tid, task.comm, s.layer, why)
        applier.counters["runaways"] += 1
        applier.note("runaway", why, tid=task.tid, comm=task.comm, layer=s.layer)

    def boost(self, s: Sample, now: float) -> None:
        applier, policy, journal = self.applier, self.state.policy, self.journal
        task = applier.task(s.key)
        if applier.inc.planner is None or task is None or s.key in self.boosted:
            return
        key = knobs.task_key(task.tid, task.start_time, "sched")
        if self.capped(task.pid):
            return  # its cgroup's quota is its floor: a boost would not make it run more
        if len(self.boosted) >= max(1, len(os.sched_getaffinity(0)) - 1):
            applier.counters["boosts_deferred"] += 1
            return  # never every CPU at once: the others wait for a next round
        rt = self.caps.rt and not rt_refused(self.host, applier.inc.topology, task.tid)
        if rt and self.hold_rt(True):
            override: dict = {key: boost_value(policy)}
        elif key in journal:  # no real-time here: its own policy back for a moment
            override = {key: journal.original(key)}
        else:
            return  # not demoted, and nothing stronger allowed: nothing a boost could do
        self.boosted[s.key] = now + policy.guard.boost_ms / 1000
        applier.redecide([task], override)
        why = f"runnable for {policy.guard.starve_after:g} s without running"
        log.info("guard boost tid=%d comm=%r layer=%s %s", task.tid, task.comm, s.layer, why)
        applier.counters["boosts"] += 1
        applier.note("boost", why, tid=task.tid, comm=task.comm, layer=s.layer)

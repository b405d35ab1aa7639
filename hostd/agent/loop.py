"""The agent's loop, the scheduler: wait for the next event or timer, run the pass it calls for,
then give each part its turn.

``run`` takes the pid lock, subscribes to the sources, runs a full pass and then ``step``-s
until a signal stops it; at the end it restores everything hostd changed (unless the policy says
``restore_on_exit = false``). Meanwhile hostd's own threads stay on the pool's CPUs
(``keep_to_pool``), never on those a layer has to itself. A step waits for an event or for the
earliest time one of the parts (``Agent.parts``, in ``hostd.agent.parts.ORDER``, then the drift
rescan and the status file, ``rescan_wake``) asks to be woken at, and handles, in this order: a
reload (SIGHUP), a switch (SIGUSR1), device events (a full pass with the topology read again),
thread events (an event pass, which re-layers first when a layer gains its first member; a lost
event means a full pass); then each part in its order, which does its work if its time has
come: the records of exited threads, cpuset joins, the pool's threads after a re-layer, the
journal's compaction, a layer due to give CPUs back, the watch, a second look at unsettled job
threads, the sizer, the layers' statistics, and the drift rescan (or, without events, the poll)
or else the status file at most once a second (``rescan``). This module (with the package, whose
``Agent`` it runs) alone holds the whole ``Agent`` of ``hostd.agent.core``; the parts are given
only what each needs.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import hostd.sidecar
from hostd import __version__
from hostd.agent import parts
from hostd.agent.lock import AgentLock
from hostd.host import HostError, paths
from hostd.host.connector import Overflow
from hostd.model.cpus import format_cpulist
from hostd.reconcile import PassReport, restore

if TYPE_CHECKING:
    from hostd.agent.core import Agent

log = logging.getLogger("hostd")
DRIFT_COST = 100  # the drift rescan waits 100 times a full pass's cost: at most 1 % of a CPU
GC_THRESHOLD = (10_000, 10, 10)  # the collector's (see ``run``)
# Lost events mean a full pass, but at most one per OVERFLOW_GAP_S (or 10 times a full pass's
# cost): a source that overflows the buffer again and again (one thread renaming itself in a
# loop: four overflows a second) must not keep the agent in full passes. A read whose events
# are mostly one thread's renames is a rename storm: rename events are muted for COMM_MUTE_S
# where the kernel filters event types, then a full pass catches up (BENCHMARKS.md).
OVERFLOW_GAP_S, COMM_MUTE_S = 5.0, 60.0
SLOW_S = 0.002  # with ``-v``, a part's step or a collection that took longer is logged
WHOLE_COLLECTION_S = 600.0  # a full pass's collection looks at everything this often
# The agent's file descriptors: it raises its soft limit to this (or its hard limit, if lower;
# the unit sets LimitNOFILE to it) and warns below FILES_MIN. It holds about 20 of its own, one
# more per /proc read under way and at most 16 scrape connections (hostd.agent.metrics).
FILES_WANTED, FILES_MIN = 65536, 1024


def run(agent: Agent, once: bool = False) -> PassReport:
    lock = AgentLock.take(agent.run_dir)
    agent.sources.catch_signals()
    log.info(
        "start version=%s mode=%s policy=%s pid=%d",
        __version__, agent.mode, agent.policy.source, os.getpid(),
    )  # fmt: skip
    if agent.disabled:
        log.warning(
            "disabled: `hostd disable` switched hostd off and the switch persists; it changes "
            "nothing until `hostd enable`"
        )
    if agent.sidecar:
        for feature, _, detail in hostd.sidecar.describe(agent.host):
            log.info("%s: %s", feature, detail)
    # A storm of new threads makes and drops objects by the hundred thousand a second, few of
    # them in cycles: the youngest generation is collected every 10,000 objects kept, not 700
    # (collections took 3.5 % of the agent's CPU in a storm of 10,000 threads/s).
    gc.set_threshold(*GC_THRESHOLD)
    timer = _collection_timer() if log.isEnabledFor(logging.DEBUG) else None
    if timer is not None:
        gc.callbacks.append(timer)
    own_files()
    # hostd's own priority: raised while it has a storm of new threads to place (``pace``)
    agent.calm_nice = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        if once:
            return agent.pass_once("once")
        agent.sources.open(agent.host, agent.policy)
        agent.exporter.start()
        full(agent, "start")
        if (hint := first_run_hint(agent)) is not None:
            log.info("%s", hint)
        while not agent.sources.stop:
            keep_to_pool(agent)
            try:
                step(agent)
            except Exception:  # an event source failing must not end the agent
                agent.counters["step_errors"] += 1
                log.exception("event loop step failed; a full pass follows")
                time.sleep(0.5)
                full(agent, "recovery")
        return PassReport()  # what the loop did is in the log and status.json
    finally:
        agent.exporter.stop()
        agent.attempts.stop()
        agent.sources.close()
        agent.hold_cstate(False)
        keep_to_pool(agent, leaving=True)
        finish(agent)
        lock.close()
        if timer is not None:
            gc.callbacks.remove(timer)


def own_files() -> int:
    """Raise the agent's soft limit of open files towards ``FILES_WANTED`` (no privilege: up to
    its hard limit), log it, and warn when it stays below ``FILES_MIN``. Out of descriptors, no
    /proc file opens: the agent keeps every record then (a failed read is not an exit), but it
    sees and places nothing until descriptors are free again. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError) as exc:
            log.info("files: cannot raise the limit from %d to %d (%s)", soft, want, exc)
    if soft != resource.RLIM_INFINITY and soft < FILES_MIN:
        log.warning(
            "files: the agent may open %d files at once, fewer than the %d it wants; raise "
            "LimitNOFILE (systemd) or ulimit -n", soft, FILES_MIN,
        )  # fmt: skip
    else:
        log.info("files limit=%d", soft)
    return soft


# The agent's priority follows its work (``pace``): raised to ``[agent] nice`` while events
# come faster than one pass places their threads, back to the nice it started with when none
# have waited for this long. At rest its wake-ups (a few a second) then do not preempt a rank
# mid-step, which a lock-step job pays for in both ranks (BENCHMARKS.md, "A node with its
# infrastructure": the job 0.94 of quiet with the agent at nice 0, 0.83 at -10, same run); in
# a storm it is not starved by the threads it places (BENCHMARKS.md, "Reaction time").
BUSY_EVENTS = 256  # events in one read that make a storm, even before a backlog forms
CALM_AFTER = 1.0  # seconds without a backlog before the agent lowers itself again


def pace(agent: Agent, busy: bool, now: float, events: int = 0) -> None:
    """The agent's own priority for what it has to do: ``[agent] nice`` while ``busy`` (and
    ``CALM_AFTER`` seconds more), else the nice it started with."""
    nice = agent.policy.agent_nice
    if nice is None or nice >= agent.calm_nice:
        return
    if busy:
        agent.calm_at = now + CALM_AFTER
        if not agent.raised:
            agent.raised = True
            agent.counters["priority_raised"] += 1
            log.info("agent nice=%d: %d events read, %d threads waiting",
                     nice, events, len(agent.inc.backlog))  # fmt: skip
            own_priority(agent, nice)
    elif agent.raised and now >= agent.calm_at:
        agent.raised = False
        log.info("agent nice=%d: nothing waiting for %g s", agent.calm_nice, CALM_AFTER)
        own_priority(agent, agent.calm_nice)


def own_priority(agent: Agent, nice: int) -> None:
    """hostd's own nice. With autogroups on (sched(7)), CFS shares the CPU between sessions
    first and a nice value counts only within its session: a storm's creators in sessions of
    their own then leave hostd one session's share. So when hostd leads its session (a systemd
    service, a container, the benchmarks), that session's autogroup gets the same nice; in an
    operator's shell it does not (the shell's session would gain too)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        log.info("agent nice=%d refused (%s)", nice, exc.strerror)
        return
    me = os.getpid()
    if os.getsid(0) == me and agent.host.exists(paths.proc(me, "autogroup")):
        try:
            agent.host.write(paths.proc(me, "autogroup"), str(nice))
        except HostError as exc:
            log.info("agent autogroup nice=%d refused (%s)", nice, exc)


def keep_to_pool(agent: Agent, leaving: bool = False) -> None:
    """hostd's own threads on the pool's CPUs (within those it started with), off every CPU a
    layer has to itself: in a storm of new threads the agent is busy, and on a layer's CPUs it
    would preempt the very threads it reserved them for (BENCHMARKS.md: at 100,000 background
    threads, 6 of 7 storms kept under 0.3 % missed with the agent kept off, 2 of 7 under 1 %
    with it free). Back to what they had when the layers give their CPUs up (switched off,
    observe mode, ``leaving``). Looked at before each step: a re-layer may have changed the
    pool (the same pool is the same object: no comparison of CPU sets on the event path)."""
    plan = agent.plan
    pool = plan.pool if plan is not None and agent.mode == "enforce" and not leaving else None
    if pool is agent.own_pool or pool == agent.own_pool:
        return
    agent.own_pool, me = pool, os.getpid()
    tids = [int(name) for name in agent.host.listdir(paths.proc(me, "task")) if name.isdigit()]
    if not tids:
        return  # (a fixture tree: not this process's)
    calls = agent.host.threads()
    if agent.own_cpus is None:
        try:
            agent.own_cpus = agent.own_now = calls.get_affinity(me)
        except HostError as exc:
            log.info("agent cpus left as they are (%s)", exc)
            return
    cpus = (pool & agent.own_cpus if pool else None) or agent.own_cpus
    if cpus == agent.own_now:
        return  # (the pool is every CPU hostd may use: nothing to move)
    for tid in tids:
        try:
            calls.set_affinity(tid, cpus)
        except HostError as exc:  # a thread that ended meanwhile, a container's limits
            if exc.outcome != "gone":
                log.info("agent cpus=%s refused (%s)", format_cpulist(cpus), exc)
                agent.own_now = None  # some moved, some not: the next change writes them all
                return
    else:
        log.info("agent cpus=%s%s", format_cpulist(cpus), " (the pool)" if pool else "")
    agent.own_now = cpus


def next_full(agent: Agent) -> tuple[float, str]:
    """When the next full pass is due, and why."""
    if agent.sources.kind == "poll":
        due, why = agent.last_full + agent.policy.interval, "poll"
    else:
        every = max(agent.policy.rescan_interval, DRIFT_COST * agent.full_cost)
        due, why = agent.last_full + every, "drift"
    if agent.overflow_due is not None and agent.overflow_due < due:
        due, why = agent.overflow_due, "overflow"
    if agent.renames_muted is not None and agent.renames_muted < due:
        due, why = agent.renames_muted, "renames"
    return due, why


def overflowed(agent: Agent, events: list) -> bool:
    """Events were lost: whether a full pass is to be made now (else one is due at most
    ``OVERFLOW_GAP_S`` after the last). A rename storm mutes rename events meanwhile."""
    agent.counters["overflows"] += 1
    renames: dict[int, int] = {}
    for ev in events:
        if getattr(ev, "kind", "") == "comm":
            renames[ev.tid] = renames.get(ev.tid, 0) + 1
    top = max(renames.items(), key=lambda item: item[1], default=(0, 0))
    connector = agent.sources.connector
    storm = top[1] >= len(events) // 2 and top[1] >= 64
    if (
        storm
        and agent.renames_muted is None
        and connector is not None
        and connector.mute_renames(True)
    ):
        agent.renames_muted = time.monotonic() + COMM_MUTE_S
        agent.counters["rename_storms"] += 1
        log.warning(
            "rename storm: thread %d renamed itself %d times of %d events; rename events "
            "muted for %g s", top[0], top[1], len(events), COMM_MUTE_S,
        )  # fmt: skip
    gap = max(OVERFLOW_GAP_S, 10 * agent.full_cost)
    if time.monotonic() - agent.last_full >= gap:
        return True
    if agent.overflow_due is None:
        agent.overflow_due = agent.last_full + gap
        log.warning(
            "events lost (receive buffer overflow): rescanning /proc %g s after the last rescan "
            "at most (lost again soon after it); the events that came are used meanwhile", gap,
        )  # fmt: skip
    return False


def full(agent: Agent, reason: str) -> None:
    # What the last passes kept stays frozen (``parts.freeze``): the collection after this pass
    # looks at what it made, not at the threads it kept unchanged (0.15-0.18 s of a 3 s pass
    # at 100k threads); a kept object that became cyclic garbage since waits for the whole
    # collection, at most every WHOLE_COLLECTION_S.
    state, now = agent.state, time.monotonic()
    whole = state.collected is None or now - state.collected >= WHOLE_COLLECTION_S
    if whole:
        gc.unfreeze()
        state.collected = now
    # No collection while the pass builds every thread's objects (two or three of the whole
    # heap's, 0.3-0.4 s of a 4.5 s pass at 100k threads): the one after it finds the cycles.
    gc.disable()
    agent.state.join_quiet = parts.JOIN_QUIET_S  # a full pass joins all that waited: no backoff
    agent.overflow_due = None  # it reads every thread: what was lost is found
    muted = agent.renames_muted
    if muted is not None and time.monotonic() >= muted and agent.sources.connector is not None:
        agent.sources.connector.mute_renames(False)
        agent.renames_muted = None
        log.info("rename events back")
    try:
        agent.pass_once(reason)
    except Exception:  # a bug or a full disk must not leave the host half-changed
        agent.counters["full_pass_errors"] += 1
        log.exception("pass failed; the journal is intact, the next pass retries")
        agent.last_full = time.monotonic()
    finally:
        gc.enable()
        parts.freeze(agent.state, collect=True)


def rescan_wake(agent: Agent) -> float:
    return min(next_full(agent)[0], agent.status.due)


def rescan(agent: Agent) -> None:
    """The full pass when it is due (the drift rescan, the poll, lost events); else, at most
    once a second and while no event waits, the status file, if anything in it changed."""
    now = time.monotonic()
    due, why = next_full(agent)
    if now >= due:
        full(agent, why)
    elif now >= agent.status.due and not agent.waiting():
        if agent.status.forced or agent.counters != agent.status.counters or agent.watcher.changed:
            agent.write_status(PassReport(), None, state="running")
        agent.status.written = now  # nothing new: check again in a second


def step(agent: Agent) -> None:
    """Wait for the next event or the earliest part's time, handle the events, then give each
    part (``agent.parts``, in their order, then ``rescan``) its turn."""
    sources, inc = agent.sources, agent.inc
    wakes = [part.wake() for part in agent.parts]
    wake = min(w for w in (*wakes, rescan_wake(agent)) if w is not None)
    # threads that events named wait to be read: no waiting
    timeout = 0.0 if inc.backlog else max(0.0, wake - time.monotonic())
    events_ready, devices_ready = sources.wait(timeout)
    if sources.stop:
        return
    if sources.reload:
        sources.reload = False
        agent.reload()
        return full(agent, "reload")
    if sources.poke:
        sources.poke = False
        return full(agent, "switched")
    if devices_ready and sources.devices is not None:
        changes = sources.devices.read()
        if changes:
            log.info("devices %s", " ".join(f"{c.name}:{c.action}" for c in changes[:8]))
            agent.counters["device_events"] += len(changes)
            return full(agent, "devices")
    if (events_ready or inc.backlog) and sources.connector is not None:
        # (none ready: the next of the threads that earlier events named, newest first)
        events = sources.connector.read(agent.MAX_BATCH) if events_ready else []
        if any(isinstance(ev, Overflow) for ev in events):
            pace(agent, True, time.monotonic())  # a storm
            if overflowed(agent, events):
                log.warning("events lost (receive buffer overflow): rescanning /proc")
                return full(agent, "overflow")
            events = [ev for ev in events if not isinstance(ev, Overflow)]
        busy = bool(inc.backlog) or len(events) >= BUSY_EVENTS
        pace(agent, busy, time.monotonic(), len(events))
        try:
            agent.event_pass(events)  # type: ignore[arg-type]
        except Exception:
            agent.counters["event_pass_errors"] += 1
            log.exception("event pass failed; a full pass follows")
            return full(agent, "recovery")
        finally:
            agent.state.last_event = time.monotonic()
    elif agent.raised:
        pace(agent, False, time.monotonic())
    timed = log.isEnabledFor(logging.DEBUG)  # (``-v``) what held the loop, an event waiting
    for part in (*agent.parts, None):
        began = time.monotonic()
        if part is None:
            rescan(agent)
        else:
            part.run()
        if timed and (took := time.monotonic() - began) > SLOW_S:
            name = type(part).__name__.lower() if part is not None else "rescan"
            log.debug("step %s seconds=%.4f", name, took)


def _collection_timer() -> Callable[[str, dict], None]:
    """A ``gc.callbacks`` entry that logs (``-v``) each collection longer than ``SLOW_S``."""
    began = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.monotonic()
        elif (took := time.monotonic() - began[0]) > SLOW_S:
            log.debug("gc generation=%d seconds=%.4f collected=%d",
                      info["generation"], took, info["collected"])  # fmt: skip

    return timed


def finish(agent: Agent) -> None:
    if agent.sources.stop and agent.policy.restore_on_exit and agent.mode == "enforce":
        agent.close_exited()
        restored = restore(agent.host, agent.journal)
        log.info(
            "stop restored %s",
            " ".join(f"{k}={v}" for k, v in sorted(restored.counts.items())) or "nothing",
        )
        if agent.journal.problem:
            log.error("journal %s", agent.journal.problem)
        agent.inc.plan = None
        agent.write_status(restored, 0.0, state="stopped")
    elif agent.sources.stop:
        if agent.mode != "enforce":
            log.info("stop (%s mode: nothing was changed, nothing to restore)", agent.mode)
        else:
            log.info("stop (restore_on_exit = false: changes are kept; hostd restore undoes)")
        agent.inc.plan = None
        agent.write_status(PassReport(), 0.0, state="stopped")
    agent.journal.close()
    agent.status.close()


def first_run_hint(agent: Agent) -> str | None:
    """One line for the log after the first pass where it found no job (no thread in a layer
    that protects): what the agent watches for, what it does when a job appears, and how to see
    that now; None where a job is there already (the pass's own lines say what it did)."""
    protects = sorted(agent.classifier.protects)
    if agent.disabled or not protects or any(agent.inc.layer_counts[n] > 0 for n in protects):
        return None
    enforce = agent.mode == "enforce"
    does = "gives" if enforce else "would give"
    yields = (" and " + ("makes" if enforce else "make") + " busy competing sessions yield"
              if agent.policy.preemptible else "")  # fmt: skip
    return (
        f"no job here yet: no thread in the protected layer(s) {', '.join(protects)}; hostd "
        f"watches for one and, when a job appears, {does} its threads their layer's CPUs and "
        f"priority{yields}{'' if enforce else f' ({agent.mode} mode: it changes nothing)'}; "
        "`hostd demo` shows the effect in a minute"
    )

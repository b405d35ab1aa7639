"""The pass: observe -> classify -> plan -> diff -> journal -> apply, for the whole host or for
the threads a batch of events names.

``Agent`` runs the two passes and the actions its parts call for (a re-layer, its redo, cpuset
joins, a relook, closing exited threads' records, the status file). It builds its parts once,
each with only what it needs (never the agent): ``Incremental``, ``StatusFile``, ``Sources``,
``WatchLoop``, ``LayerStats``, ``Sizer``, ``Attempts``, the exporter and the periodic parts of
``hostd.agent.parts`` (``parts``, in ``parts.ORDER``), sharing an ``AgentState`` (the policy,
mode and switch in force). ``hostd.agent.loop`` runs the passes and the parts when they are due;
this module never imports it. Everything it reads and writes goes through its ``Host``: a
fixture tree with fake thread calls runs a whole pass without root
(tests/unit/test_agent_parts.py).
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import hostd.sidecar
from hostd import knobkinds, knobs
from hostd.agent import parts
from hostd.agent.applier import Applier
from hostd.agent.attempts import Attempts
from hostd.agent.events import Batch, placed_stamps
from hostd.agent.incremental import Incremental
from hostd.agent.layerstats import LayerStats
from hostd.agent.lock import AgentError
from hostd.agent.metrics import LAG_BOUNDS, Exporter, Histogram
from hostd.agent.sizer import Sizer
from hostd.agent.sources import Sources
from hostd.agent.state import AgentState, log_problems
from hostd.agent.status import StatusFile, document
from hostd.agent.watch import WatchLoop
from hostd.classify import Classified, Classifier
from hostd.cpufreq import hold_cpu_dma_latency
from hostd.doctor import Capabilities, probe
from hostd.host import Host
from hostd.host.connector import Event
from hostd.journal import JournalError, base_affinities, open_checked, read_boot_id
from hostd.plan import Plan, TaskPlanner, plan
from hostd.policy import Policy, PolicyError, load_checked
from hostd.reconcile import (
    TASK_KINDS,
    THREAD_KINDS,
    Observed,
    PassReport,
    reconcile,
    reconcile_pieces,
    redo_threads,
    restore,
    restore_keys,
    task_records,
)
from hostd.statedir import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, UnsafeDir, open_dir
from hostd.tasks import TaskCache
from hostd.topology import read_topology

log = logging.getLogger("hostd")
PIECE = 4096  # threads a full pass writes at a time (``reconcile_pieces``)


class Agent:
    # events read per event pass: a storm's whole backlog, so that a thread created and gone
    # since the last pass costs nothing (``Batch``); its threads are read newest first, a few
    # hundred per pass (``Incremental.read``)
    MAX_BATCH = 65536

    def __init__(
        self,
        host: Host,
        policy_path: str | None,
        *,
        state_dir: str | Path = DEFAULT_STATE_DIR,
        run_dir: str | Path = DEFAULT_RUN_DIR,
        mode: str | None = None,
        allow_insecure_policy: bool = False,
        scope: list[int] | None = None,
        sidecar: bool = False,
    ) -> None:
        self.host, self.sidecar, self.scope = host, sidecar, scope
        self.policy_path, self.allow_insecure = policy_path, allow_insecure_policy
        policy = load_checked(policy_path, allow_insecure_policy)
        self.run_dir = Path(run_dir)
        self.state = AgentState(policy, Classifier(policy), mode, str(self.run_dir / "disabled"))
        try:
            os.close(open_dir(state_dir, 0o700))
            self.journal = open_checked(Path(state_dir), read_boot_id(host), self.policy.sha256)
        except (UnsafeDir, JournalError) as exc:
            raise AgentError(str(exc)) from None
        self.journal.defer_compaction = True  # compacted when idle (hostd.agent.loop)
        self.bases = base_affinities(self.journal)  # threads' affinities before hostd's
        self.caps: Capabilities = probe(host)
        self.unchangeable: set[str] = set()
        self.passes = 0
        self.latency_fd: int | None = None  # the C-state limit held (``hold_cstate``)
        # hostd's own CPUs (``loop.keep_to_pool``): those it started with, those its threads
        # have now, and the pool they were last kept to (None: not kept to one)
        self.own_cpus: frozenset[int] | None = None
        self.own_now: frozenset[int] | None = None
        self.own_pool: frozenset[int] | None = None
        pod = functools.partial(hostd.sidecar.scope, host) if sidecar and scope is None else None
        self.cache = TaskCache(host, read_fds=policy.needs_fds, scope=pod or scope)
        self.inc = Incremental(self.cache)
        self.exclude = frozenset({os.getpid()})
        self.sources = Sources()
        self.status = StatusFile(self.run_dir)
        self.full_cost = 0.0  # seconds the last full pass took
        self.last_full = 0.0  # monotonic time it ended
        # threads that exited with records still open in the journal: closed when no event
        # waits (``close_exited``), so that a storm's exits leave its new threads the CPU
        self.exited: list[tuple[int, int]] = []
        self.scanned_ns = 0  # monotonic ns its reads of /proc ended (a thread born later: unread)
        self.calm_nice = 0  # the agent's own nice at rest, and whether it is raised (loop.pace)
        self.raised, self.calm_at = False, 0.0
        self.overflow_due: float | None = None  # events lost: a full pass at most then (loop)
        self.renames_muted: float | None = None  # a rename storm: rename events off until then
        # the agent's counters; journal_left: originals an earlier run left in the journal
        self.counters: Counter[str] = Counter(journal_left=len(self.journal))
        st, inc, journal = self.state, self.inc, self.journal
        applier = Applier(
            self.cache, inc, self.exclude, self.base_affinity, self.reconcile, self.counters
        )
        self.watcher = WatchLoop(host, journal, st, self.caps, applier)
        self.exporter = Exporter(st, self.status)
        self.event_lag = Histogram(LAG_BOUNDS)  # new thread's event -> its knobs applied
        self.attempts = Attempts(host, self.cache, st, Path(state_dir) / "attempts")
        self.layer_stats = LayerStats(host, inc, st, self.attempts, self.exporter)
        self.sizer = Sizer(host, inc, st)
        self.parts = (  # in ``parts.ORDER``
            parts.Close(self.exited, self.close_exited, self.waiting),
            parts.Joins(inc, st, self.counters, self.join_cpusets, self.waiting),
            parts.Redo(inc, st, self.redo, self.waiting),
            parts.Compact(inc, journal, self.waiting),
            parts.Shrink(inc, st, self.relayer),
            parts.Watch(self.watcher, st, self.waiting),
            parts.Relook(self.cache, st, self.relook, self.waiting),
            parts.Resize(self.sizer, st, self.relayer),
            parts.Stats(self.layer_stats, st, self.say, self.waiting),
        )

    @property
    def policy(self) -> Policy:
        return self.state.policy

    @property
    def classifier(self) -> Classifier:
        return self.state.classifier

    @property
    def mode(self) -> str:
        return self.state.mode

    @property
    def disabled(self) -> bool:
        return self.state.disabled

    @property
    def plan(self) -> Plan | None:
        return self.inc.plan

    @property
    def planner(self) -> TaskPlanner | None:
        return self.inc.planner

    def waiting(self) -> bool:
        """Whether events, or threads they named, wait: other work leaves them the CPU."""
        return bool(self.inc.backlog) or self.sources.events_waiting()

    def base_affinity(self, key: tuple[int, int]) -> frozenset[int] | None:
        """The thread's affinity before hostd changed it (None: not changed)."""
        return self.bases.get(key)

    def pass_once(self, reason: str = "start") -> PassReport:
        """A full pass: the topology and every thread read again, the whole plan applied."""
        started = time.monotonic()
        self.hold_cstate(not self.disabled)
        # each layer's CPUs now: a self-sizing layer keeps what it can of them (sticky)
        current = {lp.name: lp.cpus for lp in self.plan.layers} if self.plan else None
        self.inc.clear()
        if self.disabled:
            self.watcher.reset()  # events change nothing while switched off (no planner)
            self.close_exited()
            report = restore(self.host, self.journal) if len(self.journal) else PassReport()
            self.write_status(report, time.monotonic() - started, state="disabled")
            self.last_full = time.monotonic()
            return report
        topo = read_topology(self.host)
        tasks = self.cache.rescan()
        self.scanned_ns = time.monotonic_ns()
        classified = self.classifier.classify_all(tasks)
        watch = self.watcher.watch
        the_plan = plan(
            topo, classified, self.policy, base_affinity=self.bases, exclude_pids=self.exclude,
            allow_rt=self.caps.rt, demoted_sessions=frozenset(watch.demoted),
            spared_pids=frozenset(self.watcher.spared),
            runaways=frozenset(watch.runaways), sizes=self.sizer.planned(), current=current,
            weighted=self.policy.preempt.weigh_job == "always"
            or (self.planner is not None and self.planner.weighted),
        )  # fmt: skip
        planner = TaskPlanner.for_plan(
            the_plan, topo, self.policy, allow_rt=self.caps.rt, exclude_pids=self.exclude,
            runaways=watch.runaways,
        )  # fmt: skip
        # the plan kept has no per-thread decisions (the planner's from now on: ``relayer``)
        self.inc.start(topo, replace(the_plan, tasks=()), planner, classified)
        self.close_exited()  # their exit events said so; the others unseen: the last piece
        report = reconcile_pieces(
            self.reconcile, the_plan, tasks, Observed(self.cache.tasks), PIECE
        )
        elapsed = time.monotonic() - started
        self.full_cost, self.last_full = elapsed, time.monotonic()
        self.counters["full_passes"] += 1
        self.counters.update(report.counts)
        self.passes += 1
        log.info(
            "pass n=%d reason=%s mode=%s seconds=%.3f %s", self.passes, reason, self.mode, elapsed,
            " ".join(f"{k}={v}" for k, v in sorted(report.counts.items())) or "nothing-to-do=1",
        )  # fmt: skip
        log_problems(report)
        self.write_status(report, elapsed, state="running")
        return report

    def event_pass(self, events: list[Event]) -> PassReport:
        """Classify and apply just the threads these events concern."""
        started = time.monotonic()
        inc = self.inc
        if inc.planner is None or inc.plan is None:
            inc.backlog.clear()  # the next full pass reads every thread
            return PassReport()  # switched off, or no full pass yet
        batch = Batch.of(events, os.getpid(), self.cache.in_scope)
        exited, vanished, touched = inc.read(batch)
        self.watcher.forget([t.key for t in exited + vanished])
        if exited and self.mode == "enforce":  # their journal records: closed later
            self.exited += [t.key for t in exited]
        items = inc.classify(touched.values(), self.classifier, self.exclude)
        first, looked = PassReport(), [i.task.tid for i in items]
        # A layer's first member: the layer's CPUs first; on v2, a member from a home cgroup
        # without the layer's cpuset: that cpuset first.
        reason = "grow" if inc.check_sizes(self.policy, self.sizer.planned()) else ""
        if reason or inc.homeless(items, self.policy):
            first = self.relayer(reason or "home", inc.why, homes_only=not reason)
            done = {knobs.parse_task_key(r.key) for r in first.results if knobs.is_task_key(r.key)}
            items = [i for i in items if i.task.key not in done]
        unread = {t for t, ts in inc.born.items() if ts > self.scanned_ns}  # never read before

        def base(key: tuple[int, int]) -> frozenset[int] | None:
            # a thread never read before has nothing journaled: no original to look up
            return None if key[0] in unread else self.base_affinity(key)

        want = inc.decide(items, base)
        report = self.apply_threads(want, items, fresh=True, born=unread)
        report.results[:0] = first.results
        self.counters["events"] += batch.size
        self.counters["event_passes"] += 1
        self.counters.update(r.outcome for r in report.results)
        now = time.monotonic_ns()  # each new thread placed: how long after its fork event
        for stamp in placed_stamps(inc.born, report, looked):
            self.event_lag.observe(max(0, now - stamp) / 1e9)
        if log.isEnabledFor(logging.DEBUG):  # waited: from its first event to this pass
            waited = started - batch.first_ts / 1e9 if batch.first_ts else float("nan")
            log.debug(
                "events n=%d threads=%d waited=%.4f seconds=%.4f %s", batch.size, len(items),
                waited, time.monotonic() - started,
                " ".join(f"{k}={v}" for k, v in sorted(report.counts.items())),
            )  # fmt: skip
        log_problems(report)
        return report

    def relayer(self, reason: str, why: str = "", homes_only: bool = False) -> PassReport:
        """Plan the layers' CPUs again alone (``Incremental.relayer``) and write what must change
        now: hostd's cpusets and the threads of the layers whose CPUs moved. The pool's threads
        follow a few at a time (``redo``)."""
        started, collections = time.monotonic(), _collections()
        relayed = self.inc.relayer(self.policy, self.sizer.planned(), homes_only)
        if relayed is None:
            return PassReport()
        want, items, moved = relayed
        self.state.refreeze = True
        want.update(self.inc.decide(items, self.base_affinity))
        planned = time.monotonic()
        report = self.apply_threads(want, items, fresh=False)
        self.counters["relayers"] += 1
        self.counters.update(r.outcome for r in report.results)
        log.info(
            "relayer reason=%s%s %s decided=%d later=%s seconds=%.4f (plan %.4f, writes %.4f, "
            "gc %d) %s", reason, f" {why}" if why else "", moved, len(items),
            ",".join(sorted(self.inc.redo_layers)) or "-", time.monotonic() - started,
            planned - started, time.monotonic() - planned, _collections() - collections,
            " ".join(f"{k}={v}" for k, v in sorted(report.counts.items())) or "nothing-to-do=1",
        )  # fmt: skip
        log_problems(report)
        self.status.due_now()  # the layers' new CPUs, said at the loop's next quiet moment
        return report

    def redo(self, count: int) -> None:
        """After a re-layer: the IRQ and cpufreq knobs, then up to ``count`` of the threads that
        use the pool, decided again with the new planner."""
        inc = self.inc
        host, inc.redo_host = inc.redo_host, None
        if host is not None:
            report = self.reconcile(host, {}, only=())
            if self.mode == "enforce":  # those the layers no longer want: back to originals
                stale = [k for k in inc.redo_stale if k not in host and k in self.journal]
                report.results += restore_keys(self.host, self.journal, stale)
            inc.redo_stale = set()
            self.counters.update(r.outcome for r in report.results)
            log_problems(report)
            return
        items = inc.take_redo(count)
        want = inc.decide(items, self.base_affinity)
        todo = redo_threads(self.journal, [i.task.key for i in items], want)
        items = [i for i in items if i.task.key in todo]
        report = self.apply_threads(want, items, fresh=False)
        self.counters["redone"] += len(items)
        self.state.refreeze = True
        self.counters.update(r.outcome for r in report.results)
        log_problems(report)

    def relook(self) -> None:
        """Classify and apply again the unnamed job threads whose activity now says more (an
        NCCL thread that settled into poll(2), a queue feeder that wrote)."""
        inc = self.inc
        changed = self.cache.relook()
        if not changed or inc.planner is None:
            return
        items = inc.classify(changed, self.classifier, self.exclude)
        want = inc.decide(items, self.base_affinity)
        report = self.apply_threads(want, items, fresh=True)
        self.counters["relooked"] += len(changed)
        self.counters.update(r.outcome for r in report.results)
        log.info(
            "relook threads=%d %s", len(changed),
            " ".join(f"{t.tid}:{t.activity}" for t in changed[:8]),
        )  # fmt: skip
        log_problems(report)

    def close_exited(self, count: int | None = None) -> None:
        """Close the journal records of up to ``count`` (None: all) of the threads that exited.
        Nothing waits for it: a record of a thread that is gone only makes a restore find it
        gone, and a full pass closes such records too. A session's knob kept on its exited
        leader's key stays: the full pass closes it once no process of the session is left."""
        cut = 0 if count is None else max(0, len(self.exited) - count)
        chunk = self.exited[cut:]
        del self.exited[cut:]
        self.journal.done(task_records(self.journal, chunk, THREAD_KINDS))

    def apply_threads(
        self, want: dict, items: list[Classified], fresh: bool, born: dict | frozenset = frozenset()
    ) -> PassReport:
        """Write ``want`` for these threads, giving back their journaled knobs it no longer
        holds; other threads are left alone. ``fresh``: the threads were just read from /proc,
        so their start times are trusted (else each is checked first: a re-layer's threads may
        have been read minutes ago, their tids since reused; one that fails is left out).
        ``born``: threads born since the last full pass read /proc, read now for the first
        time: nothing of theirs is journaled, so nothing is looked up to give back (in a storm,
        most threads)."""
        if not fresh:  # one check per thread now, not one per knob read and written
            items = [i for i in items if self.host.start_time(i.task.tid) == i.task.start_time]
        observed = Observed(item.task for item in items)
        only = [i.task.key for i in items if i.task.tid not in born]
        with self.host.known_start_times({i.task.tid: i.task.start_time for i in items}):
            return self.reconcile(want, observed, only=only)

    def join_cpusets(self, budget: int) -> None:
        """Move up to ``budget`` threads that events placed into their layer's cpuset, then set
        their affinity again (two steps: the affinity is read after the join)."""
        for want in self.inc.take_joins(budget):
            report = self.reconcile(want, {}, only=())
            self.counters.update(r.outcome for r in report.results)
            log_problems(report)

    def reconcile(self, want: dict, observed: Observed | dict, **kwargs: object) -> PassReport:
        """``hostd.reconcile.reconcile`` less the kinds switched off."""
        off = self.caps.disabled_kinds() | (
            hostd.sidecar.HOST_WIDE_KINDS if self.sidecar else set()
        )
        if off:  # (when no thread's kind is off, a thread's keys, most of them, need no look)
            tasks_on = off.isdisjoint(TASK_KINDS)
            want = {
                k: v
                for k, v in want.items()
                if (tasks_on and knobs.is_task_key(k)) or knobkinds.kind_of(k) not in off
            }
        journal = self.journal if self.mode == "enforce" else None
        args = dict(unchangeable=self.unchangeable, inherited=self.watcher.inherited, **kwargs)
        report = reconcile(self.host, journal, want, observed, **args)  # type: ignore[arg-type]
        self.inc.note_applied(report)
        return report

    def reload(self) -> None:
        try:
            new = load_checked(self.policy_path, self.allow_insecure)
        except PolicyError as exc:
            why = " | ".join(str(e) for e in exc.errors)
            log.warning("reload refused, keeping the running policy: %s", why)
            return
        self.state.policy, self.state.classifier = new, Classifier(new)
        self.watcher.configure(new)
        self.cache.read_fds = new.needs_fds
        self.journal.policy_sha = new.sha256
        log.info("reload policy=%s sha256=%s", new.name, new.sha256[:12])

    def hold_cstate(self, on: bool) -> None:
        """Hold (or release) the policy's C-state limit; the kernel lifts it when we exit."""
        want = None if self.sidecar else self.policy.cpu_dma_latency_us
        if on and want is not None and self.latency_fd is None and self.mode == "enforce":
            try:
                self.latency_fd = hold_cpu_dma_latency(self.host, want)
                log.info("cstate cpu_dma_latency_us=%d held", want)
            except OSError as exc:
                log.warning("cstate refused: %s", exc)
        elif (not on or want is None) and self.latency_fd is not None:
            os.close(self.latency_fd)
            self.latency_fd = None

    def write_status(self, report: PassReport, elapsed: float | None, state: str) -> None:
        address = self.exporter.address
        doc = document(
            report, elapsed, state, self.state, self.inc, self.sources, self.journal, self.caps,
            sidecar=self.sidecar, passes=self.passes, counters=self.counters,
            unchangeable=self.unchangeable, last=self.status.last, preempt=self.watcher.status(),
            event_lag=self.event_lag.doc(), layer_stats=self.layer_stats.doc(),
            attempts=self.attempts.doc(),
            sizing=self.sizer.doc() if self.policy.self_sizing else None,
            metrics=f"http://{address[0]}:{address[1]}/metrics" if address else None,
        )  # fmt: skip
        self.status.write(doc, self.counters)
        self.watcher.changed = False

    def say(self) -> None:
        """The status file now, between full passes (what a statistics sample found)."""
        self.write_status(PassReport(), None, state="running")


def _collections() -> int:
    """How many times the garbage collector has run so far (all generations): a relayer's log
    line says whether a collection fell inside it."""
    return sum(g["collections"] for g in gc.get_stats())

"""The agent: observe -> classify -> plan -> diff -> journal -> apply -> report, driven by events.

``Agent.pass_once()`` runs one full pass (``hostd run --once``): topology, every thread, the
whole plan. ``Agent.run()`` then waits on its event sources in one ``select`` loop:

* **proc connector** (``hostd.host.connector``): fork, exec, comm and exit events. Pending
  events are drained and coalesced per thread (a bounded batch), then ``event_pass`` re-reads
  just those threads (one stat and one sched_getaffinity each), classifies them, decides them
  with the last full plan's ``TaskPlanner`` and applies the difference: milliseconds, however
  many threads the host has. A lost event (ENOBUFS) triggers a full rescan.
* **device events** (``hostd.host.uevents``): a CPU going offline or online, a PCI or network
  device coming or going: a full pass with the topology read again (a CPU back online also
  gets back the v1 cpusets the kernel emptied).
* **timers**: a full rescan for drift (someone else changed a knob hostd owns; a thread whose
  event was missed) every ``[agent] rescan_interval`` seconds, stretched to 100 times the cost
  of a rescan so it never takes more than 1% of a CPU; without the connector (a container
  without the host's pid namespace, or ``[agent] source = "poll"``), a full pass every
  ``[agent] interval`` seconds instead. When events change a layer's thread count enough to
  change its CPU share, a full re-plan follows, at most one per 20 times its cost (a layer that
  shrank waits 30 s: a short-lived matching process must not make the host flap).
* **the watch** (``hostd.agent.watch``): every ``[preempt] interval`` while a protected layer
  has threads, what threads wanted from the scheduler: busy sessions of preemptible layers
  are demoted (``hostd.preempt``), starving threads boosted, runaway real-time threads
  returned to normal scheduling.

SIGTERM/SIGINT restore everything hostd changed (unless the policy says ``restore_on_exit =
false``). SIGHUP reloads the policy (a bad new policy keeps the old one, and says why); SIGUSR1
runs a full pass at once (``hostd enable``/``disable`` use it). Files:

* ``STATE_DIR/journal.jsonl``: the originals (``hostd.journal``); survives a crash, so
  ``hostd restore`` works after ``kill -9``.
* ``RUN_DIR/agent.pid`` (locked while the agent runs), ``RUN_DIR/status.json`` (written after
  every full pass and at most once a second otherwise, read by ``hostd status``),
  ``RUN_DIR/disabled`` (present: switched off).

With ``scope`` (``hostd run --scope-pid PID``) only those processes and their descendants are
classified and changed: a sandbox for tests. ``sidecar`` (``hostd run --sidecar``) scopes it to
its own pod and leaves host-wide knobs alone (``hostd.sidecar``).
The agent never touches its own process, and uses the doctor's probe to leave out what the host
does not allow (feature by feature) instead of failing.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import json
import logging
import os
import select
import signal
import time
from collections import Counter
from pathlib import Path

import hostd.sidecar
from hostd import __version__, knobkinds, knobs
from hostd.agent.watch import WatchLoop
from hostd.classify import Classified, Classifier
from hostd.cpufreq import hold_cpu_dma_latency
from hostd.doctor import Capabilities, probe
from hostd.host import Host
from hostd.host.connector import DEFAULT_RCVBUF, Event, Overflow, ProcConnector
from hostd.host.syscalls import POLICY_NUMBERS
from hostd.host.uevents import DeviceEvents
from hostd.journal import Journal, JournalError, read_boot_id
from hostd.model.cpus import home_of, parse_cpulist
from hostd.model.tasks import Task
from hostd.model.topology import Topology
from hostd.plan import (
    NumaPlan,
    Plan,
    TaskPlan,
    TaskPlanner,
    layer_want,
    may_touch,
    plan,
    smt_width_of,
)
from hostd.policy import Policy, PolicyError, insecure_reason, load_default, load_policy
from hostd.reconcile import (
    Observed,
    PassReport,
    desired_for_tasks,
    desired_state,
    reconcile,
    restore,
    task_records,
)
from hostd.statedir import (
    HOST_LOCK,
    Locked,
    UnsafeDir,
    lock_host,
    open_dir,
    open_file,
    owned_file,
    write_atomic,
)
from hostd.tasks import TaskCache
from hostd.topology import read_topology

log = logging.getLogger("hostd")

DEFAULT_STATE_DIR = "/var/lib/hostd"
DEFAULT_RUN_DIR = "/run/hostd"


class AgentError(RuntimeError):
    """The agent cannot start (another one runs, the policy is refused)."""


def load_checked(path: str | None, allow_insecure: bool) -> Policy:
    """The policy, refusing one that a non-root user could have written (raises PolicyError)."""
    if path is None:
        return load_default()
    policy = load_policy(path)  # a missing, looping or non-regular file is said as such first
    if os.geteuid() == 0 and not allow_insecure:
        why = insecure_reason(path)
        if why:
            raise PolicyError.about_file(
                str(path),
                f"a policy only root can change ({why}); "
                "pass --allow-insecure-policy to use it anyway",
            )
    return policy


def read_status(run_dir: str | Path) -> dict | None:
    try:
        with open(Path(run_dir) / "status.json", encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def agent_pid(run_dir: str | Path) -> int | None:
    """The pid of the running agent, or None (the pid file is locked while it runs)."""
    path = Path(run_dir) / "agent.pid"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it: a stale file
        except OSError:
            return int(os.read(fd, 32).decode().strip() or 0) or None
    finally:
        os.close(fd)


class Agent:
    MAX_BATCH = 8192  # events handled per event pass; the rest wait for the next one

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
        self.host = host
        self.sidecar = sidecar
        self.policy_path = policy_path
        self.allow_insecure = allow_insecure_policy
        self.policy = load_checked(policy_path, allow_insecure_policy)
        self.mode_override = mode
        self.scope = scope
        self.state_dir = Path(state_dir)
        self.run_dir = Path(run_dir)
        try:
            os.close(open_dir(self.state_dir, 0o700))
        except UnsafeDir as exc:
            raise AgentError(str(exc)) from None
        try:
            self.journal = Journal(self.state_dir, read_boot_id(host), self.policy.sha256)
        except JournalError as exc:
            raise AgentError(f"{exc}: `hostd restore` reports what it holds") from None
        if self.journal.damaged:
            number, why = self.journal.damaged[0]
            raise AgentError(
                f"{self.journal.path} is damaged ({len(self.journal.damaged)} unreadable "
                f"line(s); line {number}: {why}): an agent started on it would take its own "
                "values for originals. Run `hostd restore`: it restores every readable record "
                "and sets the file aside"
            )
        self.caps: Capabilities = probe(host)
        self.unchangeable: set[str] = set()
        self.last: dict = {}
        self.passes = 0
        self._lock_fd: int | None = None
        self._host_fd: int | None = None
        self._run_fd: int | None = None
        self._stop = False
        self._reload = False
        self._poke = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._latency_fd: int | None = None
        # Incremental state, from the last full pass.
        pod = functools.partial(hostd.sidecar.scope, host) if sidecar and scope is None else None
        self.cache = TaskCache(host, read_fds=self.policy.needs_fds, scope=pod or scope)
        self.classifier = Classifier(self.policy)
        self.classified: dict[int, Classified] = {}
        self.layer_counts: Counter[str] = Counter()
        self.topology: Topology | None = None
        self.plan: Plan | None = None
        self.planner: TaskPlanner | None = None
        self.exclude = frozenset({os.getpid()})
        # Event sources and timers.
        self.connector: ProcConnector | None = None
        self.devices: DeviceEvents | None = None
        self.source = "poll"
        self.source_detail = ""
        self.full_cost = 0.0  # seconds the last full pass took
        self.last_full = 0.0  # monotonic time it ended
        self.replan_due: float | None = None
        # cpuset joins that event passes left for a quiet moment: key -> (cgroup path,
        # the thread's affinity key, its affinity value).
        self.pending_cpusets: dict[str, tuple[object, str, object]] = {}
        self.counters: Counter[str] = Counter()
        self.watcher = WatchLoop(self)
        self._last_status = 0.0
        self._status_counters: Counter[str] = Counter()
        if self.journal.torn:
            log.info("journal line=%d reason=cut-off-by-a-crash (never applied)", self.journal.torn)
        if self.journal.dropped_old_boot:
            log.info(
                "journal dropped=%d reason=task-records-from-an-earlier-boot",
                self.journal.dropped_old_boot,
            )

    @property
    def mode(self) -> str:
        return self.mode_override or self.policy.mode

    @property
    def disabled(self) -> bool:
        # Only a flag root could have made counts (the run dir is checked at start).
        return owned_file(self.run_dir / "disabled")

    # -- full pass -----------------------------------------------------------------------------
    def _cstate(self, on: bool) -> None:
        """Hold (or release) the policy's C-state limit; the kernel lifts it when we exit."""
        want = None if self.sidecar else self.policy.cpu_dma_latency_us
        if on and want is not None and self._latency_fd is None and self.mode == "enforce":
            try:
                self._latency_fd = hold_cpu_dma_latency(self.host, want)
                log.info("cstate cpu_dma_latency_us=%d held", want)
            except OSError as exc:
                log.warning("cstate refused: %s", exc)
        elif (not on or want is None) and self._latency_fd is not None:
            os.close(self._latency_fd)
            self._latency_fd = None

    def _base_affinity(self, key: tuple[int, int]) -> frozenset[int] | None:
        """The thread's affinity before hostd changed it (None: not changed)."""
        k = knobs.task_key(key[0], key[1], "affinity")
        return parse_cpulist(str(self.journal.original(k))) if k in self.journal else None

    def pass_once(self, reason: str = "start") -> PassReport:
        """A full pass: the topology and every thread read again, the whole plan applied."""
        started = time.monotonic()
        self._cstate(not self.disabled)
        self.replan_due = None
        self.pending_cpusets.clear()  # a full pass places every thread in its cpuset, or none
        if self.disabled:
            self.planner = None  # events change nothing while switched off
            self.watcher.reset()
            report = restore(self.host, self.journal) if len(self.journal) else PassReport()
            self._write_status(report, time.monotonic() - started, state="disabled")
            self.last_full = time.monotonic()
            return report
        self.topology = topo = read_topology(self.host)
        # The last pass's per-thread state goes before this one's is built, not after: at 100k
        # threads holding both was the agent's peak memory.
        self.plan, self.planner, self.classified = None, None, {}
        tasks = self.cache.rescan()
        classified = self.classifier.classify_all(tasks)
        self.classified = {c.task.tid: c for c in classified}
        self.layer_counts = Counter(c.layer for c in classified)
        base = {
            knobs.parse_task_key(k): parse_cpulist(str(self.journal.original(k)))
            for k in self.journal.recorded()
            if k.endswith("/affinity")
        }
        self.plan = the_plan = plan(
            topo,
            classified,
            self.policy,
            base_affinity=base,
            exclude_pids=self.exclude,
            allow_rt=self.caps.rt,
            demoted_sessions=frozenset(self.watcher.watch.demoted),
            runaways=frozenset(self.watcher.watch.runaways),
        )
        self.planner = TaskPlanner.for_plan(
            the_plan,
            topo,
            self.policy,
            allow_rt=self.caps.rt,
            exclude_pids=self.exclude,
            runaways=self.watcher.watch.runaways,
        )
        report = self._reconcile(
            desired_state(the_plan, tasks),
            Observed(tasks),
            live_keys={t.key for t in tasks},
        )
        elapsed = time.monotonic() - started
        self.full_cost = elapsed
        self.last_full = time.monotonic()
        self.counters["full_passes"] += 1
        self._log(report, elapsed, reason)
        self._write_status(report, elapsed, state="running")
        return report

    def _reconcile(self, want: dict, observed: Observed, **kwargs: object) -> PassReport:
        off = self.caps.disabled_kinds() | (
            hostd.sidecar.HOST_WIDE_KINDS if self.sidecar else set()
        )
        if off:
            want = {k: v for k, v in want.items() if knobkinds.kind_of(k) not in off}
        report = reconcile(
            self.host,
            self.journal if self.mode == "enforce" else None,
            want,
            observed,
            unchangeable=self.unchangeable,
            inherited=self.watcher.inherited,
            **kwargs,
        )
        self._note_applied(report)
        return report

    def _note_applied(self, report: PassReport) -> None:
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

    # -- event pass ----------------------------------------------------------------------------
    def event_pass(self, events: list[Event]) -> PassReport:
        """Classify and apply just the threads these events concern."""
        started = time.monotonic()
        if self.planner is None or self.plan is None:
            return PassReport()  # switched off, or no full pass yet
        cache, me = self.cache, os.getpid()
        named: dict[int, int] = {}  # tid -> tgid, to read again
        exec_pids: set[int] = set()
        leaders: dict[int, str] = {}  # pid -> new comm of its renamed leader
        exits: list[int] = []
        for ev in events:
            if ev.tgid == me:
                continue
            if ev.kind == "exit":
                named.pop(ev.tid, None)
                exits.append(ev.tid)
            elif ev.kind == "fork":
                parent = ev.parent_tgid if ev.tid == ev.tgid else 0
                if cache.in_scope(ev.tgid, parent):
                    named[ev.tid] = ev.tgid
            elif cache.in_scope(ev.tgid):
                named[ev.tid] = ev.tgid
                if ev.kind == "exec":
                    exec_pids.add(ev.tgid)
                elif ev.tid == ev.tgid:
                    leaders[ev.tgid] = ev.comm

        # Exits: forget the thread, free its RT slot, close its journal records.
        gone: list[tuple[int, int]] = []
        for tid in exits:
            task = self._drop(tid)
            if task is not None:
                gone.append(task.key)
        if gone and self.mode == "enforce":
            self.journal.done(task_records(self.journal, gone))

        # A renamed leader changes the leader comm of all its threads; then read the named.
        touched: dict[int, Task] = {}
        for pid, comm in leaders.items():
            for task in cache.renamed_leader(pid, comm):
                touched[task.tid] = task
        for task in cache.refresh(named.items(), exec_pids):
            touched[task.tid] = task
        for tid in named:
            if tid not in cache.tasks:
                self._drop(tid, cached=False)

        # Classify and decide them with the last full plan's CPUs.
        layers = self.planner.layers
        items: list[Classified] = []
        for task in touched.values():
            layer, group = self.classifier.matched_group(task)
            item = Classified(task, layer.name, group)
            old = self.classified.get(task.tid)
            if old is not None:
                self.layer_counts[old.layer] -= 1
                if old.layer != item.layer:
                    self.planner.forget(task.key)
            self.layer_counts[item.layer] += 1
            self.classified[task.tid] = item
            if may_touch(item, layers, self.exclude):
                items.append(item)
        task_plans: list[TaskPlan] = []
        numa_plans: list[NumaPlan] = []
        for item in items:
            tp, np_ = self.planner.decide(item, self._base_affinity(item.task.key))
            if tp is not None:
                task_plans.append(tp)
            if np_ is not None:
                numa_plans.append(np_)
        want = desired_for_tasks(task_plans, numa_plans)
        # Joining a cpuset takes the cgroup core's thread-group lock for writing, which waits
        # out every fork in flight: in a thread storm, milliseconds per thread. A new thread's
        # affinity already keeps it on its layer's CPUs, so it joins its layer's cpuset a
        # moment later (``_join_cpusets``), when no events are waiting. Going back home from a
        # hostd cpuset cannot wait: its affinity would not fit the cpuset it is in.
        joins = [
            k for k, v in want.items() if knobkinds.kind_of(k) == "cpuset" and home_of(str(v)) != v
        ]
        for key in joins:
            affinity_key = key.rsplit("/", 1)[0] + "/affinity"
            self.pending_cpusets[key] = (want.pop(key), affinity_key, want.get(affinity_key))
        with self.host.known_start_times({t.tid: t.start_time for t in touched.values()}):
            report = self._reconcile(
                want,
                Observed(item.task for item in items),
                only=[item.task.key for item in items],
            )
        self.counters["events"] += len(events)
        self.counters["event_passes"] += 1
        for r in report.results:
            self.counters[r.outcome] += 1
        self._check_layer_sizes()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "events n=%d threads=%d seconds=%.4f %s",
                len(events),
                len(items),
                time.monotonic() - started,
                " ".join(f"{k}={v}" for k, v in sorted(report.counts.items())),
            )
        self._log_problems(report)
        return report

    def _drop(self, tid: int, cached: bool = True) -> Task | None:
        """Forget an exited thread everywhere (``cached``: the cache still holds it)."""
        task = self.cache.forget(tid) if cached else None
        item = self.classified.pop(tid, None)
        if item is not None:
            self.layer_counts[item.layer] -= 1
            task = task or item.task
        if task is not None and self.planner is not None:
            self.planner.forget(task.key, task.pid if task.pid not in self.cache.procs else None)
        if task is not None:
            self.watcher.forget([task.key])
        return task

    def _join_cpusets(self, budget: int) -> None:
        """Move up to ``budget`` threads that events placed into their layer's cpuset, then set
        their affinity again (joining a cpuset resets it)."""
        keys = list(itertools.islice(self.pending_cpusets, budget))
        pending = [self.pending_cpusets.pop(k) for k in keys]
        joins = {k: p[0] for k, p in zip(keys, pending, strict=True)}
        affinities = {p[1]: p[2] for p in pending if p[2] is not None}
        for want in (joins, affinities):  # two steps: the affinity is read after the join
            report = self._reconcile(want, {}, only=())
            for r in report.results:
                self.counters[r.outcome] += 1
            self._log_problems(report)

    def _check_layer_sizes(self) -> None:
        """Events moved threads between layers: when a layer's CPU share would change, plan the
        whole host again soon (at most one such re-plan per 20 times a full pass's cost)."""
        if self.plan is None or self.topology is None or self.replan_due is not None:
            return
        total = len(self.topology.online)
        width = smt_width_of(self.topology)
        for lp in self.plan.layers:
            if lp.kind == "open":
                continue
            want = layer_want(self.policy.layer(lp.name), self.layer_counts[lp.name], total, width)
            if want != lp.wanted:
                # A layer that grew gets its CPUs within a second; one that shrank waits half a
                # minute, so a short-lived matching process does not make the host flap.
                wait = 1.0 if want > lp.wanted else 30.0
                self.replan_due = max(
                    time.monotonic(), self.last_full + max(wait, 20 * self.full_cost)
                )
                log.info("replan layer=%s wanted=%d now=%d", lp.name, lp.wanted, want)
                return

    # -- reporting -----------------------------------------------------------------------------
    def _log(self, report: PassReport, elapsed: float, reason: str) -> None:
        counts = report.counts
        self.passes += 1
        log.info(
            "pass n=%d reason=%s mode=%s seconds=%.3f %s",
            self.passes,
            reason,
            self.mode,
            elapsed,
            " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing-to-do=1",
        )
        self._log_problems(report)

    def _log_problems(self, report: PassReport) -> None:
        unjournaled = [r for r in report.results if r.outcome == "unjournaled"]
        if unjournaled:
            log.error(
                "journal write failed: %d change(s) not made: %s",
                len(unjournaled),
                unjournaled[0].detail,
            )
        for r in report.results:
            if r.outcome in ("error",):
                log.error("action key=%s outcome=%s detail=%r", r.key, r.outcome, r.detail)
            elif r.outcome in ("not-permitted", "unsupported"):
                log.warning("action key=%s outcome=%s detail=%r", r.key, r.outcome, r.detail)
            elif r.outcome == "unchangeable" and r.detail != "refused before":
                log.info("action key=%s outcome=unchangeable (remembered, not retried)", r.key)

    def _write_status(self, report: PassReport, elapsed: float | None, state: str) -> None:
        layers = []
        if self.plan is not None and state == "running":
            layers = [
                {
                    "name": lp.name,
                    "kind": lp.kind,
                    "threads": self.layer_counts[lp.name],
                    "cpus": sorted(lp.cpus),
                    "notes": list(lp.notes),
                }
                for lp in self.plan.layers
            ]
        status = {
            "version": __version__,
            "pid": os.getpid(),
            "state": state,
            "mode": self.mode,
            "policy": {
                "source": self.policy.source,
                "name": self.policy.name,
                "sha256": self.policy.sha256,
            },
            "source": {"kind": self.source, "detail": self.source_detail},
            "sidecar": self.sidecar,
            "layers": layers,
            "last_pass": self.last.get("last_pass", {}),
            "passes": self.passes,
            "events": dict(self.counters),
            "journal": {"path": str(self.journal.path), "records": len(self.journal)},
            "unchangeable": sorted(self.unchangeable),
            "preempt": self.watcher.status(),
            "capabilities": {
                "rt": self.caps.rt,
                "cpuset": self.caps.cpuset,
                "irqs": self.caps.irqs,
                "cpufreq": self.caps.cpufreq,
            },
        }
        if elapsed is not None:
            status["last_pass"] = {
                "time": time.time(),
                "seconds": round(elapsed, 4),
                "counts": report.counts,
            }
        self.last = status
        self.watcher.changed = False
        self._last_status = time.monotonic()
        self._status_counters = self.counters.copy()
        if self._run_fd is None:
            self._run_fd = open_dir(self.run_dir)
        write_atomic(self._run_fd, "status.json", json.dumps(status, indent=1).encode())

    # -- the loop ------------------------------------------------------------------------------
    def _lock(self) -> None:
        try:
            self._host_fd = lock_host()
        except Locked as exc:
            raise AgentError(
                f"another hostd agent is running (pid {exc.pid or '?'}; one per host: {HOST_LOCK})"
            ) from None
        except PermissionError:
            raise AgentError(f"hostd run needs root (it could not take {HOST_LOCK})") from None
        try:
            self._run_fd = open_dir(self.run_dir)
            fd = open_file(self._run_fd, "agent.pid", os.O_RDWR | os.O_CREAT, 0o644)
        except (UnsafeDir, OSError) as exc:
            raise AgentError(str(exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise AgentError(f"another hostd agent is running ({self.run_dir}/agent.pid)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _signal(self, signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stop = True
        elif signum == signal.SIGHUP:
            self._reload = True
        elif signum == signal.SIGUSR1:
            self._poke = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def reload(self) -> None:
        try:
            new = load_checked(self.policy_path, self.allow_insecure)
        except PolicyError as exc:
            log.warning("reload refused, keeping the running policy: %s", exc)
            return
        self.policy = new
        self.classifier = Classifier(new)
        self.watcher.configure(new)
        self.cache.read_fds = new.needs_fds
        self.journal.policy_sha = new.sha256
        log.info("reload policy=%s sha256=%s", new.name, new.sha256[:12])

    def _open_sources(self) -> None:
        """Subscribe to events before the first full pass, so nothing falls in between."""
        if self.policy.event_source != "poll":
            try:
                # HOSTD_CONNECTOR_RCVBUF: a smaller buffer, to provoke overflows in tests.
                rcvbuf = int(os.environ.get("HOSTD_CONNECTOR_RCVBUF", DEFAULT_RCVBUF))
                self.connector = ProcConnector(rcvbuf=rcvbuf)
                self.source = "events"
                self.source_detail = (
                    f"proc connector (receive buffer {self.connector.rcvbuf // 1024} KiB, "
                    f"event filter {'on' if self.connector.filtered else 'off'})"
                )
            except OSError as exc:
                self.source_detail = f"proc connector unavailable ({exc.strerror or exc})"
                if self.policy.event_source == "events":
                    log.warning("source events: %s; polling instead", self.source_detail)
        else:
            self.source_detail = "[agent] source = poll"
        if self.source == "poll":
            self.source_detail += f"; polling /proc every {self.policy.interval:g} s"
        try:
            self.devices = DeviceEvents(self.host)
            self.source_detail += f"; device events from {self.devices.source}"
        except Exception as exc:  # no libudev, no netlink: the rescan timer still catches up
            self.source_detail += f"; no device events ({exc})"
        log.info("source %s: %s", self.source, self.source_detail)

    def _close_sources(self) -> None:
        if self.connector is not None:
            self.connector.close()
            self.connector = None
        if self.devices is not None:
            self.devices.close()
            self.devices = None

    def _next_full(self) -> tuple[float, str]:
        """When the next full pass is due, and why."""
        if self.source == "poll":
            due, why = self.last_full + self.policy.interval, "poll"
        else:
            # The drift rescan: never more than 1% of a CPU, however many threads there are.
            every = max(self.policy.rescan_interval, 100 * self.full_cost)
            due, why = self.last_full + every, "drift"
        if self.replan_due is not None and self.replan_due < due:
            due, why = self.replan_due, "replan"
        return due, why

    def _full(self, reason: str) -> None:
        try:
            self.pass_once(reason)
        except Exception:  # a bug or a full disk must not leave the host half-changed
            log.exception("pass failed; the journal is intact, the next pass retries")
            self.last_full = time.monotonic()

    def _drain_wake(self) -> None:
        while True:
            try:
                if not os.read(self._wake_r, 64):
                    return
            except BlockingIOError:
                return

    def run(self, once: bool = False) -> PassReport:
        self._lock()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._signal)
        log.info(
            "start version=%s mode=%s policy=%s pid=%d",
            __version__,
            self.mode,
            self.policy.source,
            os.getpid(),
        )
        if self.sidecar:
            for feature, _, detail in hostd.sidecar.describe(self.host):
                log.info("%s: %s", feature, detail)
        # hostd's own priority: in a storm of new threads it must not be starved by the very
        # threads it is placing (it uses CPU only when there are events).
        if self.policy.agent_nice is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.policy.agent_nice)
            except OSError as exc:
                log.info("agent nice=%d refused (%s)", self.policy.agent_nice, exc.strerror)
        try:
            if once:
                return self.pass_once("once")
            self._open_sources()
            self._full("start")
            while not self._stop:
                try:
                    self._step()
                except Exception:  # an event source failing must not end the agent
                    log.exception("event loop step failed; a full pass follows")
                    time.sleep(0.5)
                    self._full("recovery")
            return PassReport()  # what the loop did is in the log and status.json
        finally:
            self._close_sources()
            self._cstate(False)
            self._finish()

    def _events_waiting(self) -> bool:
        if self.connector is None:
            return False
        ready, _, _ = select.select([self.connector.fileno()], [], [], 0)
        return bool(ready)

    def _step(self) -> None:
        """Wait for the next event or timer, and handle it."""
        due, why = self._next_full()
        fds = [self._wake_r]
        if self.connector is not None:
            fds.append(self.connector.fileno())
        if self.devices is not None:
            fds.append(self.devices.fileno())
        status_due = self._last_status + 1.0
        watch_due = self.watcher.next_due()
        timeout = max(0.0, min(due, status_due, watch_due) - time.monotonic())
        if self.pending_cpusets:
            timeout = 0.0
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._wake_r in ready:
            self._drain_wake()
        if self._stop:
            return
        if self._reload:
            self._reload = False
            self.reload()
            self._full("reload")
            return
        if self._poke:
            self._poke = False
            self._full("switched")
            return
        if self.devices is not None and self.devices.fileno() in ready:
            changes = self.devices.read()
            if changes:
                log.info("devices %s", " ".join(f"{c.name}:{c.action}" for c in changes[:8]))
                self.counters["device_events"] += len(changes)
                self._full("devices")
                return
        if self.connector is not None and self.connector.fileno() in ready:
            events = self.connector.read(self.MAX_BATCH)
            if any(isinstance(ev, Overflow) for ev in events):
                self.counters["overflows"] += 1
                log.warning("events lost (receive buffer overflow): rescanning /proc")
                self._full("overflow")
                return
            try:
                self.event_pass(events)  # type: ignore[arg-type]
            except Exception:
                log.exception("event pass failed; a full pass follows")
                self._full("recovery")
                return
        # A few joins at a time, and only while no event waits: each can block for
        # milliseconds while threads are being created.
        deadline = time.monotonic() + 0.002
        while self.pending_cpusets and not self._events_waiting() and time.monotonic() < deadline:
            self._join_cpusets(4)
        now = time.monotonic()
        if now >= watch_due and not self.disabled:
            self.watcher.run_due(now)
        if now >= due:
            self._full(why)
        elif now >= status_due:
            if self.counters != self._status_counters or self.watcher.changed:
                self._write_status(PassReport(), None, state="running")
            self._last_status = now  # nothing new: check again in a second

    def _finish(self) -> None:
        if self._stop and self.policy.restore_on_exit and self.mode == "enforce":
            restored = restore(self.host, self.journal)
            log.info(
                "stop restored %s",
                " ".join(f"{k}={v}" for k, v in sorted(restored.counts.items())) or "nothing",
            )
            if self.journal.problem:
                log.error("journal %s", self.journal.problem)
            self.plan = None
            self._write_status(restored, 0.0, state="stopped")
        elif self._stop:
            log.info("stop (restore_on_exit = false: changes are kept; hostd restore undoes)")
            self.plan = None
            self._write_status(PassReport(), 0.0, state="stopped")
        self.journal.close()
        # The locks go with the run (an agent may run inside a longer process: the tests).
        for name in ("_lock_fd", "_host_fd", "_run_fd"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)


def summarize(counts: Counter | dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(dict(counts).items())) or "nothing to do"

"""Diff, journal, apply, restore: turning a Plan into kernel writes, and putting them back.

``desired_state(plan, snapshot)`` lists (knob key, value) in apply order; ``reconcile`` reads
what is in place (from the snapshot where it can, else through the knob), skips what is already
right, journals the originals of everything it is about to change (fsynced, before the first
write), writes, and returns one ``Result`` per action. A knob hostd changed earlier that the
plan no longer wants is put back to its original. ``restore`` replays the whole journal.

Outcomes: applied, skipped (already right), restored, left (a restore found a value neither the
original nor one hostd wrote: someone changed it since, and it stays), gone (the thread
exited), not-permitted, unchangeable (remembered: never retried), error. One failure never stops
the pass.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hostd import knobkinds, knobs
from hostd.cpuset.cgroup import cpuset_key, group_key, subtree_key
from hostd.host import Host, HostError, paths
from hostd.host.syscalls import POLICY_NAMES
from hostd.journal import Journal, JournalError
from hostd.knobkinds import kinds
from hostd.knobs import Spec
from hostd.model.cpus import CPUSET_ROOT, format_cpulist
from hostd.model.tasks import Task, session_members
from hostd.plan import NumaPlan, Plan, TaskPlan

# Kinds that the agent records and gives back itself (hostd.agent.watch), never a pass: a
# demoted session's record and its cgroup's weight stay while the session is demoted, whatever a
# pass wants.
AGENT_KINDS = kinds(agent_owned=True)
CLK_TCK = os.sysconf("SC_CLK_TCK")
# What a thread passes on to the threads and processes it creates (sched(7), fork(2)).
INHERITABLE = kinds(inheritable=True)
TASK_KINDS = tuple(sorted(kinds(per_task=True)))
# ... less the session's knobs kept on a leader's key: a thread's exit does not end them
THREAD_KINDS = tuple(k for k in TASK_KINDS if k not in kinds(session_bound=True))


class Result(NamedTuple):
    """What became of one knob (a tuple: a pass makes one per knob, and a frozen dataclass cost
    four times as much to make)."""

    key: str
    outcome: str
    value: object = None
    detail: str = ""


@dataclass
class PassReport:
    results: list[Result] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r.outcome for r in self.results))


def desired_state(plan: Plan, tasks: Iterable[Task]) -> dict[str, object]:
    """Every knob value the plan asks for, keyed by knob key."""
    want: dict[str, object] = {}
    v1 = [cs for cs in plan.cpusets if cs.path.startswith(CPUSET_ROOT + "/")]
    if v1:  # v1: the layers' cgroups sit in hostd's own /hostd
        want[group_key()] = {
            "cpus": format_cpulist(plan.online),
            "mems": format_cpulist(sorted({m for c in v1 for m in c.mems})),
        }
    # v2: the cpuset controller enabled from the root down to each threaded cgroup's home, the
    # shallowest first (so restoring, in reverse, disables it from the deepest up).
    homes = {os.path.dirname(cs.path) for cs in plan.cpusets if cs not in v1}
    for path in sorted({a for home in homes for a in _ancestors(home)}, key=_depth):
        want[subtree_key(path)] = True
    for cs in plan.cpusets:
        want[cpuset_key(cs.path)] = {
            "cpus": format_cpulist(cs.cpus),
            "mems": format_cpulist(cs.mems),
        }
    want.update(desired_for_tasks(plan.tasks, plan.numa))
    for ip in plan.irqs:
        want[f"irq/{ip.irq}/smp_affinity_list"] = format_cpulist(ip.affinity)
    for cp in plan.cpufreq:
        if cp.governor:
            want[f"cpu/{cp.cpu}/scaling_governor"] = cp.governor
        if cp.min_freq:
            want[f"cpu/{cp.cpu}/scaling_min_freq"] = cp.min_freq
        if cp.epp:
            want[f"cpu/{cp.cpu}/energy_performance_preference"] = cp.epp
    return want


def _ancestors(path: str) -> list[str]:
    """ "/a/b" -> ["/", "/a", "/a/b"]."""
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: n + 1]) for n in range(len(parts))]


def _depth(path: str) -> tuple[int, str]:
    return len([p for p in path.split("/") if p]), path


def desired_for_tasks(
    task_plans: Iterable[TaskPlan],
    numa_plans: Iterable[NumaPlan] = (),
    held: frozenset[int] | set[int] = frozenset(),
) -> dict[str, object]:
    """The knob values of these threads' plans (and their processes' NUMA placement), less the
    cpuset of the threads in ``held`` (tids: a join that waits, ``hostd.agent.incremental``)."""
    want: dict[str, object] = {}
    for tp in task_plans:
        if tp.cpuset is not None and tp.tid not in held:
            want[knobs.task_key(tp.tid, tp.start_time, "cpuset")] = tp.cpuset
        if tp.affinity is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "affinity")] = format_cpulist(tp.affinity)
        if tp.policy is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "sched")] = [
                tp.policy,
                tp.priority or 0,
                tp.reset_on_fork,
            ]
        if tp.nice is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "nice")] = tp.nice
        if tp.group_nice is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "autogroup")] = tp.group_nice
    for np_ in numa_plans:
        want[knobs.task_key(np_.pid, np_.start_time, "numa")] = [np_.node, np_.method]
    return want


class Observed:
    """Task knob values already known from the snapshot (saves a syscall per thread), looked
    up by knob key. Built per lookup rather than as a dict of every thread's keys: at 100k
    threads that dict was 300k key strings and values, the agent's peak memory."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self.tasks = {t.tid: t for t in tasks}

    def task(self, key: str) -> Task | None:
        """The thread of a task key, if the snapshot holds that same thread."""
        if not key.startswith("task/"):  # (knobs.is_task_key, inline: a few per thread)
            return None
        tid, start = knobs.parse_task_key(key)
        t = self.tasks.get(tid)
        return t if t is not None and t.start_time == start else None

    def get(self, key: str, default: object = None) -> object:
        t = self.task(key)
        return default if t is None else self.value(t, key, default)

    @staticmethod
    def value(t: Task, key: str, default: object = None) -> object:
        """The value of one of thread ``t``'s knobs, as far as the snapshot knows it."""
        kind = key[key.rfind("/") + 1 :]  # a task key's kind is its last part
        if kind == "affinity":
            return format_cpulist(t.affinity)
        if kind == "nice":
            return t.nice
        if kind == "sched" and t.policy in POLICY_NAMES:
            # /proc/PID/stat does not show reset-on-fork: None means "unknown, read it". The
            # policies hostd sets only; deadline and ext threads are read if wanted.
            return [POLICY_NAMES[t.policy], t.rt_priority, None]
        return default


def same(current: object, wanted: object) -> bool:
    """Whether a knob holds what is wanted; a None in a list read from /proc: not known."""
    if current == wanted:
        return True
    if type(current) is not list or type(wanted) is not list or len(current) != len(wanted):
        return False
    # a loop, not all() over a generator: half the time (a new thread's policy, each)
    for c, w in zip(current, wanted, strict=True):  # noqa: SIM110
        if c is not None and c != w:
            return False
    return True


def _sessions(snapshot: Observed | None) -> set[int]:
    """The sessions that the snapshot's threads are in (a full pass: every thread's)."""
    if snapshot is None:
        return set()
    return {t.process.session for t in snapshot.tasks.values()}


def _outcome(exc: HostError) -> str:
    if exc.errno == errno.EOPNOTSUPP:
        return "unsupported"
    return exc.outcome


@dataclass
class Prepared:
    """What a pass will change, read and decided before anything is written (``prepare``):
    the report so far, the knobs to write (key, wanted, current), the originals to record
    first and the knobs to give back."""

    report: PassReport
    changes: list[tuple[str, object, object]]
    originals: list[tuple]
    giveback: list[str]


def reconcile(
    host: Host,
    journal: Journal | None,
    want: dict[str, object],
    observed: Observed,
    *,
    unchangeable: set[str],
    **options: Any,
) -> PassReport:
    """Make the host match ``want``: ``prepare``, record the originals durably (write-ahead),
    ``finish``. ``journal`` None means observe mode: decide, never write. ``unchangeable`` and
    ``options``: as ``prepare`` says."""
    prep = prepare(host, journal, want, observed, unchangeable=unchangeable, **options)
    if journal is None:
        return prep.report
    unjournaled = ""
    wrote = [(key, value) for key, value, _, spec in prep.changes if spec.kept_by_kernel]
    try:
        journal.record(prep.originals, wrote)
    except JournalError as exc:  # a full disk: none of these is written
        unjournaled = str(exc)
    return finish(host, journal, prep, unchangeable, unjournaled)


def prepare(
    host: Host,
    journal: Journal | None,
    want: dict[str, object],
    observed: Observed,
    *,
    live_keys: set[tuple[int, int]] | None = None,
    unchangeable: set[str],
    only: Iterable[tuple[int, int]] | None = None,
    inherited: Callable[[str, object], object] | None = None,
) -> Prepared:
    """``reconcile``'s reads and decisions; nothing is written but the done lines of threads
    that are gone.

    ``live_keys``: (tid, start_time) of every thread in the snapshot, to close journal records
    of threads that are gone. ``unchangeable``: keys that refused before; updated in place.
    ``only``: the threads an event pass looked at; knobs of other threads and host knobs are
    left as they are (their absence from ``want`` means "not looked at", not "not wanted").
    ``inherited(key, current)``: the original to record for a knob whose current value a thread
    inherited from one hostd changed (a thread born SCHED_IDLE in a demoted session); by
    default the current value.
    """
    report = PassReport()
    changes: list[tuple[str, object, object, Spec]] = []  # (key, wanted, current, its kind)
    snapshot = observed if isinstance(observed, Observed) else None
    found: dict[str, Task] = {}  # the snapshot's thread of each key (one lookup a key)
    specs = {key: knobkinds.spec_of(key) for key in want}  # each key's kind, looked up once
    # Apply order (``Spec.apply_order``): the controller before the cgroups, cgroups before the
    # threads that go in them, membership before affinity, policy before nice, governor before
    # its floor.
    rank = {key: spec.apply_order for key, spec in specs.items()}
    for key in sorted(want, key=rank.__getitem__):
        value, spec = want[key], specs[key]
        if key in unchangeable:
            report.results.append(Result(key, "unchangeable", value, "refused before"))
            continue
        if snapshot is None:
            current = observed.get(key, _UNKNOWN)
        elif (task := snapshot.task(key)) is None:
            current = _UNKNOWN
        else:
            found[key] = task
            current = snapshot.value(task, key, _UNKNOWN)
        # Read through the knob when the snapshot does not know, or when it matches except for
        # what /proc does not show (the reset-on-fork flag).
        if current is not _UNKNOWN:
            if not same(current, value):
                changes.append((key, value, current, spec))
                continue
            if type(current) is not list or None not in current:
                report.results.append(Result(key, "skipped", value))
                continue
        try:
            current = spec.read(host, key)
        except HostError as exc:
            report.results.append(Result(key, _outcome(exc), value, str(exc)))
            continue
        if same(current, value):
            report.results.append(Result(key, "skipped", value))
            continue
        changes.append((key, value, current, spec))

    # Knobs hostd changed before that the plan no longer wants: back to their originals.
    giveback: list[str] = []
    sessions: set[int] | None = None  # the sessions the snapshot's threads are in (when asked)
    if journal is not None:
        gone = []
        candidates = journal.recorded() if only is None else task_records(journal, only)
        for key in candidates:
            if key in want or knobkinds.kind_of(key) in AGENT_KINDS:
                continue
            if (
                live_keys is not None
                and knobs.is_task_key(key)
                and (ident := knobs.parse_task_key(key)) not in live_keys
            ):
                # Not seen by the scan: closed only when the kernel says the thread is gone (a
                # session's knob: when no process of the session is left). A failed read
                # (EMFILE: the agent out of file descriptors) keeps the record; a thread alive
                # but unseen (out of the agent's scope now), or a session outliving its leader,
                # is given back below (through a member).
                try:
                    if host.start_time(ident[0], strict=True) != ident[1]:
                        if not knobkinds.spec_of(key).session_bound:
                            gone.append(key)
                            continue
                        if sessions is None:
                            sessions = _sessions(snapshot)
                        if ident[0] not in sessions:  # no process of the session is left
                            gone.append(key)
                            continue
                except HostError as exc:
                    report.results.append(
                        Result(key, "error", None, f"unseen, and not known to be gone: {exc}")
                    )
                    continue
            giveback.append(key)
        journal.done(gone)

    if journal is None:  # observe mode
        for key, value, _, _ in changes:
            report.results.append(Result(key, "would-apply", value))
        for key in giveback:
            report.results.append(Result(key, "would-restore"))
        return Prepared(report, [], [], [])

    # The value just observed is the original, unless the snapshot could not see all of it.
    originals: list[tuple] = []
    tick = None
    recorded = journal.records
    # One inherit dict for the records that say the same (a storm's twins, a re-layer's pool
    # of threads): at 100,000 threads, one each was 20 MB of the agent's memory.
    shared: dict[tuple, dict] = {}
    for key, value, current, spec in changes:
        if key in recorded:
            continue
        try:
            if type(current) is list and None in current:
                current = spec.read(host, key)
            orig = inherited(key, current) if inherited else current
        except HostError as exc:
            report.results.append(Result(key, _outcome(exc), value, str(exc)))
            continue
        task = found.get(key) if spec.kind in INHERITABLE else None
        if task is None:
            originals.append((key, orig))
            continue
        tick = host.ticks_now() if tick is None else tick
        sid = task.process.session
        # (an inheritable kind's value is a string, an int or a flat list: hashable as a tuple)
        said = (spec.kind, sid, tuple(value) if type(value) is list else value)
        how = shared.get(said)
        if how is None:
            how = shared[said] = {"to": value, "sid": sid, "tick": tick}
        originals.append((key, orig, how))
    return Prepared(report, changes, originals, giveback)


def finish(
    host: Host, journal: Journal, prep: Prepared, unchangeable: set[str], unjournaled: str = ""
) -> PassReport:
    """``reconcile``'s writes, once the originals ``prepare`` found, and the values to write to
    knobs the kernel keeps, are in the journal (``unjournaled``: why they could not be
    recorded: then only knobs recorded before, of other kinds, are written)."""
    report, recorded = prep.report, journal.records
    for key, value, _, spec in prep.changes:
        if key not in recorded or (unjournaled and spec.kept_by_kernel):
            # Never write what cannot be restored: its original could not be read (reported
            # above) or not be recorded durably.
            if unjournaled:
                report.results.append(Result(key, "unjournaled", value, unjournaled))
            continue
        try:
            spec.write(host, key, value)
            report.results.append(Result(key, "applied", value))
        except HostError as exc:
            outcome = _outcome(exc)
            if outcome == "unchangeable":
                unchangeable.add(key)
            report.results.append(Result(key, outcome, value, str(exc)))
    report.results += restore_keys(host, journal, prep.giveback)
    return report


_UNKNOWN = object()


def task_records(
    journal: Journal, tasks: Iterable[tuple[int, int]], kinds: tuple[str, ...] = TASK_KINDS
) -> list[str]:
    """The journal's keys for these (tid, start_time) threads (``knobs.task_key``, a thread's
    prefix built once: a storm's exits ask this for thousands of threads a second)."""
    records = journal.records
    return [
        key
        for tid, start in tasks
        for prefix in (f"task/{tid}@{start}/",)
        for kind in kinds
        if (key := prefix + kind) in records
    ]


def _restore_order(keys: list[str]) -> list[str]:
    """Reverse journal order within each ``Spec.restore_phase``: a demoted session's inherited
    values first, threads rejoin their cgroup before their affinity is restored (joining a
    cpuset resets affinity), cgroups go last (once empty) and the v2 controller after them."""
    return sorted(reversed(keys), key=lambda key: knobkinds.spec_of(key).restore_phase)


LEFT = "changed by someone else since hostd wrote it: left as is"


def changed_since(current: object, wrote: tuple | None) -> bool:
    """Whether a knob's value is none hostd wrote to it (``Record.wrote``): someone else changed
    it since, and a restore leaves it (unknown, None or (): never said)."""
    return bool(wrote) and not any(same(current, value) for value in wrote or ())


DONE = ("restored", "left", "gone")  # the outcomes of a record that is closed


def restore_keys(host: Host, journal: Journal, keys: list[str]) -> list[Result]:
    if not keys:  # (every event pass asks)
        return []
    results = []
    done = []
    # the boot tick of a wall-clock time (a record's), for ``knobs.RECORDED_AT``
    boot_wall = time.time() - host.ticks_now() / CLK_TCK
    for key in _restore_order(keys):
        orig = journal.original(key)
        record = journal.records.get(key)
        knobs.RECORDED_AT.set(
            None if record is None else int((record.time - boot_wall) * CLK_TCK) + CLK_TCK
        )
        try:
            current = knobkinds.read(host, key)
            wrote = None if record is None else record.wrote
            if same(current, orig):
                results.append(Result(key, "restored", orig, "already at its original"))
            elif changed_since(current, wrote):
                results.append(Result(key, "left", current, LEFT))
            else:
                knobkinds.write(host, key, orig)
                results.append(Result(key, "restored", orig))
            done.append(key)
        except HostError as exc:
            outcome = _outcome(exc)
            if outcome == "gone":
                done.append(key)
            results.append(Result(key, outcome, orig, str(exc)))
    knobs.RECORDED_AT.set(None)
    journal.done(done)
    return results


def restore(host: Host, journal: Journal) -> PassReport:
    """Put back every knob in the journal, then what threads inherited from the threads hostd
    changed; idempotent (a second run finds nothing to do)."""
    heirs = [rec for rec in journal.records.values() if rec.inherit]
    report = PassReport(restore_keys(host, journal, journal.recorded()))
    report.results += sweep_inherited(host, heirs)
    journal.compact()
    return report


def sweep_inherited(host: Host, records: list) -> list[Result]:
    """Threads that inherited a value hostd wrote get the original back: for each record
    (``Record.inherit``: what hostd wrote, the thread's session and the boot tick then), every
    thread started since that tick in that session, or in a process descending from one of
    its processes, whose value is still what hostd wrote. (A thread hostd also changed itself
    was restored to what it had, which is that inherited value: it is put back here too.)
    After a crash as after a stop: ``hostd restore`` runs this as well."""
    if not records:
        return []
    procs = {pid: (st.ppid, st.session) for pid, st in host.processes().items()}
    # Per session and kind, what hostd wrote -> (the earliest tick it wrote it, the original,
    # the thread it wrote it to): one read per thread and kind, whatever the number of records.
    wrote: dict[int, dict[str, dict[str, tuple[int, object, int]]]] = {}
    for rec in records:
        kind = knobkinds.kind_of(rec.key)
        to = json.dumps(rec.inherit["to"])
        own, _ = knobs.parse_task_key(rec.key)
        by_to = wrote.setdefault(rec.inherit["sid"], {}).setdefault(kind, {})
        tick = rec.inherit["tick"]
        if to not in by_to or tick < by_to[to][0]:
            by_to[to] = (tick, rec.orig, own)
    results: list[Result] = []
    for sid, by_kind in wrote.items():
        for pid in sorted(session_members(procs, sid)):
            for entry in host.listdir(paths.proc(pid, "task")):
                tid = int(entry)
                start = host.start_time(tid)
                if start is None:
                    continue
                for kind, by_to in by_kind.items():
                    key = knobs.task_key(tid, start, kind)
                    try:
                        current = knobkinds.read(host, key)
                        if isinstance(current, list) and kind == "sched":
                            current = [*current[:2], False]  # a child's reset flag is off
                        hit = by_to.get(json.dumps(current))
                        if hit is None or start < hit[0] or tid == hit[2]:
                            continue
                        knobkinds.write(host, key, hit[1])
                        results.append(Result(key, "restored", hit[1], f"inherited from {hit[2]}"))
                    except HostError as exc:
                        if _outcome(exc) != "gone":
                            results.append(Result(key, _outcome(exc), None, str(exc)))
    return results

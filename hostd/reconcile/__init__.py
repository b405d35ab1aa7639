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

The package's parts: ``desired`` (plan -> wanted values), ``observed`` (what the snapshot
already knows, ``same``), ``results`` (``Result``, ``PassReport``), ``restoring`` (the journal
put back); this module applies (``reconcile``: ``prepare``, then ``finish``, looked up here:
``bench/event_pass.py`` times them by patching ``hostd.reconcile``) and re-exports them all.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from hostd import knobkinds, knobs
from hostd.host import Host, HostError
from hostd.journal import Journal, JournalError
from hostd.knobkinds import kinds
from hostd.knobs import Spec
from hostd.model.tasks import Task
from hostd.plan import Plan
from hostd.reconcile.desired import (
    HOST_PREFIXES,
    desired_for_tasks,
    desired_pieces,
    desired_state,
)
from hostd.reconcile.observed import Observed, same
from hostd.reconcile.restoring import (
    CLK_TCK,
    DONE,
    LEFT,
    TASK_KINDS,
    THREAD_KINDS,
    _restore_order,
    changed_since,
    redo_threads,
    restore,
    restore_keys,
    sweep_inherited,
    task_records,
)
from hostd.reconcile.results import PassReport, Result, _outcome

__all__ = [
    "AGENT_KINDS",
    "CLK_TCK",
    "DONE",
    "HOST_PREFIXES",
    "INHERITABLE",
    "LEFT",
    "TASK_KINDS",
    "THREAD_KINDS",
    "Observed",
    "PassReport",
    "Prepared",
    "Result",
    "_restore_order",  # (tests/unit/test_knobkinds.py)
    "changed_since",
    "desired_for_tasks",
    "desired_pieces",
    "desired_state",
    "finish",
    "prepare",
    "reconcile",
    "reconcile_pieces",
    "redo_threads",
    "restore",
    "restore_keys",
    "same",
    "sweep_inherited",
    "task_records",
]

# Kinds that the agent records and gives back itself (hostd.agent.watch), never a pass: a
# demoted session's record and its cgroup's weight stay while the session is demoted, whatever a
# pass wants.
AGENT_KINDS = kinds(agent_owned=True)
# What a thread passes on to the threads and processes it creates (sched(7), fork(2)).
INHERITABLE = kinds(inheritable=True)


def _sessions(snapshot: Observed | None) -> set[int]:
    """The sessions that the snapshot's threads are in (a full pass: every thread's)."""
    if snapshot is None:
        return set()
    return {t.process.session for t in snapshot.tasks.values()}


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


def reconcile_pieces(
    apply: Callable[..., PassReport], plan: Plan, tasks: list[Task], observed: Observed, size: int
) -> PassReport:
    """A full pass's reconcile, ``size`` threads at a time (``desired_pieces``), each piece
    through ``apply`` (``reconcile`` with the caller's options), their reports folded in one
    (``PassReport.fold``). ``observed``: every thread of ``tasks``, by tid."""
    report, earlier = PassReport(), set()
    for want, only in desired_pieces(plan, tasks, size):
        if only is None:  # the last: what no piece wanted is given back
            part = apply(want, observed, live_keys=observed, earlier=earlier)
        else:
            part = apply(want, observed, only=only)
            if not only:  # the first, hostd's cgroups
                earlier.update(want)
        report.fold(part)
    return report


def prepare(
    host: Host,
    journal: Journal | None,
    want: dict[str, object],
    observed: Observed,
    *,
    live_keys: Container[tuple[int, int]] | None = None,
    earlier: Container[str] | None = None,
    unchangeable: set[str],
    only: Iterable[tuple[int, int]] | None = None,
    inherited: Callable[[str, object], object] | None = None,
) -> Prepared:
    """``reconcile``'s reads and decisions; nothing is written but the done lines of threads
    that are gone.

    ``live_keys``: (tid, start_time) of every thread in the snapshot (an ``Observed`` will do),
    to close journal records of threads that are gone. ``earlier``: the last of a full pass's
    pieces (``reconcile_pieces``): the knobs its earlier pieces wanted, which are not given
    back, and the records of those threads were looked at by them; the others and the host's
    are looked at here. ``unchangeable``: keys that refused before; updated in place.
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
            if earlier is not None and key in earlier:
                continue
            if live_keys is not None and knobs.is_task_key(key):
                if (ident := knobs.parse_task_key(key)) in live_keys:
                    if earlier is None:
                        giveback.append(key)
                    continue
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

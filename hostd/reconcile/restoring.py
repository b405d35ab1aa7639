"""Restore: the journal's records put back, newest first, and what threads inherited from the
ones hostd changed.

``restore_keys`` gives back some records (``hostd.reconcile.finish``: knobs the plan no longer
wants; the agent: exited threads, a demotion ended); ``restore`` replays the whole journal (the
agent's stop, ``hostd restore``); ``sweep_inherited`` finds the heirs. ``task_records``: a
thread's records in the journal; ``redo_threads``: which of a re-layer's threads have any.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable

from hostd import knobkinds, knobs
from hostd.host import Host, HostError, paths
from hostd.journal import Journal
from hostd.knobkinds import kinds
from hostd.model.tasks import session_members
from hostd.reconcile.observed import same
from hostd.reconcile.results import PassReport, Result, _outcome

CLK_TCK = os.sysconf("SC_CLK_TCK")
TASK_KINDS = tuple(sorted(kinds(per_task=True)))
# ... less the session's knobs kept on a leader's key: a thread's exit does not end them
THREAD_KINDS = tuple(k for k in TASK_KINDS if k not in kinds(session_bound=True))


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


def redo_threads(
    journal: Journal, threads: Iterable[tuple[int, int]], want: dict
) -> set[tuple[int, int]]:
    """For a re-layer's redo (``want``: what the new planner decided for these threads): each
    thread the new plan leaves as it was before hostd gets its original affinity back in
    ``want``, its record kept open (no journal write, and no fsync, now; none when the next
    re-layer changes it again; the next full pass closes it). Returns the threads that have
    something to do: a knob wanted, or a record to give back. One with neither is as the plan
    wants it (the pool given back before its turn came: after a grow and a shrink in a row,
    most of the pool's threads) and is not read again."""
    wanted = {knobs.parse_task_key(k) for k in want if knobs.is_task_key(k)}
    todo = set()
    for tid, start in threads:
        key = knobs.task_key(tid, start, "affinity")
        if key not in want and key in journal:
            want[key] = journal.original(key)
            todo.add((tid, start))
        elif (tid, start) in wanted or task_records(journal, [(tid, start)]):
            todo.add((tid, start))
    return todo


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

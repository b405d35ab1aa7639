"""An event batch: what a burst of proc-connector events asks the agent to look at again.

Pure. ``Batch.of(events, me, in_scope)`` coalesces a burst per thread: a thread that was
created, renamed and exited within the batch is only an exit; a thread named twice is read
once. ``in_scope(tgid, parent)`` tells whether a process is watched at all (``hostd run
--scope-pid``, a sidecar's pod); the agent's own process is never looked at.
``placed_stamps`` gives the fork events' stamps of the new threads a pass placed, for the
agent's event lag (a fork event to the thread's knobs applied).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hostd import knobs
from hostd.host.connector import Event

if TYPE_CHECKING:
    from hostd.reconcile import PassReport


@dataclass
class Batch:
    named: dict[int, int] = field(default_factory=dict)  # tid -> tgid: read these again
    exec_pids: set[int] = field(default_factory=set)  # processes that exec'd: all read again
    leaders: dict[int, str] = field(default_factory=dict)  # pid -> its leader's new comm
    exits: list[int] = field(default_factory=list)  # tids that exited
    born: dict[int, int] = field(default_factory=dict)  # tid -> its fork event's stamp (ns)
    size: int = 0  # events in the batch
    first_ts: int = 0  # its first event's stamp (ns, CLOCK_MONOTONIC; 0 unknown): its wait

    @classmethod
    def of(cls, events: Iterable[Event], me: int, in_scope: Callable[..., bool]) -> Batch:
        batch = cls()
        named, born, exits = batch.named, batch.born, batch.exits  # (a storm's 20k events/s)
        size = first = 0
        for ev in events:
            size += 1
            if not first:
                first = ev.ts
            kind, tid, tgid = ev.kind, ev.tid, ev.tgid
            if tgid == me:
                continue
            if kind == "exit":
                named.pop(tid, None)
                born.pop(tid, None)
                exits.append(tid)
            elif kind == "fork":
                if in_scope(tgid, ev.parent_tgid if tid == tgid else 0):
                    named[tid] = tgid
                    if ev.ts:
                        born[tid] = ev.ts
            elif in_scope(tgid):
                named[tid] = tgid
                if kind == "exec":
                    batch.exec_pids.add(tgid)
                elif tid == tgid:
                    batch.leaders[tgid] = ev.comm
        batch.size, batch.first_ts = size, first
        return batch


def placed_stamps(born: dict[int, int], report: PassReport, looked: list[int]) -> list[int]:
    """The fork events' stamps (``born``) of each new thread this pass placed (``looked``: the
    threads it decided; a knob of each written, or already right: a thread inherits its
    creator's), also when that event came passes ago and the thread waited in the backlog."""
    if not born:
        return []
    # A thread none of whose knobs was written or right is not placed. A knob refused is
    # rare: the keys are parsed only then.
    placed = ("applied", "skipped")
    failed: set[int] = set()
    if any(r.outcome not in placed for r in report.results):
        task_results = [r for r in report.results if knobs.is_task_key(r.key)]
        failed = {knobs.parse_task_key(r.key)[0] for r in task_results} - {
            knobs.parse_task_key(r.key)[0] for r in task_results if r.outcome in placed
        }
    return [s for tid in looked if (s := born.get(tid)) is not None and tid not in failed]

"""An event batch: what a burst of proc-connector events asks the agent to look at again.

Pure. ``Batch.of(events, me, in_scope)`` coalesces a burst per thread: a thread that was
created, renamed and exited within the batch is only an exit; a thread named twice is read
once. ``in_scope(tgid, parent)`` tells whether a process is watched at all (``hostd run
--scope-pid``, a sidecar's pod); the agent's own process is never looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hostd.host.connector import Event


@dataclass
class Batch:
    named: dict[int, int] = field(default_factory=dict)  # tid -> tgid: read these again
    exec_pids: set[int] = field(default_factory=set)  # processes that exec'd: all read again
    leaders: dict[int, str] = field(default_factory=dict)  # pid -> its leader's new comm
    exits: list[int] = field(default_factory=list)  # tids that exited
    born: dict[int, int] = field(default_factory=dict)  # tid -> its fork event's stamp (ns)
    size: int = 0  # events in the batch

    @classmethod
    def of(cls, events: Iterable[Event], me: int, in_scope: Callable[..., bool]) -> Batch:
        batch = cls()
        for ev in events:
            batch.size += 1
            if ev.tgid == me:
                continue
            if ev.kind == "exit":
                batch.named.pop(ev.tid, None)
                batch.born.pop(ev.tid, None)
                batch.exits.append(ev.tid)
            elif ev.kind == "fork":
                parent = ev.parent_tgid if ev.tid == ev.tgid else 0
                if in_scope(ev.tgid, parent):
                    batch.named[ev.tid] = ev.tgid
                    if ev.ts:
                        batch.born[ev.tid] = ev.ts
            elif in_scope(ev.tgid):
                batch.named[ev.tid] = ev.tgid
                if ev.kind == "exec":
                    batch.exec_pids.add(ev.tgid)
                elif ev.tid == ev.tgid:
                    batch.leaders[ev.tgid] = ev.comm
        return batch

"""What hostd holds changed on the host now (``hostd changes``, ``hostd explain``): each record
of the agent's journal with its original, the value its knob has now, what hostd wrote to it and
whether someone else changed it since, judged as ``hostd restore`` would judge it
(``reconcile.changed_since``). Read-only: the journal is read as a restore reads it, no knob is
written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from hostd import knobkinds, knobs
from hostd.host import Host, HostError
from hostd.journal import JOURNAL_NAME, Journal, JournalError, read_boot_id
from hostd.reconcile import CLK_TCK, changed_since, same

# what the knob is now, against what hostd made it
STATES = {
    "held": "as hostd wrote it",
    "changed": "changed by someone else since hostd wrote it (hostd restore leaves it)",
    "original": "back at its original already",
    "gone": "gone (its thread, process or cgroup ended)",
    "unreadable": "not readable now",
}


@dataclass(frozen=True)
class Held:
    key: str
    kind: str
    what: str  # the knob, in words (``Spec.noun``)
    original: object
    current: object  # None: gone or unreadable
    wrote: list | None  # the values hostd wrote to it this boot (None: not recorded)
    state: str  # a key of STATES

    def as_json(self) -> dict:
        return {
            "key": self.key, "kind": self.kind, "what": self.what, "original": self.original,
            "current": self.current, "wrote": self.wrote, "state": self.state,
        }  # fmt: skip


def shown(kind: str, value: object) -> str:
    """A knob's value in words: a thread's scheduling as ``fifo 10, reset on fork``; a list as
    its items; None (gone, unreadable) as ``-``."""
    if value is None:
        return "-"
    if kind == "sched" and isinstance(value, list) and len(value) == 3:
        policy, prio, reset = value
        return f"{policy}{f' {prio}' if prio else ''}{', reset on fork' if reset else ''}"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def open_journal(host: Host, state_dir: str) -> tuple[Journal | None, str]:
    """The agent's journal in ``state_dir``, read-only; or None and why not (none there, one
    this user cannot read, a captured tree, a damaged one)."""
    if not host.live:
        return None, "not known for a captured tree (--root)"
    if os.path.isdir(state_dir) and not os.access(state_dir, os.R_OK | os.X_OK):
        return None, f"{state_dir} is not readable as uid {os.geteuid()} (root's is)"
    if not os.path.isfile(os.path.join(state_dir, JOURNAL_NAME)):
        return None, f"no journal in {state_dir} (no agent has changed this host)"
    try:
        return Journal(state_dir, read_boot_id(host)), ""
    except JournalError as exc:
        return None, str(exc)


def held(host: Host, journal: Journal, prefix: str = "") -> list[Held]:
    """Every record whose key starts with ``prefix``, in the journal's order."""
    found = []
    boot_wall = None
    for key, rec in journal.records.items():
        if not key.startswith(prefix):
            continue
        spec = knobkinds.spec_of(key)
        if boot_wall is None:
            boot_wall = time.time() - host.ticks_now() / CLK_TCK
        # a session's weight: a member alive when it was recorded (as a restore reads it)
        knobs.RECORDED_AT.set(int((rec.time - boot_wall) * CLK_TCK) + CLK_TCK)
        try:
            current = spec.read(host, key)
            if same(current, rec.orig):
                state = "original"
            elif changed_since(current, rec.wrote):
                state = "changed"
            else:
                state = "held"
        except HostError as exc:
            current, state = None, "gone" if exc.outcome == "gone" else "unreadable"
        finally:
            knobs.RECORDED_AT.set(None)
        wrote = list(rec.wrote) if rec.wrote else None
        found.append(Held(key, spec.kind, spec.noun, rec.orig, current, wrote, state))
    return found

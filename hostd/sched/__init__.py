"""Scheduling knobs per thread: policy + RT priority + reset-on-fork, and nice.

``task/TID@START/sched`` holds ``[policy, priority, reset_on_fork]`` ("fifo", 10, true);
``task/TID@START/nice`` holds an int. Reset-on-fork is set for real-time threads so that their
children start as SCHED_OTHER (sched(7)). Called through ``hostd.knobs`` by ``hostd.reconcile``.
"""

from __future__ import annotations

from hostd import knobs
from hostd.host import Host


def _read_sched(host: Host, key: str) -> list:
    tid = knobs.live_tid(host, key)
    policy, prio, reset = host.threads().get_sched(tid)
    return [policy, prio, reset]


def _write_sched(host: Host, key: str, value: object) -> None:
    policy, prio, reset = value  # type: ignore[misc]
    tid = knobs.live_tid(host, key)
    host.threads().set_sched(tid, str(policy), int(prio), bool(reset))


def _read_nice(host: Host, key: str) -> int:
    return host.threads().get_nice(knobs.live_tid(host, key))


def _write_nice(host: Host, key: str, value: object) -> None:
    host.threads().set_nice(knobs.live_tid(host, key), int(value))  # type: ignore[arg-type]


SCHED = knobs.register(knobs.Knob("sched", _read_sched, _write_sched, per_task=True))
NICE = knobs.register(knobs.Knob("nice", _read_nice, _write_nice, per_task=True))

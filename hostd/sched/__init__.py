"""Scheduling knobs per thread: policy + RT priority + reset-on-fork, and nice.

``task/TID@START/sched`` holds ``[policy, priority, reset_on_fork]`` ("fifo", 10, true);
``task/TID@START/nice`` holds an int. ``task/PID@START/autogroup`` holds the nice of the
autogroup of the session that process PID leads (/proc/PID/autogroup, sched(7)): with
autogroups on, CFS first shares the CPU between sessions by that weight, then between the
threads of each session by theirs, so a thread's own nice cannot win against another session.
Reset-on-fork is set for real-time threads so that their children start as SCHED_OTHER
(sched(7)). Called through ``hostd.knobs`` by ``hostd.reconcile``.
"""

from __future__ import annotations

import errno
import time

from hostd import knobs
from hostd.host import Gone, Host, HostError


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


def _read_autogroup(host: Host, key: str) -> int:
    tid = knobs.live_tid(host, key)
    text = host.read(f"proc/{tid}/autogroup")
    if text is None:
        raise Gone(errno.ESRCH, key, "the process is gone")
    try:  # "/autogroup-698 nice 0"
        return int(text.split()[-1])
    except (IndexError, ValueError):
        raise HostError(errno.EINVAL, key, f"unexpected autogroup line {text.strip()!r}") from None


def _write_autogroup(host: Host, key: str, value: object) -> None:
    rel = f"proc/{knobs.live_tid(host, key)}/autogroup"
    try:
        host.write(rel, str(int(value)))  # type: ignore[call-overload]
    except HostError as exc:
        # Without CAP_SYS_ADMIN the kernel takes one autogroup change per 100 ms host-wide.
        if exc.errno != errno.EAGAIN:
            raise
        time.sleep(0.11)
        host.write(rel, str(int(value)))  # type: ignore[call-overload]


SCHED = knobs.register(knobs.Knob("sched", _read_sched, _write_sched, per_task=True))
NICE = knobs.register(knobs.Knob("nice", _read_nice, _write_nice, per_task=True))
AUTOGROUP = knobs.register(
    knobs.Knob("autogroup", _read_autogroup, _write_autogroup, per_task=True)
)

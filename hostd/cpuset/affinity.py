"""Thread affinity knob (``task/TID@START/affinity``): sched_setaffinity(2) per thread id.

Values are cpulist strings ("0-3,8"). Called through ``hostd.knobs`` by ``hostd.reconcile``.
"""

from __future__ import annotations

from hostd import knobs
from hostd.host import Host
from hostd.model.cpus import format_cpulist, parse_cpulist


def _read(host: Host, key: str) -> str:
    tid = knobs.live_tid(host, key)
    return format_cpulist(host.threads().get_affinity(tid))


def _write(host: Host, key: str, value: object) -> None:
    tid = knobs.live_tid(host, key)
    host.threads().set_affinity(tid, parse_cpulist(str(value)))


AFFINITY = knobs.Spec(
    "affinity",
    "task/TID@START/affinity",
    _read,
    _write,
    knobs.CHECKS["cpulist"],
    noun="thread CPU affinity",
    apply_order=2,  # after the cpuset: joining a cpuset resets a thread's affinity
    per_task=True,
    inheritable=True,
    needs="affinity",
)

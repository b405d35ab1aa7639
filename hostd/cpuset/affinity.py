"""Thread affinity knob (``task/TID@START/affinity``): sched_setaffinity(2) per thread id.

Values are cpulist strings ("0-3,8"). Called through ``hostd.knobs`` by ``hostd.reconcile``.
"""

from __future__ import annotations

import errno

from hostd import knobs
from hostd.host import Host
from hostd.host.errors import HostError, NotPermitted
from hostd.model.cpus import format_cpulist, parse_cpulist


def _read(host: Host, key: str) -> str:
    tid = knobs.live_tid(host, key)
    return format_cpulist(host.threads().get_affinity(tid))


def _write(host: Host, key: str, value: object) -> None:
    tid = knobs.live_tid(host, key)
    try:
        host.threads().set_affinity(tid, parse_cpulist(str(value)))
    except HostError as exc:
        if exc.errno != errno.EINVAL:
            raise
        # No CPU it may use: the wanted CPUs lie outside its cpuset (a container's, or one of
        # hostd's it has not left yet), or went offline. Say which cpuset, for the log.
        cgroups = host.cgroups(tid) or {}
        where = cgroups.get("cpuset", cgroups.get("", "?"))
        detail = f"CPUs {value} are outside its cpuset {where} (or offline)"
        raise NotPermitted(errno.EINVAL, key, detail) from exc


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

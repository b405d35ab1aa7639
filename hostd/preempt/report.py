"""Preemption in words and plain values (``hostd.preempt``): what it means for a thread
(``explain``, for ``hostd explain``) and the demoted sessions for status.json
(``demoted_summary``, written by ``hostd.agent.watch``).
"""

from __future__ import annotations

from collections.abc import Mapping

from hostd.policy import Policy
from hostd.preempt.values import Demotion


def demoted_summary(demoted: Mapping[int, Demotion], now: float) -> list[dict]:
    """The demoted sessions as plain values (status.json)."""
    return [
        {
            "session": d.sid,
            "seconds": round(now - d.since, 1),
            "demand_at_demotion": round(d.demand, 2),
            "demand_now": round(d.demand_now, 2),
        }
        for d in sorted(demoted.values(), key=lambda d: d.sid)
    ]


def explain(
    policy: Policy,
    layer: str,
    *,
    tid: int,
    session: int,
    kept_because: str | None,
    live: Mapping | None = None,
) -> list[str]:
    """What preemption means for a thread of ``layer`` in ``session`` (``hostd explain``).
    ``kept_because``: why its session is never demoted (``why_kept``); ``live``: the running
    agent's ``preempt`` status, if one runs."""
    lines: list[str] = []
    protected = sorted(policy.protected)
    if layer in policy.protected and policy.preemptible:
        lines.append(
            f"preempt: while layer {layer!r} has threads, busy sessions of the preemptible "
            f"layers ({', '.join(sorted(policy.preemptible))}) yield to its threads at once "
            "(their threads SCHED_IDLE, their session weighed down)"
        )
    elif layer in policy.preemptible:
        cfg = policy.preempt
        lines.append(
            f"preemptible: while a protected layer ({', '.join(protected)}) has threads, a "
            f"session whose preemptible threads want {cfg.busy:g}+ CPUs (running or waiting "
            "for one) is demoted: its threads get SCHED_IDLE (any other thread preempts them "
            "at once)"
            + (f" and its session weighs nice {cfg.session_nice}" if cfg.session_nice is not None
               else "")
            + " (and its cgroup yields as a whole, cpu.idle, where it holds nothing else; "
            "its processes in the root cgroup, whose threads are all preemptible, move to "
            "hostd's cgroup /hostd.demoted, cpu.idle, until it is released)"
            + f"; released when the job leaves or after {cfg.release_after:g} s of wanting "
            f"under {cfg.busy / 4:g} CPUs"
        )  # fmt: skip
        if kept_because:
            lines.append(f"   its session {session} is never demoted: {kept_because}")
        elif live is not None:
            demoted = {d["session"]: d for d in live.get("demoted", [])}
            d = demoted.get(session)
            if d is not None:
                lines.append(
                    f"   now: its session {session} is DEMOTED (for {d['seconds']:.0f} s; it "
                    f"wanted {d['demand_at_demotion']:.2f} CPUs)"
                )
            elif not live.get("active"):
                lines.append("   now: not demoted (no protected layer has threads)")
            else:
                lines.append(f"   now: its session {session} is not demoted (not busy enough)")
    if live is not None:
        for ev in live.get("recent", []):
            if ev.get("tid") == tid:
                lines.append(f"   guard: {ev['what']}: {ev['why']}")
    return lines

"""Preemptible work and the starvation guard: the decisions, pure (no I/O).

A policy marks layers ``preempt = true`` (protected: the job's threads) and ``preemptible =
true`` (work that yields). While a protected layer has threads, the agent measures, every
``[preempt] interval`` seconds, what each thread of the host wanted from the scheduler: its run
time plus its run-queue wait (``/proc/PID/task/TID/schedstat``), as a share of one CPU. A
*session* (setsid(2); with autogroups on, also the kernel's CPU-sharing group) whose preemptible
threads together want ``busy`` CPUs or more is **demoted** (work in processes that live less than
an interval, a build's compilers, is counted by the CPU time of the session's processes: their
own, and that of the children they waited for): each of its preemptible threads
becomes SCHED_IDLE, which a waking thread of any other policy preempts at once (sched(7)), and
the session's autogroup nice goes to ``session_nice`` (19), because CFS first shares the CPUs
between autogroups by their weight and a SCHED_IDLE thread does not lower its session's
(BENCHMARKS.md, "Preemptible work"). Autogroups act only in the root cpu cgroup: a demoted
session that lives in a cgroup of its own (a scope, a container, a Slurm step) has that
cgroup weighed down as a whole (``cpu.idle``, else the least weight: ``hostd.sched.group``),
when everything in the cgroup is demoted work (``why_group_kept``), for as long as it is.
A session is the unit because work comes in sessions: a build's compilers live a second each,
a stress test forks its workers, and what a demoted thread creates is born SCHED_IDLE in the
same session.

Never demoted (``why_kept``): the kernel's and init's sessions (0 and 1), hostd's own, a session
with a controlling terminal (an operator's shell and what it runs), and a session holding a
thread of a protected layer (the job's own sessions) or of a layer that weighs its sessions
itself (``sched.group_nice``, such as the default policy's system services).
A demoted session is released when no protected layer has threads, or when its preemptible
threads have wanted less than ``busy / 4`` CPUs for ``release_after`` seconds.

The **starvation guard** (``[guard]``), on the same measurements: a thread that was runnable
(state 'R' at every sample) for ``starve_after`` seconds and ran less than 10 % of it (the
kernel's RT throttling leaves a thread under a real-time spinner 5 %) gets a boost: SCHED_FIFO one
priority above every real-time layer of the policy, for ``boost_ms`` (a demoted thread too, so
nothing starves for good), the longest-starving first, within 5 % of one CPU in all; a thread
hostd made real-time that kept ``rt_runaway_share`` of a CPU busy for ``rt_runaway_after``
seconds is a runaway and goes back to normal scheduling (nice -20) for the rest of its life.

``Watch.update`` takes the samples and returns what changes; the agent (``hostd.agent.watch``)
reads the samples, applies the decisions through the planner and the journal, and reports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from hostd.model.node import Place, place
from hostd.policy import Guard, Policy, Preempt

Key = tuple[int, int]  # (tid, start_time)

# A thread runnable ('R') at two samples in a row that waited at least WAITED of the time in
# between and ran less than STARVED of it is starving. (Under a real-time spinner the kernel's
# fair server runs it 5 % of the time, and schedstat counts only about half of the rest as
# run-queue wait: 'R' is the evidence that it wanted the CPU throughout.)
WAITED = 0.3
STARVED = 0.1
BOOST_BUDGET = 0.05  # boosts take at most this share of one CPU


@dataclass(frozen=True, slots=True)
class Sample:
    """One thread's scheduler totals (ns since it started) at one moment."""

    key: Key
    pid: int
    session: int
    layer: str
    run_ns: int
    wait_ns: int
    state: str = "S"  # its state letter (proc(5)): 'R' runnable


@dataclass(slots=True)
class Demotion:
    """A demoted session: since when, what it wanted then, and since when it wants little."""

    sid: int
    since: float
    demand: float
    low_since: float | None = None
    demand_now: float = 0.0


@dataclass
class Decisions:
    demote: list[Demotion] = field(default_factory=list)
    release: list[tuple[int, str]] = field(default_factory=list)  # (sid, why)
    boost: list[Sample] = field(default_factory=list)
    runaway: list[Sample] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.demote or self.release or self.boost or self.runaway)


def why_place_kept(where: Place, keep: Preempt) -> str | None:
    """Why a process in ``where`` keeps its session from demotion, by what it is on the node
    (``[preempt] keep_*``), or None."""
    if where.kind in keep.keep_kinds:
        return f"node infrastructure: {where.line()} ([preempt] keep_kinds)"
    if where.kind == "pod":
        if where.namespace and where.namespace in keep.keep_namespaces:
            return f"node infrastructure: {where.line()} ([preempt] keep_namespaces)"
        if where.static and keep.keep_static_pods:
            return f"node infrastructure: static {where.line()} ([preempt] keep_static_pods)"
    if where.unit and any(fnmatchcase(where.unit, pattern) for pattern in keep.keep_units):
        return f"{where.line()} ([preempt] keep_units)"
    if where.kind == "login" and where.uid in keep.keep_logins_of:
        return f"an operator's {where.line()} ([preempt] keep_logins_of)"
    return None


def why_kept(
    sid: int,
    *,
    layers: Iterable[str],
    tty: bool,
    own_sid: int,
    protected: frozenset[str],
    shielding: frozenset[str],
    places: Iterable[Place] = (),
    keep: Preempt | None = None,
) -> str | None:
    """Why session ``sid`` must never be demoted (None: it may be). ``layers``: the layers of
    its threads; ``tty``: one of its processes has a controlling terminal; ``places``: where
    its processes are on the node, judged by ``keep`` (``why_place_kept``)."""
    if sid in (0, 1):
        return "the kernel's or init's session"
    if sid == own_sid:
        return "hostd's own session"
    if keep is not None:
        for where in sorted(set(places), key=lambda p: (p.kind, p.unit)):
            why = why_place_kept(where, keep)
            if why is not None:
                return why
    if tty:
        return "an interactive session (it has a controlling terminal)"
    names = set(layers)
    held = sorted(names & protected)
    if held:
        return f"it holds threads of the protected layer {held[0]!r}"
    shield = sorted(names & shielding)
    if shield:
        return f"layer {shield[0]!r} weighs its sessions itself (group_nice)"
    return None


def why_group_kept(
    path: str,
    members: Mapping[int, int | None] | None,
    demoted: Iterable[int],
    writable: Iterable[str] = (),
) -> str | None:
    """Why the cgroup at ``path`` of a demoted session must not be weighed down as a whole
    (None: it may be). ``members``: the session of every process in it and below it (None for
    a process hostd does not know: outside its scope, or too new), or None when they could not
    all be listed. Only a cgroup that holds nothing but demoted sessions yields as a whole: a
    job's thread, an operator's shell, a service or another tenant's idle work in it keeps it.
    And only a cgroup of a kind in ``writable`` (the policy's ``[cgroups] write``): every other
    is its manager's (systemd's units, the kubelet's pods, a runtime's containers)."""
    if path.strip("/") == "":
        return "the root cgroup"
    where = place(path)
    if where.kind not in writable:
        return (
            f"it is another manager's ({where.line()}); the policy's [cgroups] write does not "
            f"list {where.kind!r}"
        )
    if members is None:
        return "its processes could not all be listed"
    if not members:
        return "it holds no process"
    down = set(demoted)
    for pid, sid in sorted(members.items()):
        if sid is None:
            return f"it holds process {pid}, which hostd does not watch"
        if sid not in down:
            return f"it holds process {pid} of session {sid}, which is not demoted"
    return None


def shielding_layers(policy: Policy) -> frozenset[str]:
    """Layers whose sessions are never demoted because they set their own session weight."""
    return frozenset(ly.name for ly in policy.layers if ly.sched.group_nice is not None)


class Watch:
    """The state between measurements: rates, demoted sessions, starving and runaway threads."""

    def __init__(self, preempt: Preempt, guard: Guard, preemptible: frozenset[str]) -> None:
        self.preempt = preempt
        self.guard = guard
        self.preemptible = preemptible
        self.demoted: dict[int, Demotion] = {}
        self.runaways: set[Key] = set()
        self._last: dict[Key, tuple[float, int, int, str]] = {}
        self._starving: dict[Key, tuple[float, int, int]] = {}  # window start, run, wait
        self._last_seen: dict[Key, tuple[int, int]] = {}  # run, wait at the previous sample
        self._hot: dict[Key, tuple[float, int, int]] = {}  # window start, run

    def configure(self, preempt: Preempt, guard: Guard, preemptible: frozenset[str]) -> None:
        """A reloaded policy: new settings, the same state."""
        self.preempt, self.guard, self.preemptible = preempt, guard, preemptible

    def rates(self, now: float, samples: Iterable[Sample]) -> dict[Key, tuple]:
        """(run share, wait share, seconds, runnable at both samples) per thread since its last
        sample; threads sampled for the first time have none yet."""
        out: dict[Key, tuple] = {}
        last = self._last
        fresh: dict[Key, tuple[float, int, int, str]] = {}
        self._last_seen = {}
        for s in samples:
            prev = last.get(s.key)
            fresh[s.key] = (now, s.run_ns, s.wait_ns, s.state)
            if prev is None:
                continue
            self._last_seen[s.key] = (prev[1], prev[2])
            dt = now - prev[0]
            if dt <= 0:
                continue
            out[s.key] = (
                max(0, s.run_ns - prev[1]) / 1e9 / dt,
                max(0, s.wait_ns - prev[2]) / 1e9 / dt,
                dt,
                s.state == "R" and prev[3] == "R",
            )
        self._last = fresh
        return out

    def update(
        self,
        now: float,
        samples: list[Sample],
        *,
        active: bool,
        rt_keys: frozenset[Key] | set[Key] = frozenset(),
        kept: Callable[[int], str | None] = lambda sid: None,
        sessions_alive: Callable[[int], bool] = lambda sid: True,
        process_demand: Mapping[int, float] | None = None,
    ) -> Decisions:
        """Decide from one round of samples taken at ``now`` (monotonic seconds).

        ``active``: a protected layer has threads. ``rt_keys``: threads hostd made real-time.
        ``kept(sid)``: why a session may not be demoted (None: it may). ``sessions_alive``:
        whether a demoted session still has processes. ``process_demand``: CPUs that each
        session's preemptible processes used since the last round, counted per process (their
        own CPU time and their reaped children's): it sees work in processes that lived less
        than a round, which per-thread samples miss; a session's demand is the larger of both.
        """
        rates = self.rates(now, samples)
        out = Decisions()
        cfg = self.preempt

        # Demand of each session's preemptible threads, in CPUs.
        demand: dict[int, float] = {}
        for s in samples:
            if s.layer in self.preemptible:
                run, wait = rates.get(s.key, (0.0, 0.0))[:2]
                demand[s.session] = demand.get(s.session, 0.0) + run + wait
        for sid, used in (process_demand or {}).items():
            demand[sid] = max(demand.get(sid, 0.0), used)
        for sid, dem in list(self.demoted.items()):
            if not active:
                out.release.append((sid, "no protected layer has threads"))
            elif not sessions_alive(sid):
                out.release.append((sid, "the session is gone"))
            else:
                dem.demand_now = demand.get(sid, 0.0)
                if dem.demand_now >= cfg.busy / 4:
                    dem.low_since = None
                    continue
                if dem.low_since is None:
                    dem.low_since = now
                if now - dem.low_since >= cfg.release_after:
                    out.release.append(
                        (sid, f"it wanted under {cfg.busy / 4:g} CPUs for {cfg.release_after:g} s")
                    )
        for sid, _ in out.release:
            self.demoted.pop(sid, None)
        if active and self.preemptible:
            for sid, want in sorted(demand.items()):
                if want < cfg.busy or sid in self.demoted or kept(sid) is not None:
                    continue
                dem = Demotion(sid, now, want, demand_now=want)
                self.demoted[sid] = dem
                out.demote.append(dem)

        if not self.guard.enabled:
            self._starving.clear()
            self._hot.clear()
            return out
        g = self.guard
        by_key = {s.key: s for s in samples}
        starving: dict[Key, tuple[float, int, int]] = {}
        hot: dict[Key, tuple[float, int, int]] = {}
        due: list[tuple[float, Key]] = []
        for key, (_, _, dt, runnable) in rates.items():
            s = by_key[key]
            if runnable:
                # Judged over the whole window since it was first seen runnable: the kernel's
                # fair server runs a thread under a real-time hog in 50 ms bursts a second.
                since, run0, wait0 = self._starving.get(key, (now - dt, *self._last_seen[key]))
                span = now - since
                if span >= g.starve_after:
                    ran = (s.run_ns - run0) / 1e9 / span
                    waited = (s.wait_ns - wait0) / 1e9 / span
                    if ran < STARVED and waited >= WAITED:
                        due.append((since, key))
                    else:
                        since, run0, wait0 = now, s.run_ns, s.wait_ns  # it ran: a new window
                starving[key] = (since, run0, wait0)
            if key in rt_keys and key not in self.runaways:
                # Judged over the window too (the fair server's bursts, again).
                since, run0, _ = self._hot.get(key, (now - dt, *self._last_seen[key]))
                span = now - since
                if span >= g.rt_runaway_after:
                    if (s.run_ns - run0) / 1e9 / span >= g.rt_runaway_share:
                        self.runaways.add(key)
                        out.runaway.append(s)
                        continue
                    since, run0 = now, s.run_ns  # it gave the CPU back: a new window
                hot[key] = (since, run0, 0)
        # The longest-starving first, within the boost budget; the others wait for a next round.
        budget = max(1, int(BOOST_BUDGET * self.preempt.interval / (g.boost_ms / 1000)))
        for _, key in sorted(due)[:budget]:
            s = by_key[key]
            out.boost.append(s)
            starving[key] = (now, s.run_ns, s.wait_ns)  # the next boost a window later
        self._starving, self._hot = starving, hot
        return out

    def forget(self, keys: Iterable[Key]) -> None:
        """Threads that exited."""
        for key in keys:
            self._last.pop(key, None)
            self._starving.pop(key, None)
            self._hot.pop(key, None)
            self.runaways.discard(key)

    def release_all(self) -> list[int]:
        sids = sorted(self.demoted)
        self.demoted.clear()
        return sids


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

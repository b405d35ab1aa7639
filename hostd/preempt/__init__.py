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

Never demoted (``why_kept``): the kernel's and init's sessions (0 and 1), hostd's own, the node's
infrastructure (``why_place_kept``: ``[preempt] keep_*`` over the node model), and a session
holding a thread of a protected layer (the job's own sessions) or of a layer that weighs its
sessions itself (``sched.group_nice``, such as the default policy's system services). A
session's CPU counts if its threads are in a preemptible layer or in any other unprotected layer
a user can land in by what they set (``counted_layers``: a name does not hide a busy loop). An
interactive session (a login logind gave a terminal; without logind, a controlling terminal,
which any user may open) has an allowance: a user's interactive sessions together keep
``[preempt] interactive_cpus`` while a job runs, the least busy first; past it, they are demoted
like any other. In a demoted session, another user's processes that are not busy themselves
are spared (``hostd.agent.watch``: a root ``runuser`` around a user's busy command).
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
from hostd.policy import Guard, Policy, Preempt, gated

Key = tuple[int, int]  # (tid, start_time)

# A thread runnable ('R') at two samples in a row that waited at least WAITED of the time in
# between and ran less than STARVED of it is starving. (Under a real-time spinner the kernel's
# fair server runs it 5 % of the time, and schedstat counts only about half of the rest as
# run-queue wait: 'R' is the evidence that it wanted the CPU throughout.)
WAITED = 0.3
STARVED = 0.1
BOOST_BUDGET = 0.05  # boosts take at most this share of one CPU
# A starving thread whose own user's other threads ran this many CPUs meanwhile is starved by
# its own user's work (a nice-19 process behind its nice-0 sibling): no boost, unless hostd
# demoted it (then the starvation is hostd's doing) or it is root's (root gains nothing by it,
# and its services are the node's: a root thread a root real-time spinner starves is boosted).
OWN_WORK = 0.5


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
    uid: int = -1  # its user (-1: not known)


@dataclass(slots=True)
class Demotion:
    """A demoted session: since when, what it wanted then, and since when it wants little."""

    sid: int
    since: float
    demand: float
    low_since: float | None = None
    demand_now: float = 0.0
    waiting_since: float | None = None  # since when it wants a CPU and got none (the floor)


@dataclass
class Decisions:
    demote: list[Demotion] = field(default_factory=list)
    release: list[tuple[int, str]] = field(default_factory=list)  # (sid, why)
    boost: list[Sample] = field(default_factory=list)
    runaway: list[Sample] = field(default_factory=list)
    lifted: list[int] = field(default_factory=list)  # released at the floor (also in release)

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
    its threads; ``places``: where its processes are on the node, judged by ``keep``
    (``why_place_kept``). An interactive session is not kept: it has an allowance
    (``[preempt] interactive_cpus``, ``Watch.update``), as a terminal is a user's to open
    (``script``, ``ssh -t``, tmux); ``tty`` is kept in the signature for the callers."""
    if sid in (0, 1):
        return "the kernel's or init's session"
    if sid == own_sid:
        return "hostd's own session"
    if keep is not None:
        for where in sorted(set(places), key=lambda p: (p.kind, p.unit)):
            why = why_place_kept(where, keep)
            if why is not None:
                return why
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


def counted_layers(policy: Policy) -> frozenset[str]:
    """The layers whose threads' CPU makes a session busy: the preemptible ones, and every
    other unprotected layer that a user can land in by what they set (a name, an argument, an
    environment: ``policy.gated``). A busy loop named like the launcher is demoted (its session's
    weight, its preemptible threads) though its own threads keep their policy; a layer behind
    a gate (the node's services, GPU services) is never made busy by a name."""
    if not policy.preemptible:
        return frozenset()
    return policy.preemptible | frozenset(
        ly.name for ly in policy.layers if not ly.preempt and not gated(ly)
    )


def shielding_layers(policy: Policy) -> frozenset[str]:
    """Layers whose sessions are never demoted because they set their own session weight."""
    return frozenset(ly.name for ly in policy.layers if ly.sched.group_nice is not None)


class Watch:
    """The state between measurements: rates, demoted sessions, starving and runaway threads."""

    def __init__(
        self,
        preempt: Preempt,
        guard: Guard,
        preemptible: frozenset[str],
        counted: frozenset[str] | None = None,
    ) -> None:
        self.configure(preempt, guard, preemptible, counted)
        self.demoted: dict[int, Demotion] = {}
        self.runaways: set[Key] = set()
        self._last: dict[Key, tuple[float, int, int, str]] = {}
        self._starving: dict[Key, tuple[float, int, int]] = {}  # window start, run, wait
        self._last_seen: dict[Key, tuple[int, int]] = {}  # run, wait at the previous sample
        self._hot: dict[Key, tuple[float, int, int]] = {}  # window start, run
        self.lifted: dict[int, float] = {}  # session lifted at the floor -> when

    def configure(
        self,
        preempt: Preempt,
        guard: Guard,
        preemptible: frozenset[str],
        counted: frozenset[str] | None = None,
    ) -> None:
        """Its settings (a reloaded policy: new settings, the same state). ``counted``: the
        layers whose threads' CPU makes a session busy (``counted_layers``; by default the
        preemptible ones)."""
        self.preempt, self.guard, self.preemptible = preempt, guard, preemptible
        self.counted = preemptible if counted is None else counted

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
        interactive: Callable[[int], int | None] = lambda sid: None,
    ) -> Decisions:
        """Decide from one round of samples taken at ``now`` (monotonic seconds).

        ``active``: a protected layer has threads. ``rt_keys``: threads hostd made real-time.
        ``kept(sid)``: why a session may not be demoted (None: it may). ``sessions_alive``:
        whether a demoted session still has processes. ``process_demand``: CPUs that each
        session's preemptible processes used since the last round, counted per process (their
        own CPU time and their reaped children's): it sees work in processes that lived less
        than a round, which per-thread samples miss; a session's demand is the larger of both.
        ``interactive(sid)``: the user of an interactive session (None: it is not one); a
        user's interactive sessions together keep up to ``interactive_cpus`` (the least busy
        first), the others are demoted like any busy session.
        """
        rates = self.rates(now, samples)
        out = Decisions()
        cfg = self.preempt

        # Demand of each session's counted threads, in CPUs.
        demand: dict[int, float] = {}
        for s in samples:
            if s.layer in self.counted:
                run, wait = rates.get(s.key, (0.0, 0.0))[:2]
                demand[s.session] = demand.get(s.session, 0.0) + run + wait
        for sid, used in (process_demand or {}).items():
            demand[sid] = max(demand.get(sid, 0.0), used)
        ran, runnable = self._progress(rates, samples)
        for sid, dem in list(self.demoted.items()):
            if not active:
                out.release.append((sid, "no protected layer has threads"))
            elif not sessions_alive(sid):
                out.release.append((sid, "the session is gone"))
            elif self._below_floor(dem, now, sid in ran, sid in runnable):
                out.release.append(
                    (sid, f"it stayed runnable {cfg.floor:g} s without running (the floor)")
                )
                out.lifted.append(sid)
                self.lifted[sid] = now
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
        # A lifted session may be demoted again once a release's time has passed.
        self.lifted = {sid: at for sid, at in self.lifted.items() if now - at < cfg.release_after}
        if active and self.preemptible:
            allowance: dict[int, float] = {}  # per user, the CPUs its interactive sessions keep
            for sid, want in sorted(demand.items(), key=lambda item: (item[1], item[0])):
                if want < cfg.busy or sid in self.demoted or sid in self.lifted:
                    continue
                if kept(sid) is not None:
                    continue
                uid = interactive(sid)
                if uid is not None:
                    left = allowance.setdefault(uid, cfg.interactive_cpus)
                    if want <= left:
                        allowance[uid] = left - want
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
        # Not a thread its own user starves (unless hostd demoted it): what the user's other
        # threads ran this round, per user.
        ran_by: dict[int, float] = {}
        for key, (run, *_) in rates.items():
            uid = by_key[key].uid
            ran_by[uid] = ran_by.get(uid, 0.0) + run
        due = [
            (since, key)
            for since, key in due
            if by_key[key].session in self.demoted
            or by_key[key].uid <= 0
            or ran_by.get(by_key[key].uid, 0.0) - rates[key][0] < OWN_WORK
        ]
        # The longest-starving first, within the boost budget; the others wait for a next round.
        budget = max(1, int(BOOST_BUDGET * self.preempt.interval / (g.boost_ms / 1000)))
        for _, key in sorted(due)[:budget]:
            s = by_key[key]
            out.boost.append(s)
            starving[key] = (now, s.run_ns, s.wait_ns)  # the next boost a window later
        self._starving, self._hot = starving, hot
        return out

    @staticmethod
    def _progress(rates: Mapping[Key, tuple], samples: Iterable[Sample]) -> tuple[set, set]:
        """The sessions whose threads ran since the last round, and those with a thread that
        wanted to (it waited on a run queue, or was runnable at both samples)."""
        ran: set[int] = set()
        runnable: set[int] = set()
        for s in samples:
            got = rates.get(s.key)
            if got is None:
                continue
            if got[0] > 0:
                ran.add(s.session)
            if got[1] > 0 or got[3]:
                runnable.add(s.session)
        return ran, runnable

    def _below_floor(self, dem: Demotion, now: float, ran: bool, runnable: bool) -> bool:
        """The floor: a demoted session that wanted a CPU for ``[preempt] floor`` seconds and
        never got one (the guard's boosts did not reach it) is lifted."""
        if ran or not runnable:
            dem.waiting_since = None
            return False
        if dem.waiting_since is None:
            dem.waiting_since = now
        return now - dem.waiting_since >= self.preempt.floor

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

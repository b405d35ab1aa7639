"""The watch's state between measurements (``Watch``): rates, demotions and their release, the
starvation guard's boosts and runaway real-time threads (``hostd.preempt``). The agent
(``hostd.agent.watch``) feeds it samples every ``[preempt] interval`` and applies what
``Watch.update`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from hostd.policy import Guard, Preempt
from hostd.preempt.values import Decisions, Demotion, Key, Sample

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

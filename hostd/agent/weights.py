"""A demoted session's own cgroup, weighed down as a whole: the CPU is shared between cgroups
before a thread's policy or a session's weight counts (BENCHMARKS.md).

Where every process in the cgroup (and below it) belongs to demoted sessions
(``hostd.preempt.why_group_kept``), its CPU weight (``cpu.idle = 1``, else the least weight,
``hostd.sched.group``) is journaled and written; checked again every tick: a process of another
session that joins it gives the cgroup its weight back at once, as does the release of the
sessions in it.

A demoted session's processes that sit in the root cpu cgroup (where a session's weight is its
autogroup's) are moved into hostd's own cgroup ``/hostd.demoted`` (``cpu.idle = 1``:
``hostd.sched.group.DEMOTED_HOME``, journaled before anything moves), when every thread of
theirs is in a preemptible layer; they go back to the root when their session is released, when
they leave it, and when the cgroup is removed (a stop, ``hostd restore``), with every process
born in it.

It works through the host door, the journal and the watch's ``Applier`` (the processes hostd
knows, the agent's reconcile), and leaves alone the bystanders the watch spares (``spared``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hostd import knobkinds, knobs
from hostd.host import Gone, HostError, paths
from hostd.host.parsers import parse_stat
from hostd.model.cpus import home_of
from hostd.preempt import Watch, why_group_kept
from hostd.reconcile import DONE, Observed, restore_keys
from hostd.sched import group

if TYPE_CHECKING:
    from hostd.agent.applier import Applier
    from hostd.agent.state import AgentState
    from hostd.host import Host
    from hostd.journal import Journal

log = logging.getLogger("hostd")
MAX_GROUPS = 64  # a demoted session's cgroup with more cgroups below it is not weighed


def within(path: str, tops: list[str]) -> bool:
    """Whether cgroup ``path`` is one of ``tops`` or below one."""
    return any(path == top or path.startswith(top + "/") for top in tops)


def path_of(key: str) -> str:
    """The cgroup a key of this module names ("/user.slice/x.scope", "/hostd.demoted")."""
    return knobs.parse_key(key).ident


class GroupWeights:
    def __init__(
        self,
        host: Host,
        journal: Journal,
        state: AgentState,
        watch: Watch,
        applier: Applier,
        spared: set[int],
    ) -> None:
        self.host, self.journal, self.state = host, journal, state
        self.watch, self.applier, self.spared = watch, applier, spared
        self.groups: dict[str, set[int]] = {}  # weighed-down cgroup's key -> sessions in it

    def cpu_group(self, pid: int) -> str | None:
        """The cgroup of process ``pid`` in the cpu controller's hierarchy (v2: its home, not
        hostd's threaded cpuset group in it)."""
        host = self.host
        found = group.mount(host.root)
        if found is None:
            return None
        cgroups = host.cgroups(pid) or {}
        path = cgroups.get("cpu" if found[0] == 1 else "")
        return None if path is None else home_of(path) if found[0] == 2 else path

    def members(self, path: str) -> dict[int, int | None] | None:
        """The session of every process in cgroup ``path`` and below it (None: one hostd does
        not watch), or None when they cannot all be listed."""
        host, procs, exclude = self.host, self.applier.cache.procs, self.applier.exclude
        found = group.mount(host.root)
        if found is None:
            return None
        members: dict[int, int | None] = {}
        todo, seen = [found[1] + path.rstrip("/")], 0
        while todo:
            rel = todo.pop()
            seen += 1
            text = host.read_quiet(f"{rel}/cgroup.procs")
            if text is None or seen > MAX_GROUPS:
                return None
            for word in text.split():
                proc = procs.get(int(word))
                ok = proc is not None and not proc.is_kthread and proc.pid not in exclude
                members[int(word)] = proc.session if ok and proc is not None else None
            todo += [f"{rel}/{e}" for e in host.listdir(rel) if host.inode(f"{rel}/{e}")]
        return members

    def weigh(self, sid: int, sessions: dict[int, list[int]]) -> None:
        """Weigh down the cgroups that hold demoted session ``sid``, where nothing else is in
        them."""
        applier, demoted = self.applier, self.watch.demoted
        paths = {p for pid in sessions.get(sid, []) if (p := self.cpu_group(pid)) is not None}
        if "/" in paths:
            self.move_in(sid, sessions)
        for path in sorted(paths - {"/"}):
            key = group.key_of(path)
            if key in self.groups:
                self.groups[key].add(sid)
                continue
            weigh = self.state.policy.cgroups_weigh
            why = why_group_kept(path, self.members(path), demoted, weigh)
            if why is None and knobkinds.check_key(key) is not None:
                why = "its name is not a plain cgroup path"
            if why is not None:
                if path.strip("/"):
                    log.info("preempt group kept cgroup=%s session=%d why=%r", path, sid, why)
                continue
            try:
                want = group.yielding(group.read(self.host, key))
            except HostError as exc:
                log.info("preempt group cgroup=%s not weighed: %s", path, exc)
                continue
            report = applier.reconcile({key: want}, Observed(()), only=())
            outcome = report.results[0].outcome if report.results else "none"
            log.info(
                "preempt group demote cgroup=%s session=%d %s=%d outcome=%s",
                path, sid, want["file"], want["value"], outcome,
            )  # fmt: skip
            if outcome in ("applied", "would-apply"):
                self.groups[key] = {sid}
                applier.counters["group_demotions"] += 1
                applier.note(
                    "demote", f"cgroup {path}: {want['file']} {want['value']}", session=sid
                )
                self.cap(path, sid)

    def cap(self, path: str, sid: int) -> None:
        """Cap weighed-down cgroup ``path`` at ``[preempt] cap_cpus`` (its CFS quota), so that it
        takes no more than that wherever it sits (``hostd.sched.group``, ``MAX_PREFIX``)."""
        cpus = self.state.policy.preempt.cap_cpus
        if cpus <= 0:
            return
        key = group.max_key(path)
        try:
            want = group.capped(group.read_max(self.host, key), cpus)
        except HostError as exc:
            log.info("preempt group cgroup=%s not capped: %s", path, exc)
            return
        report = self.applier.reconcile({key: want}, Observed(()), only=())
        outcome = report.results[0].outcome if report.results else "none"
        log.info("preempt group cap cgroup=%s quota=%d period=%d outcome=%s",
                 path, want["quota"], want["period"], outcome)  # fmt: skip
        if outcome in ("applied", "would-apply", "skipped"):
            self.groups[key] = {sid}

    def contained(self, sid: int, sessions: dict[int, list[int]]) -> bool:
        """Whether every process of demoted session ``sid`` (but its bystanders) is in
        /hostd.demoted (idle at the root) or in a capped cgroup: where it takes little from the
        job however light the job's sessions are (``[preempt] weigh_job = "while-needed"``).
        A cap bounds its share, not the wait it causes a woken job thread: BENCHMARKS.md, "A
        node with its infrastructure", measures what that costs the job."""
        if self.state.mode != "enforce":
            return False
        capped = self.capped_paths()
        for pid in sessions.get(sid, []):
            if pid in self.spared:
                continue
            path = self.cpu_group(pid)
            if path is None or path == group.HOME:
                continue  # gone, or idle at the root
            if not within(path, capped):
                return False
        return True

    def capped_paths(self) -> list[str]:
        return [path_of(k) for k in self.groups if k.startswith(group.MAX_PREFIX + "/")]

    def capped(self, pid: int) -> bool:
        """Whether process ``pid`` runs in a cgroup hostd capped: the quota is its floor (it
        runs ``cap_cpus`` a period whatever its threads' policy), which a boost cannot raise."""
        path = self.cpu_group(pid)
        return path is not None and within(path, self.capped_paths())

    # -- hostd's cgroup for demoted processes of the root cgroup -----------------------------
    def movable(self, pid: int) -> bool:
        """A process in the root cpu cgroup (v2: not split into threaded children either),
        watched, all of whose threads are in preemptible layers."""
        applier, host = self.applier, self.host
        proc = applier.cache.procs.get(pid)
        found = group.mount(host.root)
        if found is None or proc is None or proc.is_kthread or pid in applier.exclude:
            return False
        if pid in self.spared:  # another user's bystander of the busy work
            return False
        if (host.cgroups(pid) or {}).get("cpu" if found[0] == 1 else "") != "/":
            return False
        tasks = applier.session_tasks([pid])
        layers = {getattr(applier.inc.classified.get(t.tid), "layer", None) for t in tasks}
        return bool(tasks) and layers <= set(self.state.policy.preemptible)

    def move_in(self, sid: int, sessions: dict[int, list[int]]) -> None:
        """Move demoted session ``sid``'s movable processes into /hostd.demoted (made and
        journaled first)."""
        host, applier = self.host, self.applier
        pids = [pid for pid in sessions.get(sid, []) if self.movable(pid)]
        if not pids:
            return
        if self.state.mode != "enforce":
            log.info("preempt home session=%d would move %d processes to %s", sid, len(pids),
                     group.HOME)  # fmt: skip
            return
        if group.HOME_KEY not in self.groups:
            report = applier.reconcile({group.HOME_KEY: True}, Observed(()), only=())
            outcome = report.results[0].outcome if report.results else "none"
            if outcome != "applied" and not (outcome == "none" and group.HOME_KEY in self.journal):
                detail = report.results[0].detail if report.results else ""
                log.info("preempt home %s not made (%s %s): the session keeps its autogroup weight",
                         group.HOME, outcome, detail)  # fmt: skip
                return
            self.groups[group.HOME_KEY] = set()
        self.groups[group.HOME_KEY].add(sid)
        _, _, rel = group.home_dir(host)
        moved = 0
        for pid in pids:
            try:
                host.write(f"{rel}/cgroup.procs", str(pid))
                moved += 1
            except Gone:
                pass
            except HostError as exc:
                log.info("preempt home pid=%d not moved: %s", pid, exc)
        log.info("preempt home session=%d moved=%d into=%s", sid, moved, group.HOME)
        applier.counters["home_moves"] += moved
        applier.note("demote", f"{moved} process(es) moved into {group.HOME} (cpu.idle)",
                     session=sid)  # fmt: skip

    def move_out(self, keep: set[int], why: str) -> None:
        """Move every process in /hostd.demoted whose session is not in ``keep`` (or that is
        spared now: a bystander) back to the root cgroup (where every process in it came from);
        the cgroup goes once it is empty."""
        members = self.members(group.HOME)
        if members is None:
            return
        host = self.host
        _, mount, _ = group.home_dir(host)
        for pid, sid in members.items():
            if sid is None:  # born there since the cache was read: its session from /proc
                text = host.read_quiet(paths.proc(pid, "stat"))
                sid = parse_stat(text).session if text else None
            if sid in keep and pid not in self.spared:
                continue
            try:
                host.write(f"{mount}/cgroup.procs", str(pid))
            except Gone:
                pass
            except HostError as exc:
                log.warning("preempt home pid=%d not moved back: %s", pid, exc)
        if not keep:
            self.release([group.HOME_KEY], why)

    def leave(self, sid: int, why: str) -> None:
        """Session ``sid`` is released: its processes leave hostd's cgroup, its cgroups get their
        weight back."""
        sids = self.groups.get(group.HOME_KEY)
        if sids is not None and sid in sids:
            sids.discard(sid)
            self.move_out(sids, why)
        self.release([k for k, s in self.groups.items() if sid in s], why)

    def release(self, keys: list[str], why: str) -> None:
        """The cgroups' settings back (a cgroup's weight and its cap: one line for both)."""
        journal = self.journal
        for key in keys:
            self.groups.pop(key, None)
            if self.state.mode == "enforce" and key in journal:
                for r in restore_keys(self.host, journal, [key]):
                    self.applier.outcomes[r.outcome] += 1
                    if r.outcome not in DONE:
                        log.warning("preempt group release key=%s outcome=%s %s",
                                    key, r.outcome, r.detail)  # fmt: skip
        for path in dict.fromkeys(path_of(key) for key in keys):
            log.info("preempt group release cgroup=%s why=%r", path, why)

    def check(self) -> None:
        """A weighed-down cgroup that now holds anything but demoted work gets its weight back."""
        sids = self.groups.get(group.HOME_KEY)
        if sids is not None:
            self.move_out(sids & set(self.watch.demoted), "its session is not demoted")
        by_path: dict[str, list[str]] = {}
        for key in self.groups:
            if key != group.HOME_KEY:
                by_path.setdefault(path_of(key), []).append(key)
        for path, keys in by_path.items():
            why = why_group_kept(
                path, self.members(path), self.watch.demoted, self.state.policy.cgroups_weigh
            )
            if why is not None:
                self.release(keys, why)

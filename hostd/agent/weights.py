"""A demoted session's own cgroup, weighed down as a whole: the CPU is shared between cgroups
before a thread's policy or a session's weight counts (BENCHMARKS.md).

Where every process in the cgroup (and below it) belongs to demoted sessions
(``hostd.preempt.why_group_kept``), its CPU weight (``cpu.idle = 1``, else the least weight,
``hostd.sched.group``) is journaled and written; checked again every tick: a process of another
session that joins it gives the cgroup its weight back at once, as does the release of the
sessions in it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hostd import knobkinds
from hostd.host import HostError
from hostd.model.cpus import home_of
from hostd.preempt import why_group_kept
from hostd.reconcile import Observed, restore_keys
from hostd.sched import group

if TYPE_CHECKING:
    from hostd.agent.watch import WatchLoop

log = logging.getLogger("hostd")
MAX_GROUPS = 64  # a demoted session's cgroup with more cgroups below it is not weighed


class GroupWeights:
    def __init__(self, loop: WatchLoop) -> None:
        self.loop = loop
        self.groups: dict[str, set[int]] = {}  # weighed-down cgroup's key -> sessions in it

    def cpu_group(self, pid: int) -> str | None:
        """The cgroup of process ``pid`` in the cpu controller's hierarchy (v2: its home, not
        hostd's threaded cpuset group in it)."""
        host = self.loop.agent.host
        found = group.mount(host.root)
        if found is None:
            return None
        cgroups = host.cgroups(pid) or {}
        path = cgroups.get("cpu" if found[0] == 1 else "")
        return None if path is None else home_of(path) if found[0] == 2 else path

    def members(self, path: str) -> dict[int, int | None] | None:
        """The session of every process in cgroup ``path`` and below it (None: one hostd does
        not watch), or None when they cannot all be listed."""
        agent = self.loop.agent
        host, procs = agent.host, agent.cache.procs
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
                ok = proc is not None and not proc.is_kthread and proc.pid not in agent.exclude
                members[int(word)] = proc.session if ok and proc is not None else None
            todo += [f"{rel}/{e}" for e in host.listdir(rel) if host.inode(f"{rel}/{e}")]
        return members

    def weigh(self, sid: int, sessions: dict[int, list[int]]) -> None:
        """Weigh down the cgroups that hold demoted session ``sid``, where nothing else is in
        them."""
        loop = self.loop
        agent, demoted = loop.agent, loop.watch.demoted
        paths = {p for pid in sessions.get(sid, []) if (p := self.cpu_group(pid)) is not None}
        for path in sorted(paths):
            key = group.key_of(path)
            if key in self.groups:
                self.groups[key].add(sid)
                continue
            why = why_group_kept(path, self.members(path), demoted)
            if why is None and knobkinds.check_key(key) is not None:
                why = "its name is not a plain cgroup path"
            if why is not None:
                if path.strip("/"):
                    log.info("preempt group kept cgroup=%s session=%d why=%r", path, sid, why)
                continue
            try:
                want = group.yielding(group.read(agent.host, key))
            except HostError as exc:
                log.info("preempt group cgroup=%s not weighed: %s", path, exc)
                continue
            report = agent.reconcile({key: want}, Observed(()), only=())
            outcome = report.results[0].outcome if report.results else "none"
            log.info(
                "preempt group demote cgroup=%s session=%d %s=%d outcome=%s",
                path, sid, want["file"], want["value"], outcome,
            )  # fmt: skip
            if outcome in ("applied", "would-apply"):
                self.groups[key] = {sid}
                loop.counters["group_demotions"] += 1
                loop.note("demote", f"cgroup {path}: {want['file']} {want['value']}", session=sid)

    def release(self, keys: list[str], why: str) -> None:
        agent = self.loop.agent
        for key in keys:
            self.groups.pop(key, None)
            if agent.mode == "enforce" and key in agent.journal:
                for r in restore_keys(agent.host, agent.journal, [key]):
                    agent.counters[r.outcome] += 1
                    if r.outcome not in ("restored", "gone"):
                        log.warning("preempt group release key=%s outcome=%s %s",
                                    key, r.outcome, r.detail)  # fmt: skip
            log.info("preempt group release cgroup=%s why=%r", key[len(group.PREFIX) :], why)

    def check(self) -> None:
        """A weighed-down cgroup that now holds anything but demoted work gets its weight back."""
        for key in list(self.groups):
            path = key[len(group.PREFIX) :]
            why = why_group_kept(path, self.members(path), self.loop.watch.demoted)
            if why is not None:
                self.release([key], why)

"""The watch's eyes: what each tick reads, and which sessions may never be demoted.

``Sampler.sample`` reads one ``/proc/PID/stat`` per process hostd knows (its CPU time with its
reaped children's, and its leader's state) and, for the processes that ran or are runnable, the
threads of demoted sessions and hostd's real-time threads, one ``schedstat`` and one ``stat``
(its state) per thread: ``hostd.preempt.Sample``-s for ``Watch.update``, every session's
processes, and the CPUs each session's preemptible processes used since the last tick.
``kept`` asks ``hostd.preempt.why_kept`` whether a session must be left alone (the node's
infrastructure, by the node model; the job's own layers, the agent's own session);
``interactive`` whose an interactive session is (its user's allowance). It reads through the
host door and the watch's ``Applier`` (the threads hostd knows and how they were classified).

A process's ``stat`` sums the CPU time of every one of its threads, which the kernel walks: at
100,000 threads one read of every process took 45 ms, and an event that came meanwhile waited
that long (a layer's first member in 32-44 ms, BENCHMARKS.md). The watch's loop stops reading
once its slice is spent and an event waits (``read(budget_s, waiting)``), and goes on after the
event pass; each process's CPU time is kept with the time it was read, and its share is over
its own span.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hostd.preempt import Key, Sample, Watch, shielding_layers, why_kept

if TYPE_CHECKING:
    from hostd.agent.applier import Applier
    from hostd.agent.state import AgentState
    from hostd.host import Host

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Sampler:
    def __init__(self, host: Host, state: AgentState, watch: Watch, applier: Applier) -> None:
        self.host, self.state, self.watch, self.applier = host, state, watch, applier
        self.shielding = shielding_layers(state.policy)  # (the watch's ``configure`` renews it)
        # pid -> (start time, its threads' CPU ticks, its reaped children's, its parent, boot
        # ticks when it was read)
        self.cpu: dict[int, tuple[int, int, int, int, int]] = {}
        # a read under way (``read``): the pids left, and what was read (pid -> (state, CPU
        # ticks, reaped ticks, boot ticks when read)), when it began, the seconds it took
        self.left: list[int] | None = None
        self.got: dict[int, tuple[str, int, int, int]] = {}
        self.began = 0
        self.busy = 0.0
        # parents that have a child hostd saw alive to reap: its time is not theirs (``sample``)
        self.reaping: set[int] = set()
        self.cpu_ticks = 0  # boot ticks when ``cpu`` was read
        self.shares: dict[int, float] = {}  # CPUs each process used over the last tick
        self.launchers: dict[int, str] = {}  # parent of a protected process -> its layer
        self.own_sid = os.getsid(0)

    def sample(self, rt: set[Key]) -> tuple[list[Sample], dict[int, list[int]], dict[int, float]]:
        """Schedstat samples of the threads worth a look (``processes``' ``looked``), every
        session's processes, and the CPUs each session's preemptible processes used since the
        last read."""
        sessions, used, looked = self.processes(rt)
        applier, cache, host = self.applier, self.applier.cache, self.host
        classified = applier.inc.classified
        samples: list[Sample] = []
        for pid in looked:
            session = cache.procs[pid].session
            for tid in cache.members.get(pid, ()):
                task, item = cache.tasks.get(tid), classified.get(tid)
                if task is None or item is None:
                    continue
                got = host.schedstat(pid, tid)
                state = host.thread_state(pid, tid)
                if got is not None and state is not None:
                    samples.append(
                        Sample(task.key, pid, session, item.layer, got[0], got[1], state, task.uid)
                    )
        applier.counters["samples"] += len(samples)
        return samples, sessions, used

    def read(
        self, budget_s: float | None = None, waiting: Callable[[], bool] | None = None
    ) -> bool:
        """Read each process's CPU time (for ``processes``): all that is left (``budget_s``
        None), or for about ``budget_s`` seconds, and past them while ``waiting`` (given) says
        that no event waits; the next call goes on where this one stopped. Returns whether
        every process is read. (Without events it reads in one piece: a loop step per slice
        cost more than the reads in the VM tier's emulated CPUs.)"""
        host, applier = self.host, self.applier
        started = time.monotonic()
        if self.left is None:  # a new read: the processes known now
            self.left = [
                pid
                for pid, proc in applier.cache.procs.items()
                if not proc.is_kthread and pid not in applier.exclude
            ]
            self.got, self.began, self.busy = {}, host.ticks_now(), 0.0
        left, got = self.left, self.got
        deadline = None if budget_s is None else started + budget_s
        while left:
            pid = left.pop()
            cpu = host.process_cpu(pid)
            if cpu is not None:
                got[pid] = (*cpu, host.ticks_now())
            if (
                deadline is not None
                and time.monotonic() >= deadline
                and (waiting is None or waiting())
            ):
                break
        self.busy += time.monotonic() - started
        return not left

    def processes(
        self, rt: set[Key] = frozenset()
    ) -> tuple[dict[int, list[int]], dict[int, float], list[int]]:
        """Each process's CPU time, read now: every session's processes, the CPUs each
        session's preemptible processes used since the last read (their own CPU time and their
        reaped children's: a compiler that lived a tenth of a second shows in its parent's), and
        the processes whose threads are worth a look (they ran or are runnable, are demoted or
        hold hostd's real-time threads). Not the reaped time of a child hostd saw alive: it was
        that child's, counted (or not, a rank's) where it ran; a launcher that reaps its ranks
        is not busy for it. Finishes the read under way (``read``), or makes one."""
        self.read()
        got, self.left = self.got, None
        applier = self.applier
        cache, demoted = applier.cache, self.watch.demoted
        counted, classified = self.watch.counted, applier.inc.classified
        protected = self.state.policy.protected
        rt_pids = {task.pid for tid, _ in rt if (task := cache.tasks.get(tid)) is not None}
        launchers: dict[int, str] = {}
        sessions: dict[int, list[int]] = {}
        used: dict[int, float] = {}
        looked: list[int] = []
        cpu: dict[int, tuple[int, int, int, int, int]] = {}
        shares: dict[int, float] = {}  # CPUs each process used since the last tick
        since = self.cpu_ticks  # boot ticks when the last read began (0: none yet)
        reaping = self.reaping
        for pid, (start, _, _, ppid, _) in self.cpu.items():
            now = cache.procs.get(pid)
            if now is None or now.start_time != start:
                reaping.add(ppid)  # it reaps (or has reaped) a child hostd saw alive
        for pid, proc in cache.procs.items():
            if proc.is_kthread or pid in applier.exclude:
                continue
            sessions.setdefault(proc.session, []).append(pid)
            leader = classified.get(pid)
            if leader is not None and leader.layer in protected:
                launchers[proc.ppid] = leader.layer
            read = got.get(pid)
            if read is None:  # gone, or new since the read began: the next read has it
                continue
            state, ticks, reaped, at = read
            prev = self.cpu.get(pid)
            cpu[pid] = (proc.start_time, ticks, reaped, proc.ppid, at)
            same = prev is not None and prev[0] == proc.start_time
            ran = same and (ticks, reaped) != prev[1:3]
            if ran or state == "R" or proc.session in demoted or pid in rt_pids:
                looked.append(pid)
            if same:
                grown = reaped - prev[2]
                if grown > 0 and pid in reaping:
                    reaping.discard(pid)  # the known child's time: not this process's
                    grown = 0
                delta = ticks - prev[1] + grown
                span = (at - prev[4]) / CLK_TCK
            elif since and proc.start_time >= since:  # born since the last read: all new
                delta = ticks + reaped
                span = (at - since) / CLK_TCK
            else:
                continue
            if span <= 0 or delta <= 0:
                continue
            shares[pid] = delta / CLK_TCK / span
            item = classified.get(pid)
            if item is not None and item.layer in counted:
                used[proc.session] = used.get(proc.session, 0.0) + shares[pid]
        self.cpu, self.shares, self.launchers = cpu, shares, launchers
        reaping.intersection_update(cpu)  # (a parent gone with its child)
        self.cpu_ticks = self.began
        return sessions, used, looked

    def bystanders(self, sid: int, sessions: dict[int, list[int]], busy: float) -> set[int]:
        """The processes of demoted session ``sid`` to leave alone: those of another user than
        every busy one (``busy`` CPUs or more over the last tick, itself or its reaped children)
        and not busy themselves: a root service or ``runuser`` that started a user's busy child
        in its own session, an operator's light shell around another user's work."""
        cache = self.applier.cache

        def uid(pid: int) -> int | None:
            task = cache.tasks.get(pid)
            return task.uid if task is not None else None

        pids = sessions.get(sid, [])
        hot = [pid for pid in pids if self.shares.get(pid, 0.0) >= busy]
        if not hot:
            return set()
        users = {uid(pid) for pid in hot}
        return {pid for pid in pids if pid not in hot and uid(pid) not in users}

    def interactive(self, sid: int, sessions: dict[int, list[int]]) -> int | None:
        """The user of session ``sid`` when it is interactive, else None: a login that logind
        gave a terminal; where logind says nothing of it (no systemd), a controlling terminal,
        which a user may open at will (``script``): an interactive session only has an
        allowance (``[preempt] interactive_cpus``), never a pass."""
        cache = self.applier.cache
        procs = [cache.procs[pid] for pid in sessions.get(sid, []) if pid in cache.procs]
        logins = [p.node for p in procs if p.node.kind == "login" and p.node.login]
        if logins:
            return next((w.uid for w in logins if w.login_tty and w.uid is not None), None)
        for proc in procs:
            if proc.tty:
                leader = cache.tasks.get(proc.pid)
                return leader.uid if leader is not None else None
        return None

    def kept(self, sid: int, sessions: dict[int, list[int]]) -> str | None:
        """Why session ``sid`` is never demoted, or None."""
        cache, policy = self.applier.cache, self.state.policy
        pids = sessions.get(sid, [])
        layers = {
            item.layer
            for pid in pids
            for tid in cache.members.get(pid, ())
            if (item := self.applier.inc.classified.get(tid)) is not None
        }
        procs = [cache.procs[pid] for pid in pids if pid in cache.procs]
        return why_kept(
            sid,
            layers=layers,
            tty=any(proc.tty for proc in procs),
            own_sid=self.own_sid,
            protected=policy.protected,
            shielding=self.shielding,
            places=(proc.node for proc in procs),
            keep=policy.preempt,
            launched=next((self.launchers[p] for p in pids if p in self.launchers), None),
        )

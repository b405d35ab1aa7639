"""Snapshots of every thread on the host, with the facts the classifier matches on.

``scan(host)`` walks ``/proc/PID/task/TID`` through ``Host`` and returns ``Task`` values that
share one ``Process`` per thread group (cgroup, cmdline, exe, GPU-driver fds and NVML presence
are properties of the process, read once). Tasks are keyed by ``(tid, start_time)`` so a reused
tid is never mistaken for an earlier thread. A task that exits while it is being read is left
out, never an error. Called by the CLI commands and the benchmark.

``TaskCache`` keeps the same values between passes for the agent: a full ``rescan()`` at start,
after an event overflow and on the slow drift timer; in between, ``refresh()`` re-reads only
the threads that proc-connector events named (a new thread, a rename, an exec).

Per-thread cost is one read (stat) and one sched_getaffinity(2); status (credentials), cgroup,
cmdline, exe and fds are read once per process. See FACTS.md for the measured costs behind that
choice and BENCHMARKS.md for the full pass.

Reading one process and one thread (their facts, GPU-driver fds, place on the node and job)
is ``hostd.tasks.process``; ``node_of``, ``joined`` and ``NVIDIA_FRONTEND`` are re-exported here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from hostd.host import Host, paths
from hostd.model.tasks import STICKY_ACTIVITIES, Process, Task
from hostd.tasks.process import NVIDIA_FRONTEND as NVIDIA_FRONTEND
from hostd.tasks.process import (
    _gpu_devices,
    _join_all,
    _parent_comm,
    _read_process,
    _task,
    joined,
)
from hostd.tasks.process import node_of as node_of


def descendants(host: Host, roots: list[int]) -> list[int]:
    """``roots`` and every process below them (one stat read per process on the host)."""
    children: dict[int, list[int]] = {}
    for pid, st in host.processes().items():
        children.setdefault(st.ppid, []).append(pid)
    found: list[int] = []
    todo = [r for r in roots if host.exists(paths.proc(r))]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(set(found))


def scan(
    host: Host,
    *,
    read_fds: bool = True,
    pids: list[int] | None = None,
    seen: dict[int, Task] | None = None,
    affinities: dict[frozenset[int], frozenset[int]] | None = None,
) -> list[Task]:
    """Every live thread below ``host``'s /proc (or of ``pids`` only), sorted by tid.

    ``read_fds`` False skips the per-process fd walk (the ``gpu`` signal) when no policy needs it.
    Processes are read first (so each ``Process`` is complete, parent comm included, before its
    threads point at it), then each process's threads in one loop: ``Host.thread_stats``. The
    unnamed threads of a job's processes are looked at once more: what they are doing
    (``Host.thread_activity``), since their names say nothing; not a thread of ``seen`` (the
    threads a previous pass read, by tid) that was already looked at: what it was seen doing
    stays (``TaskCache.relook`` goes on looking at it while it is unsettled).

    A thread of ``seen`` whose stat line is the one it was built from (``Task.line``), with the
    same affinity and credentials, is kept as it is (its process updated): at 100k threads most
    lines do not change between two passes, and building them again was a third of the scan's
    Python. ``seen`` is emptied as it is read (a thread that changed frees its old value at
    once). ``affinities``: the distinct affinities kept between passes (most threads share a
    handful: one copy of each, for memory and so that a kept thread's compares by identity).
    """
    nvml, _ = host.nvml()
    nvml_pids = nvml.pids if nvml else frozenset()
    if pids is None:
        pids = [int(e) for e in host.listdir("proc") if e.isdigit()]
    found = [got for pid in pids if (got := _read_process(host, pid, nvml_pids, read_fds))]
    known = {proc.pid: proc for proc, _, _ in found}
    for proc in known.values():
        known[proc.pid] = replace(proc, parent_comm=_parent_comm(host, proc.ppid, known))
    _join_all(known)
    tasks: list[Task] = []
    add = tasks.append
    # Most threads share a handful of affinities: keep one copy of each (memory, and the
    # planner's per-affinity memo hits by identity).
    interned = {} if affinities is None else affinities
    if len(interned) > AFFINITIES_KEPT:
        interned.clear()
    before = seen.pop if seen else None
    for old_proc, uid, gid in found:
        proc = known[old_proc.pid]
        for tid, text, cpus in host.thread_stats(proc.pid):
            cpus = interned.setdefault(cpus, cpus)
            old = before(tid, None) if before is not None else None
            line = hash(text)
            if (
                old is not None
                and old.line == line
                and (old.affinity is cpus or old.affinity == cpus)
                and old.uid == uid
                and old.gid == gid
            ):
                task = old  # the same line: the same thread, unchanged
                task.process = proc
            else:
                try:
                    task = _task(tid, text, cpus, uid, gid, proc)
                except (ValueError, IndexError):
                    continue  # half-written: treated as gone for this pass
                if task is None:
                    continue
                task.line = line
            if proc.job is not None and task.unnamed:
                if old is None or not old.activity or old.start_time != task.start_time:
                    task.activity = host.thread_activity(proc.pid, tid)
                elif task is not old:
                    task.activity = old.activity  # what it was seen doing stays
            elif task.activity:
                task.activity = ""  # (kept, but no longer an unnamed thread of a job)
            add(task)
    tasks.sort(key=lambda t: t.tid)
    return tasks


AFFINITIES_KEPT = 4096  # distinct affinities ``TaskCache`` keeps between passes, at most


class TaskCache:
    """Every known thread by tid, and its process by pid, kept current from events.

    ``scope``: the roots of a scope (a list, or a function giving them at each rescan), which
    holds them and their descendants; processes forked by a process in scope join it.
    ``refresh`` reads one stat and one sched_getaffinity per named thread; a process is read
    (cmdline, cgroup, credentials, fds) when it is new or exec'd. A process's GPU-driver fds
    are re-checked when it starts a new thread, at most once a second while it holds none: CUDA
    opens the driver, then starts its threads.
    """

    FD_RECHECK = 1.0  # seconds
    # An unnamed thread of a job is looked at again (``relook``) until what it does is plain or
    # this many seconds after hostd first saw it: NCCL starts its threads, which then settle
    # into poll(2); a queue feeder writes before it waits.
    RELOOK_FOR = 120.0
    # At most this many threads, and this much time, per relook (four times a second; the next
    # one goes on where this one stopped): a process of any user can claim a job and start
    # thousands of unnamed threads. 256 at once took 9-15 ms (0.9 % of a core, and an event
    # arriving meanwhile waited) at the reaction benchmark's 100k threads, whose two ranks hold
    # 10k unnamed threads.
    RELOOK_MAX = 256
    RELOOK_BUDGET_S = 0.001

    def __init__(
        self,
        host: Host,
        *,
        read_fds: bool = True,
        scope: list[int] | Callable[[], list[int] | None] | None = None,
    ):
        self.host = host
        self.read_fds = read_fds
        self.scope_roots = scope
        self.scope: set[int] | None = None
        self._roots: set[int] = set()
        self.tasks: dict[int, Task] = {}
        self.procs: dict[int, Process] = {}
        self.members: dict[int, set[int]] = {}  # pid -> tids
        self._fds_checked: dict[int, float] = {}
        self._creds: dict[int, tuple[int, int]] = {}
        self._nvml_pids: frozenset[int] = frozenset()
        self.unsettled: dict[int, float] = {}  # tid -> when first seen: ``relook`` these
        self._affinities: dict[frozenset[int], frozenset[int]] = {}  # ``scan``'s, kept

    def __len__(self) -> int:
        return len(self.tasks)

    def rescan(self) -> list[Task]:
        """Read every thread again (in scope); returns them sorted by tid."""
        pids = None
        roots = self.scope_roots() if callable(self.scope_roots) else self.scope_roots
        if roots is not None:
            pids = descendants(self.host, roots)
            self.scope = set(pids)
            self._roots = set(roots)
        nvml, _ = self.host.nvml(fresh=True)
        self._nvml_pids = nvml.pids if nvml else frozenset()
        # The threads read before go to ``scan`` (``seen``), which keeps those unchanged and
        # drops the others as it goes (100k threads' objects held twice were the agent's peak
        # memory). Which unnamed threads of a job were looked at: for ``unsettled`` below.
        looked = {tid: t.start_time for tid, t in self.tasks.items() if t.activity}
        old, self.tasks = self.tasks, {}
        self.procs, self.members, self._creds = {}, {}, {}  # before, not after
        tasks = scan(
            self.host, read_fds=self.read_fds, pids=pids, seen=old, affinities=self._affinities
        )
        del old  # (the threads that are gone)
        self.tasks = {t.tid: t for t in tasks}
        now = time.monotonic()
        seen, self.unsettled = self.unsettled, {}
        procs, members, creds = self.procs, self.members, self._creds
        for t in tasks:
            # New, or still unsettled (one that settled stays settled: its look was kept)
            if (
                t.activity
                and t.activity not in STICKY_ACTIVITIES
                and (looked.get(t.tid) != t.start_time or t.tid in seen)
            ):
                self.unsettled[t.tid] = seen.get(t.tid, now)
            pid = t.process.pid
            tids = members.get(pid)
            if tids is None:  # the first thread of its process (they share its credentials)
                procs[pid], members[pid], creds[pid] = t.process, {t.tid}, (t.uid, t.gid)
            else:
                tids.add(t.tid)
        self._fds_checked = {pid: now for pid in self.procs}
        return tasks

    def in_scope(self, pid: int, parent: int = 0) -> bool:
        """Whether events of process ``pid`` concern us (a child of a process in scope joins)."""
        if self.scope is None:
            return True
        if pid in self.scope:
            return True
        if parent and parent in self.scope:
            self.scope.add(pid)
            return True
        return False

    def forget(self, tid: int) -> Task | None:
        """A thread exited: drop it (and its process, when it was the last thread)."""
        task = self.tasks.pop(tid, None)
        self.unsettled.pop(tid, None)
        if task is None:
            return None
        pid = task.pid
        tids = self.members.get(pid)
        if tids is not None:
            tids.discard(tid)
            if not tids:
                del self.members[pid]
                self.procs.pop(pid, None)
                self._fds_checked.pop(pid, None)
                self._creds.pop(pid, None)
                if self.scope is not None and pid not in self._roots:
                    self.scope.discard(pid)
        return task

    def _process(self, pid: int, fresh: bool) -> Process | None:
        proc = self.procs.get(pid)
        if proc is not None and not fresh:
            if (
                self.read_fds
                and not proc.gpu
                and time.monotonic() - self._fds_checked.get(pid, 0) > self.FD_RECHECK
            ):
                self._fds_checked[pid] = time.monotonic()
                devices = _gpu_devices(self.host, pid)
                if devices != proc.gpu_devices:
                    proc = joined(replace(proc, gpu_devices=devices), self.procs)
                    self._rebind(proc)
            return proc
        got = _read_process(self.host, pid, self._nvml_pids, self.read_fds)
        if got is None:
            return None
        proc, uid, gid = got
        proc = replace(proc, parent_comm=_parent_comm(self.host, proc.ppid, self.procs))
        proc = joined(proc, self.procs)
        self._creds[pid] = (uid, gid)
        self._fds_checked[pid] = time.monotonic()
        self._rebind(proc)
        return proc

    def _rebind(self, proc: Process) -> None:
        """Point the process's cached threads at its new value."""
        self.procs[proc.pid] = proc
        for tid in self.members.get(proc.pid, ()):
            task = self.tasks.get(tid)
            if task is not None:
                task.process = proc

    def moved(self, pid: int, cpuset: str) -> None:
        """hostd moved the process's leader to another cpuset cgroup."""
        proc = self.procs.get(pid)
        if proc is not None and proc.cpuset != cpuset:
            self._rebind(replace(proc, cpuset=cpuset))

    def renamed_leader(self, pid: int, comm: str) -> list[Task]:
        """The group leader renamed itself: its process's comm changes for every thread."""
        proc = self.procs.get(pid)
        if proc is None or proc.comm == comm:
            return []
        self._rebind(joined(replace(proc, comm=comm), self.procs))
        return [self.tasks[t] for t in self.members.get(pid, ()) if t in self.tasks]

    def refresh(self, named: Iterable[tuple[int, int]], exec_pids: set[int]) -> list[Task]:
        """Re-read the threads named by (tid, tgid); ``exec_pids``: processes that exec'd (read
        again whole). Returns the threads read; a thread that is gone is forgotten."""
        host = self.host
        read, affinity = host.read, host.affinity
        out: list[Task] = []
        for tid, pid in named:
            proc = self._process(pid, pid in exec_pids or pid not in self.procs)
            if proc is None:
                self.forget(tid)
                continue
            uid, gid = self._creds.get(pid) or (0, 0)
            try:
                text = read(paths.task(pid, tid, "stat"))
                cpus = affinity(pid, tid) if text is not None else None
                task = _task(tid, text, cpus, uid, gid, proc) if cpus is not None else None
            except (OSError, ValueError, IndexError):
                task = None
            if task is None:
                self.forget(tid)
                continue
            task.line = hash(text)
            old = self.tasks.get(tid)
            if old is not None and old.start_time != task.start_time:
                self.forget(tid)  # a reused tid: the old thread is gone
            self._look(task, old)
            self.tasks[tid] = task
            self.members.setdefault(pid, set()).add(tid)
            out.append(task)
        return out

    def _look(self, task: Task, old: Task | None) -> None:
        """An unnamed thread of a job, read again for an event: what it was seen doing stays;
        until that is plain it is unsettled, for ``relook`` to read. (Not read here: a new
        thread is still starting, and an event storm must not pay for it.)"""
        if task.process.job is None or not task.unnamed:
            self.unsettled.pop(task.tid, None)
            return
        if old is not None and old.start_time == task.start_time:
            task.activity = old.activity
        if task.activity not in STICKY_ACTIVITIES:
            self.unsettled.setdefault(task.tid, time.monotonic())

    def relook(self) -> list[Task]:
        """Look again at the unsettled unnamed threads of jobs; returns those whose activity
        changed (to be classified again). One read of its syscall file per thread, a second
        of its io file when it waits, for at most ``RELOOK_MAX`` threads and ``RELOOK_BUDGET_S``
        seconds, in turn; a thread seen ``RELOOK_FOR`` seconds is settled."""
        now = time.monotonic()
        changed = []
        for n, (tid, since) in enumerate(
            list(itertools.islice(self.unsettled.items(), self.RELOOK_MAX))
        ):
            if n and time.monotonic() - now > self.RELOOK_BUDGET_S:
                break  # (one at least: a relook held up before its first read still goes on)
            del self.unsettled[tid]  # back at the end below, while it stays unsettled
            task = self.tasks.get(tid)
            if task is None or now - since > self.RELOOK_FOR:
                continue
            self.unsettled[tid] = since
            was = task.activity
            now_doing = self.host.thread_activity(task.pid, task.tid)
            if now_doing and not (now_doing == "runs" and was):  # running says nothing new
                task.activity = now_doing
            if task.activity in STICKY_ACTIVITIES:
                del self.unsettled[tid]
            if task.activity != was:
                changed.append(task)
        return changed

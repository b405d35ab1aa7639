"""Threads and processes as /proc shows them: ``HostThreads``, the part of ``hostd.host.Host``
that reads tasks.

Start times (and the values a pass trusts instead of reading them again), affinity, the scan's
hot path over a process's threads, scheduler statistics, state and activity, per-thread system
calls (``threads()``), and what a process is to the node: a file its job names, its pod
(container runtimes' records), its login (logind's). Everything is read through ``HostFiles``
(``hostd.host.files``), so it runs unchanged on a fixture tree.

Callers: ``hostd.tasks`` (thread snapshots), the agent, the actuators, through ``Host``.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import stat
import time
from collections.abc import Iterator

from hostd.host import paths, syscalls
from hostd.host.errors import HostError
from hostd.host.files import _O_READ, _READ_CHUNK, HostFiles
from hostd.host.parsers import (
    Schedstat,
    Stat,
    parse_cgroup,
    parse_cpu_times,
    parse_involuntary,
    parse_io_writes,
    parse_logind_session,
    parse_pod_spec,
    parse_pressure,
    parse_schedstat,
    parse_stat,
    parse_status,
    parse_syscall,
    split_stat,
)
from hostd.host.syscalls import ThreadCalls
from hostd.model.node import HEX64, KTHREADD
from hostd.model.tasks import activity_of

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class HostThreads(HostFiles):
    """Threads and processes below ``root``. ``Host.__init__`` sets the attributes named here."""

    machine: str  # the kernel's machine name (its system call numbers)
    _calls: ThreadCalls | None  # per-thread system calls given instead of the kernel's
    _known_start: dict[int, int] | None  # see known_start_times
    _pods: dict[str, tuple[str, str, bool]]  # container id -> its pod (pod_of)
    _host_ns: dict[str, int]  # kind -> the host's namespace (host_namespace)

    # -- threads -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def known_start_times(self, known: dict[int, int]) -> Iterator[None]:
        """Within the block, trust these (tid -> start time) values just read from /proc instead
        of reading them again before every write. The agent's event pass uses it: it reads a
        thread and writes its knobs within a millisecond, far less than the time the kernel
        takes to hand out the same tid again (a thread that exits in between gives ESRCH)."""
        self._known_start = known
        try:
            yield
        finally:
            self._known_start = None

    def start_time(self, tid: int, strict: bool = False) -> int | None:
        """A thread's start time (clock ticks after boot), or None when it is gone (the kernel
        said ESRCH or ENOENT); a read that failed otherwise (EMFILE when the agent's file
        descriptors run out) is None too, unless ``strict``: then it raises that HostError, so
        that no caller takes a failed read for an exited thread and drops its original.

        Reads ``proc/TID/task/TID/stat``: for a thread that is not a group leader,
        ``proc/TID/stat`` is the whole group's file, which the kernel builds by walking every
        thread (about 0.5 ms in a 5,000-thread process, against 10 us; BENCHMARKS.md). A fixture
        tree has no ``proc/TID`` for a thread that leads no process (the kernel's are hidden
        from listings, not absent): there it is found below its process.
        """
        if self._known_start is not None and tid in self._known_start:
            return self._known_start[tid]
        rel = paths.task(tid, tid, "stat")
        if not self.live and not self.exists(paths.proc(tid)):
            found = glob.glob(self._prefix + paths.any_task(tid, "stat"))
            rel = found[0][len(self._prefix) :] if found else rel
        try:
            text = self.read(rel)
        except OSError:
            if strict:
                raise
            return None
        return None if text is None else parse_stat(text).start_time

    def cgroups(self, pid: int | str, strict: bool = False) -> dict[str, str] | None:
        """``proc/PID/cgroup`` parsed ({controller or hierarchy: path}; v2's under ""), or None
        when the task is gone, or its file refused (``strict``: raises NotPermitted then).
        ``pid``: a process or thread id, or "self"."""
        rel = paths.proc(pid, "cgroup")
        text = self.read(rel) if strict else self.read_quiet(rel)
        return None if text is None else parse_cgroup(text)

    def processes(self) -> dict[int, Stat]:
        """Every process now: pid -> its parsed ``proc/PID/stat`` (one read each; a process
        that exits meanwhile, or whose line is cut, is left out)."""
        found: dict[int, Stat] = {}
        for entry in self.listdir(paths.PROC):
            if entry.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    text = self.read(paths.proc(entry, "stat"))
                    if text:
                        found[int(entry)] = parse_stat(text)
        return found

    def affinity(self, pid: int, tid: int) -> frozenset[int] | None:
        """A thread's CPU affinity, or None when it is gone.

        Live: one sched_getaffinity(2) (about 2 us; parsing /proc/.../status costs ten times
        that). Fixture trees: the Cpus_allowed_list line of the thread's status file.
        """
        if self.live:
            try:
                return frozenset(os.sched_getaffinity(tid))
            except OSError:
                return None
        text = self.read_quiet(paths.task(pid, tid, "status"))
        return None if text is None else parse_status(text).cpus_allowed

    def thread_stats(self, pid: int) -> Iterator[tuple[int, str, frozenset[int]]]:
        """``(tid, stat text, affinity)`` for each live thread of process ``pid``: the scan's hot
        path (100k times a pass at 100k threads).

        Live: opens ``proc/PID/task`` once and reads each ``TID/stat`` relative to it, then one
        sched_getaffinity(2); about 3.5 us a thread less than ``read`` + ``affinity``
        (BENCHMARKS.md). A thread that is gone, or whose files are refused, is left out.
        Fixture trees: through ``read`` and ``affinity``.
        """
        if not self.live:
            for entry in self.listdir(paths.proc(pid, "task")):
                if not entry.isdigit():
                    continue
                text = self.read_quiet(paths.task(pid, entry, "stat"))
                cpus = self.affinity(pid, int(entry)) if text is not None else None
                if cpus is not None:
                    yield int(entry), text, cpus
            return
        try:
            task_dir = os.open("/" + paths.proc(pid, "task"), _O_READ | os.O_DIRECTORY)
        except OSError:
            return  # the process is gone
        try:
            try:
                entries = os.listdir(task_dir)
            except OSError:
                return  # it exited between the open and the listing
            for entry in entries:
                try:
                    fd = os.open(entry + "/stat", _O_READ, dir_fd=task_dir)
                    try:
                        data = os.read(fd, _READ_CHUNK)
                    finally:
                        os.close(fd)
                    tid = int(entry)
                    cpus = frozenset(os.sched_getaffinity(tid))
                except OSError:
                    continue
                yield tid, data.decode("utf-8", "replace"), cpus
        finally:
            os.close(task_dir)

    def threads(self) -> ThreadCalls:
        """The per-thread system calls; only a live host (or one given calls) has threads to
        call them on."""
        if self._calls is not None:
            return self._calls
        if not self.live:
            raise HostError(errno.EOPNOTSUPP, self.root, "a fixture tree has no live threads")
        return syscalls  # type: ignore[return-value]  # the module offers ThreadCalls

    def ticks_now(self) -> int:
        """Clock ticks since boot now: the unit of a thread's start time (proc(5)). Live, the
        clock /proc/uptime shows (CLOCK_BOOTTIME), without reading it: 0.2 us, not 5."""
        if self.live:
            return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK)
        text = self.read_line(paths.UPTIME) or "0"
        return int(float(text.split()[0]) * _CLK_TCK)

    def schedstat(self, pid: int, tid: int) -> Schedstat | None:
        """A thread's (ns on a CPU, ns waiting on a run queue, timeslices) since it started, or
        None when it is gone or the kernel keeps no such statistics."""
        text = self.read_quiet(paths.task(pid, tid, "schedstat"))
        if not text:
            return None
        try:
            return parse_schedstat(text)
        except ValueError:
            return None

    def cpu_times(self) -> dict[int, tuple[int, int]]:
        """Each CPU's (busy, total) ticks since boot (/proc/stat); {} where unreadable."""
        text = self.read_quiet(paths.STAT)
        return parse_cpu_times(text) if text else {}

    def involuntary_switches(self, pid: int, tid: int) -> int | None:
        """How often a thread was switched out while it could still run (preempted), or None."""
        text = self.read_quiet(paths.task(pid, tid, "status"))
        return parse_involuntary(text) if text else None

    def pressure(self, cgroup_dir: str) -> tuple[int, int] | None:
        """(some, full) microseconds a cgroup v2 group's tasks stalled waiting for a CPU
        (``cpu.pressure``, PSI), or None where the kernel keeps none (v1, psi=0, no group)."""
        text = self.read_quiet(f"{cgroup_dir.strip('/')}/cpu.pressure")
        return parse_pressure(text) if text else None

    def job_file(self, pid: int, path: str) -> tuple[str, float] | None:
        """(The start of, when it last changed) a file a job names in its environment
        (``HOSTD_THROUGHPUT_FILE``), read as the job sees it (its root, its working folder), or
        None. hostd reads as root and the name is the user's to write, so nothing it names is
        opened before the kernel has said what it is: the name is resolved with ``O_PATH``
        (which opens no device, FIFO or socket: nothing of it runs, no watchdog arms, no tape
        rewinds), without following a link at its last step; only a regular file owned by the
        process's user, and only while that process runs with one identity (real, effective,
        saved and filesystem uid the same: a set-uid program started with a user's environment
        is refused), is then opened, through the checked descriptor itself (the same inode: a
        rename meanwhile cannot swap it), never blocking, and at most 4 KiB read."""
        if not path or "\0" in path:
            return None
        base = paths.proc(pid, "root") if path.startswith("/") else paths.proc(pid, "cwd")
        try:
            where = os.open(self.path(f"{base}/{path.lstrip('/')}"),
                            os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)  # fmt: skip
        except OSError:
            return None
        try:
            st = os.fstat(where)
            if not stat.S_ISREG(st.st_mode) or self._one_uid(pid) != st.st_uid:
                return None  # the process's identity is read after the lookup: it cannot race it
            fd = os.open(paths.own_fd(where), _O_READ | os.O_NONBLOCK | os.O_NOCTTY)
            try:
                return os.read(fd, _READ_CHUNK).decode("utf-8", "replace"), st.st_mtime
            finally:
                os.close(fd)
        except OSError:
            return None
        finally:
            os.close(where)

    def _one_uid(self, pid: int) -> int | None:
        """The uid a process runs as when its real, effective, saved and filesystem uids agree
        (/proc/PID/status "Uid:"), else None."""
        for line in (self.read_quiet(paths.proc(pid, "status")) or "").splitlines():
            if line.startswith("Uid:"):
                uids = set(line.split()[1:5])
                return int(uids.pop()) if len(uids) == 1 else None
        return None

    def pod_of(self, container: str) -> tuple[str, str, bool] | None:
        """(namespace, name, static) of the Kubernetes pod a container belongs to, from its
        runtime's own record (containerd's CRI bundle, CRI-O's, dockerd's: root's files), or
        None. ``container`` is the 64 hex digits its cgroup path names, nothing a user writes.
        Kept for the life of this Host (a container's pod never changes)."""
        if container in self._pods:
            return self._pods[container]
        if not HEX64.fullmatch(container):
            return None
        found = None
        for rel in (
            paths.containerd_bundle(container),
            paths.crio_bundle(container),
            paths.docker_container(container),
        ):
            text = self.read_quiet(rel)
            if text and (found := parse_pod_spec(text)) is not None:
                break
        if found is not None:  # (not yet written: asked again next time)
            if len(self._pods) >= 4096:
                self._pods.clear()
            self._pods[container] = found
        return found

    def host_namespace(self, kind: str) -> int | None:
        """``namespace`` of kthreadd (the host's: every kernel thread's), read once."""
        if kind not in self._host_ns:
            found = self.namespace(KTHREADD, kind)
            if found is None:
                return None  # (a fixture tree, or not readable: asked again next time)
            self._host_ns[kind] = found
        return self._host_ns[kind]

    def namespace(self, pid: int, kind: str) -> int | None:
        """The inode of process ``pid``'s namespace of ``kind`` ("net", "user": /proc/PID/ns/KIND,
        the kernel's id of it), or None when it is gone or this tree has none."""
        try:
            return os.stat(self._prefix + paths.proc(pid, f"ns/{kind}")).st_ino
        except OSError:
            return None

    def login_of(self, session: str) -> tuple[str, bool, int | None] | None:
        """(PAM service, has a terminal, uid) of logind's login session ``session``, or None."""
        if not session.isalnum():
            return None
        text = self.read_quiet(paths.logind_session(session))
        return parse_logind_session(text) if text else None

    def thread_state(self, pid: int, tid: int) -> str | None:
        """A thread's state letter (proc(5): 'R' runnable, 'S' sleeping, ...), or None."""
        text = self.read_quiet(paths.task(pid, tid, "stat"))
        if not text:
            return None
        try:
            return split_stat(text)[1][0]
        except (ValueError, IndexError):
            return None

    def thread_activity(self, pid: int, tid: int) -> str:
        """What a thread is doing (``hostd.model.tasks.ACTIVITIES``): the system call it is
        blocked in, the file it reads, whether it ever wrote. "" when it is gone or this may
        not look (the files need the right to ptrace it: root's, or the owner's)."""
        text = self.read_quiet(paths.task(pid, tid, "syscall"))
        if not text:
            return ""
        try:
            call, arg = parse_syscall(text, self.machine)
            wrote = False
            if call in ("futex", "write"):
                io = self.read_quiet(paths.task(pid, tid, "io"))
                if io is None:
                    return ""
                wrote = parse_io_writes(io) > 0
        except ValueError:
            return ""
        target = self.readlink(paths.proc(pid, f"fd/{arg}")) if call == "read" else None
        return activity_of(call, wrote, target)

    def process_cpu(self, pid: int) -> tuple[str, int, int] | None:
        """A process's (leader's state letter, CPU clock ticks of all its threads, CPU clock
        ticks of its children it has waited for: proc(5) cutime + cstime), or None."""
        text = self.read_quiet(paths.proc(pid, "stat"))
        if not text:
            return None
        try:
            _, rest = split_stat(text)
            return rest[0], int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])
        except (ValueError, IndexError):
            return None

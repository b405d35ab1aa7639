"""Snapshots of every thread on the host, with the facts the classifier matches on.

``scan(host)`` walks ``/proc/PID/task/TID`` through ``Host`` and returns ``Task`` values that
share one ``Process`` per thread group (cgroup, cmdline, exe, GPU-driver fds and NVML presence
are properties of the process, read once). Tasks are keyed by ``(tid, start_time)`` so a reused
tid is never mistaken for an earlier thread. A task that exits while it is being read is left
out, never an error. Called by the CLI commands and the benchmark; the agent (issue 4) will
refresh the same values incrementally.

Per-thread cost is one read (stat) and one sched_getaffinity(2); status (credentials), cgroup,
cmdline, exe and fds are read once per process. See FACTS.md for the measured costs behind that
choice and BENCHMARKS.md for the full pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hostd.host import Host
from hostd.host.parsers import (
    Stat,
    Status,
    parse_cgroup,
    parse_stat,
    parse_status,
    primary_cgroup,
)

# Scheduling policies by number (include/uapi/linux/sched.h).
POLICY_NAMES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline", 7: "ext"}
# GPU-driver files: holding one of these makes a process a GPU process. Render nodes are recorded
# too (they say which AMD GPU a /dev/kfd process uses) but alone they do not count: desktop
# programs open them.
GPU_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/kfd", "/dev/accel/")
RENDER_PREFIX = "/dev/dri/renderD"


@dataclass(frozen=True, slots=True)
class Process:
    """What all threads of one thread group share."""

    pid: int
    start_time: int
    comm: str  # the thread-group leader's comm ("pcomm")
    ppid: int
    parent_comm: str
    cgroup: str
    cpuset: str  # its v1 cpuset cgroup path ("" without a v1 cpuset hierarchy)
    cmdline: str  # arguments joined by spaces; "" for kernel threads
    exe: str | None  # None for kernel threads or when not permitted to see it
    gpu_devices: tuple[str, ...]  # GPU-driver and render device files it holds, "/dev/nvidia0"
    nvml: bool  # NVML lists it among the GPU processes
    is_kthread: bool

    @property
    def gpu(self) -> bool:
        return any(dev.startswith(GPU_DEVICE_PREFIXES) for dev in self.gpu_devices)

    @property
    def nvidia_minors(self) -> tuple[int, ...]:
        """The /dev/nvidiaN device numbers it holds (which GPUs it uses)."""
        minors = []
        for dev in self.gpu_devices:
            tail = dev[len("/dev/nvidia") :]
            if dev.startswith("/dev/nvidia") and tail.isdigit():
                minors.append(int(tail))
        return tuple(sorted(minors))


@dataclass(slots=True)
class Task:
    """One thread. (Not frozen, only because frozen construction costs 1 us more, 100k times a
    pass; treat it as a value.)"""

    tid: int
    start_time: int
    comm: str
    state: str
    uid: int
    gid: int
    nice: int
    policy: int
    rt_priority: int
    affinity: frozenset[int]
    utime: int
    stime: int
    processor: int
    process: Process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def key(self) -> tuple[int, int]:
        return (self.tid, self.start_time)

    @property
    def is_leader(self) -> bool:
        return self.tid == self.process.pid

    @property
    def is_kthread(self) -> bool:
        return self.process.is_kthread

    @property
    def policy_name(self) -> str:
        return POLICY_NAMES.get(self.policy, str(self.policy))


def _gpu_devices(host: Host, pid: int) -> tuple[str, ...]:
    found = set()
    base = f"proc/{pid}/fd/"
    for fd in host.listdir(base):
        target = host.readlink(base + fd)
        if target and target.startswith((*GPU_DEVICE_PREFIXES, RENDER_PREFIX)):
            found.add(target)
    return tuple(sorted(found))


def _read_process(
    host: Host, pid: int, nvml_pids: frozenset[int], read_fds: bool
) -> Process | None:
    """The process (parent_comm still empty), or None when it is gone."""
    text = host.read(f"proc/{pid}/stat")
    if text is None:
        return None
    stat = parse_stat(text)
    if stat.is_kthread:
        cgroup, cpuset, cmdline, exe, gpu = "/", "", "", None, ()
    else:
        cgroups = parse_cgroup(host.read_quiet(f"proc/{pid}/cgroup") or "")
        cgroup, cpuset = primary_cgroup(cgroups), cgroups.get("cpuset", "")
        raw = host.read_quiet(f"proc/{pid}/cmdline") or ""
        cmdline = raw.rstrip("\0").replace("\0", " ")
        exe = host.readlink(f"proc/{pid}/exe")
        gpu = _gpu_devices(host, pid) if read_fds else ()
    return Process(
        pid=pid,
        start_time=stat.start_time,
        comm=stat.comm,
        ppid=stat.ppid,
        parent_comm="",
        cgroup=cgroup,
        cpuset=cpuset,
        cmdline=cmdline,
        exe=exe,
        gpu_devices=gpu,
        nvml=pid in nvml_pids,
        is_kthread=stat.is_kthread,
    )


def descendants(host: Host, roots: list[int]) -> list[int]:
    """``roots`` and every process below them (one stat read per process on the host)."""
    children: dict[int, list[int]] = {}
    for entry in host.listdir("proc"):
        if not entry.isdigit():
            continue
        try:
            text = host.read(f"proc/{entry}/stat")
        except OSError:
            continue
        if text is not None:
            children.setdefault(parse_stat(text).ppid, []).append(int(entry))
    found: list[int] = []
    todo = [r for r in roots if host.exists(f"proc/{r}")]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(set(found))


def scan(host: Host, *, read_fds: bool = True, pids: list[int] | None = None) -> list[Task]:
    """Every live thread below ``host``'s /proc (or of ``pids`` only), sorted by tid.

    ``read_fds`` False skips the per-process fd walk (the ``gpu`` signal) when no policy needs it.
    """
    nvml, _ = host.nvml()
    nvml_pids = nvml.pids if nvml else frozenset()
    if pids is None:
        pids = [int(e) for e in host.listdir("proc") if e.isdigit()]
    procs: dict[int, Process] = {}
    creds: dict[int, Status] = {}
    raw_tasks: list[tuple[int, Stat, frozenset[int], int]] = []
    read, affinity = host.read, host.affinity
    interned: dict[frozenset[int], frozenset[int]] = {}
    for pid in pids:
        try:
            proc = _read_process(host, pid, nvml_pids, read_fds)
            status_text = read(f"proc/{pid}/task/{pid}/status")
        except (OSError, ValueError, IndexError):
            continue  # unreadable or half-written: treated as gone for this pass
        if proc is None or status_text is None:
            continue
        procs[pid] = proc
        # Credentials are the process's: threads share them (a thread that changed its own
        # with a raw setresuid syscall is the rare exception this does not see).
        creds[pid] = parse_status(status_text)
        for entry in host.listdir(f"proc/{pid}/task"):
            if not entry.isdigit():
                continue
            tid = int(entry)
            try:
                stat_text = read(f"proc/{pid}/task/{entry}/stat")
                if stat_text is None:
                    continue
                stat = parse_stat(stat_text)
            except (OSError, ValueError, IndexError):
                continue
            if stat.state in ("Z", "X"):
                continue  # exited, not yet reaped: nothing to change on it
            cpus = affinity(pid, tid)
            if cpus is None:
                continue
            # Most threads share a handful of affinities: keep one copy of each (memory, and
            # the planner's per-affinity memo hits by identity).
            raw_tasks.append((tid, stat, interned.setdefault(cpus, cpus), pid))

    # The parent's comm: from this snapshot, or one extra read for a parent outside it.
    comms = {pid: p.comm for pid, p in procs.items()}
    for pid, proc in list(procs.items()):
        parent = comms.get(proc.ppid)
        if parent is None and proc.ppid > 0:
            text = host.read_quiet(f"proc/{proc.ppid}/comm")
            parent = text.rstrip("\n") if text else ""
            comms[proc.ppid] = parent
        procs[pid] = replace(proc, parent_comm=parent or "")

    tasks = [
        Task(
            tid=tid,
            start_time=stat.start_time,
            comm=stat.comm,
            state=stat.state,
            uid=creds[pid].uid,
            gid=creds[pid].gid,
            nice=stat.nice,
            policy=stat.policy,
            rt_priority=stat.rt_priority,
            affinity=cpus,
            utime=stat.utime,
            stime=stat.stime,
            processor=stat.processor,
            process=procs[pid],
        )
        for tid, stat, cpus, pid in raw_tasks
    ]
    tasks.sort(key=lambda t: t.tid)
    return tasks

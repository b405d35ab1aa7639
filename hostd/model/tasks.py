"""Threads and processes as values: what the classifier, the planner and the watch decide on.

``hostd.tasks`` reads them from /proc (through ``Host``); this module only defines them, so the
pure core can use them without importing the kernel door.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hostd.model.jobs import Job
from hostd.model.node import ROOT, Place

# Scheduling policies by number (include/uapi/linux/sched.h).
POLICY_NAMES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline", 7: "ext"}
# Accelerator-driver files: holding one of these makes a process a GPU process. NVIDIA
# (/dev/nvidia*), AMD ROCm (/dev/kfd), the kernel's accel subsystem (Intel Gaudi, others:
# /dev/accel/accel*), Habana's older nodes (/dev/hl*), AWS Neuron (/dev/neuron*). Render nodes
# are recorded too (they say which AMD GPU a /dev/kfd process uses) but alone they do not count:
# desktop programs open them.
GPU_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/kfd", "/dev/accel/", "/dev/hl", "/dev/neuron")
RENDER_PREFIX = "/dev/dri/renderD"


# What an unnamed thread of a job was seen doing (``Task.activity``), where its name says
# nothing: the system call it was blocked in (/proc/PID/task/TID/syscall), for a read the file
# it read, and whether it ever wrote (/proc/PID/task/TID/io). Read by ``hostd.tasks`` for the
# unnamed threads of a job's processes only; "" where not looked at or not permitted.
ACTIVITIES = {
    "polls": "blocked in poll, select or epoll (NCCL's proxy service, UDS and RAS threads)",
    "rdma-events": "blocked reading an RDMA device's events (NCCL's InfiniBand thread)",
    "feeds": "waits on a lock and has written to a pipe or file (a multiprocessing queue feeder)",
    "waits": "waits on a lock and never wrote (an idle pool worker, NCCL's idle progress thread)",
    "runs": "on a CPU or runnable when looked at",
    "other": "blocked in another system call",
}
# What a thread does for its whole life once seen: kept when a later look finds it running.
STICKY_ACTIVITIES = frozenset({"polls", "rdma-events", "feeds"})
# The file an RDMA device's asynchronous events are read from (drivers/infiniband/core:
# anon_inode_getfile("[infinibandevent]", ...)): NCCL's IB thread blocks reading it.
RDMA_EVENTS = "anon_inode:[infinibandevent]"


def activity_of(call: str, wrote: bool, read_target: str | None) -> str:
    """An ``ACTIVITIES`` word from what ``hostd.host.parsers.parse_syscall`` read (``call``),
    whether the thread ever wrote, and the target of the fd it reads (for a read)."""
    if call == "running":
        return "runs"
    if call == "poll":
        return "polls"
    if call == "read" and read_target == RDMA_EVENTS:
        return "rdma-events"
    if call in ("futex", "write"):
        return "feeds" if wrote else "waits"
    return "other"


@dataclass(frozen=True, slots=True)
class Process:
    """What all threads of one thread group share."""

    pid: int
    start_time: int
    comm: str  # the thread-group leader's comm ("pcomm")
    ppid: int
    parent_comm: str
    cgroup: str
    cpuset: str  # its leader's cpuset cgroup: the v1 cpuset path, else the v2 path ("" neither)
    cmdline: str  # arguments joined by spaces; "" for kernel threads
    exe: str | None  # None for kernel threads or when not permitted to see it
    gpu_devices: tuple[str, ...]  # GPU-driver and render device files it holds, "/dev/nvidia0"
    nvml: bool  # NVML lists it among the GPU processes
    is_kthread: bool
    session: int = 0  # its session (= its autogroup while autogroups are on); 0 unknown
    tty: bool = False  # it has a controlling terminal (an interactive session's process)
    env: tuple[tuple[str, str], ...] = ()  # its job variables (hostd.model.jobs.JOB_VARS)
    job: Job | None = None  # its training job and role there (hostd.model.jobs.job_of)
    node: Place = ROOT  # what it is on the node (hostd.model.node)

    @property
    def gpu(self) -> bool:
        return any(dev.startswith(GPU_DEVICE_PREFIXES) for dev in self.gpu_devices)

    @property
    def job_gpu(self) -> bool:
        """In a job whose rank (this process, or the rank it serves) holds a GPU-driver file or
        is in NVML's list: the GPU gate that a process outside a job never passes."""
        job = self.job
        return job is not None and (job.gpu or self.gpu or self.nvml)

    @property
    def session_leader(self) -> bool:
        """It leads its session (setsid(2)): torchrun starts each rank so."""
        return self.session == self.pid

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
    pass; treat it as a value: what changes one in place, other than its own reading, says so
    by setting ``line`` to 0.)"""

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
    activity: str = ""  # ACTIVITIES: what it was seen doing (unnamed threads of a job only)
    # The hash of the stat line it was built from, while its fields are still that line's (0:
    # not built from one, or changed since): the next full pass keeps a thread whose line is
    # the same (``hostd.tasks.scan``). Not copied by ``replace``; not part of its value.
    line: int = field(default=0, init=False, compare=False, repr=False)

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
    def unnamed(self) -> bool:
        """A thread other than the leader that carries its process's name: nobody named it
        (NCCL's threads without NCCL_SET_THREAD_NAME=1, OpenMP workers, Python < 3.14 threads)."""
        return self.tid != self.process.pid and self.comm == self.process.comm

    def job_line(self) -> str | None:
        """What its job says of this thread: "unnamed thread of rank 3 of job torchrun abc",
        with what it was seen doing."""
        job = self.process.job
        if job is None:
            return None
        if job.role == "rank" and self.unnamed:
            does = self.activity
            seen = f", seen: {does} ({ACTIVITIES[does]})" if does in ACTIVITIES else ""
            return f"unnamed thread of rank {job.rank} of job {job.id}{seen}"
        return f"{job.describe()} ({job.why})"

    @property
    def policy_name(self) -> str:
        return POLICY_NAMES.get(self.policy, str(self.policy))


def session_members(parents: Mapping[int, tuple[int, int]], sid: int) -> set[int]:
    """The processes of session ``sid`` and those that left it (setsid) but descend from it,
    given every process's (parent pid, session id)."""
    members = {pid for pid, (_, session) in parents.items() if session == sid}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in parents.items() if ppid in members} - members
        members |= more
        grew = bool(more)
    return members

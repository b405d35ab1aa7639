"""Reading one process and one thread from /proc, for ``scan`` and ``TaskCache``.

``_read_process`` reads what a thread group shares, once per process: its stat line, its
credentials (status), cgroup, cmdline, exe, environment, GPU-driver fds (``_gpu_devices``) and
its place on the node (``node_of``). ``_parent_comm`` names its parent, ``joined`` and
``_join_all`` give it its job. ``_task`` builds one thread from its stat line and the
process it belongs to. A process or thread that exits while it is being read comes back as
None, never an error. Called by ``hostd.tasks`` (``scan`` and ``TaskCache``), which re-exports
``node_of``, ``joined`` and ``NVIDIA_FRONTEND``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from sys import intern

from hostd.host import Host, paths
from hostd.host.parsers import (
    parse_stat,
    parse_status,
    primary_cgroup,
    split_stat,
)
from hostd.model.cpus import home_of
from hostd.model.jobs import environ_vars, job_of
from hostd.model.node import KERNEL, Place, host_access, place
from hostd.model.tasks import (
    GPU_DEVICE_PREFIXES,
    RENDER_PREFIX,
    Process,
    Task,
)


def _task(
    tid: int, text: str, cpus: frozenset[int], uid: int, gid: int, proc: Process
) -> Task | None:
    """A thread from its stat line, or None when it has exited but is not reaped yet (nothing
    to change on it). Built straight from the split line (field (n) is ``rest[n - 3]``, as in
    ``parse_stat``), without a ``Stat`` in between: this runs once per thread per pass, and the
    ``Stat`` and keyword arguments cost 4.5 us of the 11 (BENCHMARKS.md).
    Thread names repeat (every worker of a pool shares one): one copy of each is kept.
    Raises ValueError or IndexError on a half-written line."""
    comm, rest = split_stat(text)
    state = rest[0]
    if state == "Z" or state == "X":
        return None
    return Task(
        tid, int(rest[19]), intern(comm), state, uid, gid, int(rest[16]), int(rest[38]),
        int(rest[37]), cpus, int(rest[11]), int(rest[12]), int(rest[36]), proc,
    )  # fmt: skip


# Which driver (its name in /proc/devices) a device file of each prefix must belong to.
_DRIVERS = (
    ("/dev/nvidia", ("nvidia",)),  # nvidia-frontend (GPUs, nvidiactl), nvidia-uvm, -caps, ...
    ("/dev/kfd", ("kfd",)),
    ("/dev/accel/", ("accel",)),
    ("/dev/hl", ("habanalabs",)),
    ("/dev/neuron", ("neuron",)),  # aws-neuronx-dkms: alloc_chrdev_region(..., "neuron")
    (RENDER_PREFIX, ("drm",)),
)
# The NVIDIA GPUs' major (minor 255 is nvidiactl): Documentation/admin-guide/devices.txt
NVIDIA_FRONTEND = 195


def _gpu_devices(host: Host, pid: int) -> tuple[str, ...]:
    """The GPU-driver and render device files the process holds. On the live host a file
    counts only if the kernel says it is a character device of that driver (its major in
    /proc/devices): the path a process opened is its own to choose (a file named /dev/nvidia0
    in a mount namespace of its own), the device behind the fd is not. Fixture trees hold only
    the link text."""
    found = set()
    base = paths.proc(pid, "fd/")
    majors: dict[int, str] | None = None
    for fd in host.listdir(base):
        target = host.readlink(base + fd)
        if not target or not target.startswith((*GPU_DEVICE_PREFIXES, RENDER_PREFIX)):
            continue
        if host.live:
            dev = host.char_device(base + fd)
            if dev is None:
                continue
            if majors is None:
                majors = host.char_majors()
            driver = majors.get(dev[0], "")
            want = next(names for prefix, names in _DRIVERS if target.startswith(prefix))
            if not driver.startswith(want):
                continue
            if dev[0] == NVIDIA_FRONTEND and driver.startswith("nvidia"):
                target = "/dev/nvidiactl" if dev[1] == 255 else f"/dev/nvidia{dev[1]}"
        found.add(target)
    return tuple(sorted(found))


def _read_process(
    host: Host, pid: int, nvml_pids: frozenset[int], read_fds: bool
) -> tuple[Process, int, int] | None:
    """The process (parent_comm still empty) and its effective uid and gid, or None when it is
    gone or unreadable. Credentials are the process's: threads share them (a thread that changed
    its own with a raw setresuid syscall is the rare exception this does not see)."""
    try:
        text = host.read(paths.proc(pid, "stat"))
        status = host.read(paths.task(pid, pid, "status"))
        if text is None or status is None:
            return None
        stat, creds = parse_stat(text), parse_status(status)
    except (OSError, ValueError, IndexError):
        return None  # unreadable or half-written: treated as gone for this pass
    env: tuple[tuple[str, str], ...] = ()
    if stat.is_kthread:
        cgroup, cpuset, cmdline, exe, gpu, node = "/", "", "", None, (), KERNEL
    else:
        cgroups = host.cgroups(pid) or {}
        # Classified by the cgroup it lives in, wherever hostd put its leader's cpuset.
        cgroup = home_of(primary_cgroup(cgroups))
        cpuset = cgroups.get("cpuset", cgroups.get("", ""))
        raw = host.read_quiet(paths.proc(pid, "cmdline")) or ""
        cmdline = raw.rstrip("\0").replace("\0", " ")
        exe = host.readlink(paths.proc(pid, "exe"))
        gpu = _gpu_devices(host, pid) if read_fds else ()
        try:
            env = environ_vars(host.read_bytes(paths.proc(pid, "environ")) or b"")
        except OSError:
            env = ()
        node = node_of(host, cgroup, pid, creds.cap_bnd)
    proc = Process(
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
        session=stat.session,
        tty=stat.tty_nr != 0,
        env=env,
        node=node,
    )
    return proc, creds.uid, creds.gid


def node_of(host: Host, cgroup: str, pid: int = 0, cap_bnd: int = 0) -> Place:
    """What process ``pid``, whose home cgroup is ``cgroup``, is on the node
    (``hostd.model.node``): its path, for a pod's container or a login what their managers'
    records say, and for a pod's process what the kernel says it may reach of the host
    (``cap_bnd``: its bounding set, from its status)."""
    where = place(cgroup)
    if where.kind == "pod":
        if pid > 0:
            ns = host.namespace
            where = where.with_host_access(
                host_access(
                    (ns(pid, "net"), host.host_namespace("net")),
                    (ns(pid, "user"), host.host_namespace("user")),
                    cap_bnd,
                )
            )
        pod = host.pod_of(where.container) if where.container else None
        if pod is not None:
            return where.with_pod(*pod)
    elif where.kind == "login":
        login = host.login_of(where.unit.removeprefix("session-").removesuffix(".scope"))
        if login is not None:
            return where.with_login(login[0], login[1])
    return where


def _parent_comm(host: Host, ppid: int, known: dict[int, Process]) -> str:
    """The comm of process ``ppid``: from ``known``, else one read ("" when there is none)."""
    parent = known.get(ppid)
    if parent is not None:
        return parent.comm
    text = host.read_quiet(paths.proc(ppid, "comm")) if ppid > 0 else None
    return text.rstrip("\n") if text else ""


def joined(proc: Process, procs: Mapping[int, Process]) -> Process:
    """``proc`` with its job (``hostd.model.jobs.job_of``), from its parent's in ``procs``."""
    if proc.is_kthread:
        return proc
    parent = procs.get(proc.ppid)
    pjob = parent.job if parent is not None else None
    rank = procs.get(pjob.rank_pid) if pjob is not None and pjob.rank_pid else None
    job = job_of(
        pid=proc.pid,
        comm=proc.comm,
        cmdline=proc.cmdline,
        cgroup=proc.cgroup,
        env=dict(proc.env),
        gpu=proc.gpu or proc.nvml,
        parent=pjob,
        parent_comm=proc.parent_comm,
        rank_gpu=rank is not None and (rank.gpu or rank.nvml),
    )
    return proc if job == proc.job else replace(proc, job=job)


def _join_all(procs: dict[int, Process]) -> None:
    """Give every process of ``procs`` its job, parents before their children."""
    done: set[int] = set()
    for pid in list(procs):
        chain = []
        while pid in procs and pid not in done and pid not in chain:
            chain.append(pid)
            pid = procs[pid].ppid
        for p in reversed(chain):
            procs[p] = joined(procs[p], procs)
            done.add(p)

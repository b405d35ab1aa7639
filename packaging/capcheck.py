"""Which capabilities hostd's kernel interfaces need: the evidence behind the unit's list.

Run as root: ``python3 packaging/capcheck.py``. It starts a victim process (two threads) as
``nobody``, then probes, from a root process whose capability bounding set is cut down with
``capsh`` (libcap2-bin), each kernel interface hostd uses on other users' tasks: affinity,
SCHED_FIFO, nice, /proc/PID/fd and exe links, move_pages and migrate_pages, a cgroup v1 cpuset
(mkdir, attach, detach, rmdir of its own ``hostd-capcheck-PID`` group), an IRQ's
smp_affinity_list (its own value written back), /dev/cpu_dma_latency, SO_RCVBUFFORCE and the
proc connector's multicast group. It prints one column per capability set: the unit's, the
unit's less each of its capabilities, and none at all. Nothing it changes outlives the probe
(the victim is its own, IRQs get their current value, the cgroup is removed). Not part of the
test suite: it changes real (if harmless) kernel state. packaging/README.md has its results.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
import socket
import subprocess
import sys
import time

UNIT_CAPS = ("cap_sys_nice", "cap_sys_ptrace", "cap_dac_override", "cap_net_admin")
SYS_MOVE_PAGES, SYS_MIGRATE_PAGES = 279, 256  # x86_64 (arch/x86/entry/syscalls/syscall_64.tbl)
NETLINK_CONNECTOR, CN_IDX_PROC, SO_RCVBUFFORCE = 11, 1, 33


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _move_pages(pid: int) -> None:
    """move_pages in query mode (nodes=NULL): needs ptrace access to the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = (ctypes.c_void_p * 1)(0x400000)
    status = (ctypes.c_int * 1)()
    if libc.syscall(SYS_MOVE_PAGES, pid, ctypes.c_ulong(1), pages, None, status, 0) < 0:
        raise OSError(ctypes.get_errno(), "move_pages")


def _migrate_pages(pid: int) -> None:
    """migrate_pages from node 0 to node 0: the permission checks, no page moves."""
    libc = ctypes.CDLL(None, use_errno=True)
    old, new = ctypes.c_ulong(1), ctypes.c_ulong(1)
    if libc.syscall(
        SYS_MIGRATE_PAGES, pid, ctypes.c_ulong(2), ctypes.byref(old), ctypes.byref(new)
    ):
        raise OSError(ctypes.get_errno(), "migrate_pages")


def _cpuset(tid: int) -> None:
    root = "/sys/fs/cgroup/cpuset"
    if not os.path.exists(f"{root}/tasks"):
        raise OSError(0, "no cgroup v1 cpuset hierarchy")
    group = f"{root}/hostd-capcheck-{os.getpid()}"
    original = _read(f"/proc/{tid}/cpuset")
    os.mkdir(group)
    try:
        _write(f"{group}/cpuset.cpus", _read(f"{root}/cpuset.cpus"))
        _write(f"{group}/cpuset.mems", _read(f"{root}/cpuset.mems"))
        _write(f"{group}/tasks", str(tid))
        _write(f"{root}{original.rstrip('/')}/tasks", str(tid))
    finally:
        os.rmdir(group)


def _irq() -> None:
    for path in sorted(glob.glob("/proc/irq/*/smp_affinity_list")):
        value = _read(path)
        try:
            _write(path, value)
            return
        except OSError as exc:
            if exc.errno != 5:  # EIO: a kernel-managed IRQ, try the next one
                raise
    raise OSError(0, "no IRQ accepts a write")


def _netlink(bind: bool) -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    try:
        if bind:
            sock.bind((0, CN_IDX_PROC))
        else:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    finally:
        sock.close()


def probe(pid: int) -> dict[str, str]:
    """Every probe against the victim ``pid``: "ok", the errno's name, or "n/a"."""
    tid = max(int(t) for t in os.listdir(f"/proc/{pid}/task"))

    def fifo() -> None:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))

    def nice() -> None:
        os.setpriority(os.PRIO_PROCESS, tid, -5)
        os.setpriority(os.PRIO_PROCESS, tid, 0)

    probes = {
        "sched_setaffinity": lambda: os.sched_setaffinity(tid, os.sched_getaffinity(tid)),
        "SCHED_FIFO": fifo,
        "nice -5": nice,
        "/proc/PID/fd links": lambda: [
            os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
        ],
        "/proc/PID/exe": lambda: os.readlink(f"/proc/{pid}/exe"),
        "move_pages": lambda: _move_pages(pid),
        "migrate_pages": lambda: _migrate_pages(pid),
        "cpuset v1 mkdir+attach": lambda: _cpuset(tid),
        "IRQ smp_affinity_list": _irq,
        "/dev/cpu_dma_latency": lambda: os.close(os.open("/dev/cpu_dma_latency", os.O_RDWR)),
        "SO_RCVBUFFORCE": lambda: _netlink(bind=False),
        "proc connector bind": lambda: _netlink(bind=True),
    }
    out = {}
    for name, fn in probes.items():
        try:
            fn()
            out[name] = "ok"
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno, str(exc.strerror)) if exc.errno else "n/a"
    return out


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        for name, result in probe(int(sys.argv[2])).items():
            print(f"{name}\t{result}")
        return 0
    if os.geteuid() != 0 or shutil.which("capsh") is None:
        print("run as root, with capsh (apt-get install libcap2-bin)", file=sys.stderr)
        return 2
    victim = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "import threading, time; threading.Thread(target=time.sleep, args=(600,)).start(); "
         "time.sleep(600)"],
    )  # fmt: skip
    try:
        time.sleep(0.5)
        bounding = subprocess.run(["capsh", "--print"], capture_output=True, text=True, check=True)
        every = next(
            line.split("=", 1)[1].strip().split(",")
            for line in bounding.stdout.splitlines()
            if line.startswith("Bounding set")
        )
        columns = {"unit": set(UNIT_CAPS)}
        columns.update({f"-{cap[4:]}": set(UNIT_CAPS) - {cap} for cap in UNIT_CAPS})
        columns["none"] = set()
        results = {}
        for label, keep in columns.items():
            drop = ",".join(cap for cap in every if cap not in keep)
            me = f"{sys.executable} {os.path.abspath(__file__)} --probe {victim.pid}"
            proc = subprocess.run(
                ["capsh", f"--drop={drop}", "--", "-c", me],
                capture_output=True,
                text=True,
                check=True,
            )
            results[label] = dict(line.split("\t") for line in proc.stdout.splitlines())
        names = list(results["unit"])
        width = max(map(len, names))
        print(" " * width, *(f"{label:>13}" for label in columns))
        for name in names:
            print(f"{name:{width}}", *(f"{results[label][name]:>13}" for label in columns))
    finally:
        victim.kill()
        victim.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

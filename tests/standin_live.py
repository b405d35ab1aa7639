"""A stand-in node of ``tests/standin.py`` made of real processes on the live kernel (root).

``LiveNode(procs, tmp)`` starts one process per ``Proc`` as the child of its parent's process
(so parentage is the kernel's), each exec'd with its environment (so ``/proc/PID/environ`` holds
it), its uid, its session (``setsid`` where it leads one), its cgroup (made in the cgroup v2
hierarchy, or systemd's named v1 one, at the very path a real node has: ``/system.slice/
slurmstepd.scope/job_4242/...``), its comm, a command line that holds the real one, its threads
with their names, and its accelerator fds: opened in a mount namespace of the node's own, where
a tmpfs over ``/dev`` holds ``/dev/nvidia0``... as character devices. Each thread does what
its spec says (``activity``): waits in poll(2), on a lock after writing to a pipe, or on a lock;
an RDMA device's events cannot be waited for without one ("rdma-events" threads are left out
by the test). Their major is the one of
``/dev/null`` (a device of an absent driver cannot be opened); ``driver_host()`` gives a ``Host``
whose driver table (``/proc/devices``) names that major as NVIDIA's: the one fact this machine
lacks. Leaving the context kills every process it started and removes every cgroup it made.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from hostd.host import Host
from hostd.host.cgroupfs import read_cgroup_layout
from hostd.host.parsers import parse_pod_spec
from hostd.model.node import place
from tests.standin import NAMESPACES, Proc, activity

NULL_MAJOR = os.major(os.stat("/dev/null").st_rdev)
# The node's processes run as other users too: an interpreter they may run (a virtual
# environment's may sit below root's home); the program needs only the standard library.
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

# One program for every process: it reads its subtree from fd STANDIN_FD, makes its children,
# becomes what its spec says, reports "key pid" on fd STANDIN_READY and sleeps.
CHILD = textwrap.dedent(
    r"""
    import ctypes, json, os, select, socket, sys, threading, time, traceback

    with os.fdopen(int(os.environ["STANDIN_FD"]), "rb") as fh:
        spec = json.loads(fh.read().decode())
    ready = int(os.environ["STANDIN_READY"])
    PYTHON = os.environ["STANDIN_PYTHON"]
    libc = ctypes.CDLL(None, use_errno=True)

    def rename(name):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
            fh.write(name)

    if spec.get("namespace"):  # the node's root: /dev of its own, with the accelerators
        if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
            sys.exit("unshare failed")
        libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None)  # MS_REC | MS_PRIVATE
        if libc.mount(b"tmpfs", b"/dev", b"tmpfs", 0, b"mode=0755") != 0:
            sys.exit("mount failed")
        for name, minor in (("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)):
            os.mknod(f"/dev/{name}", 0o20666, os.makedev(1, minor))
        for name in spec["devices"]:
            os.mknod(name, 0o20666, os.makedev(spec["major"], 3))
            os.chmod(name, 0o666)

    def start(child):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                become(child, r, w)
            except BaseException:
                traceback.print_exc()
            os._exit(127)  # only when exec failed (its error is on stderr)
        os.close(r)
        os.write(w, json.dumps(child).encode())
        os.close(w)

    def become(child, r, w):
        os.close(w)
        if child["leads_session"]:
            os.setsid()
        env = {**child["env"], "STANDIN_FD": str(r), "STANDIN_READY": str(ready),
               "STANDIN_TAG": os.environ["STANDIN_TAG"], "STANDIN_PYTHON": PYTHON}
        if child["uid"] != os.getuid():
            os.setgroups([])
            os.setresgid(child["uid"], child["uid"], child["uid"])
            os.setresuid(child["uid"], child["uid"], child["uid"])
        os.set_inheritable(r, True)
        os.set_inheritable(ready, True)
        os.execve(PYTHON, [PYTHON, sys.argv[0], "--", *child["argv"]], env)

    for child in spec["children"]:
        start(child)
    fds = [os.open(d, os.O_RDWR) for d in spec["fds"]]
    rename(spec["comm"])
    def act(does):  # what the thread does, as the real one does when idle
        if does == "polls":  # NCCL's proxy service: poll(2) with a timeout, again and again
            a, b = socket.socketpair()
            poller = select.poll()
            poller.register(a, select.POLLIN)
            while True:
                poller.poll(500)
        if does == "feeds":  # a queue feeder: it wrote to its pipe, it waits for more
            r, w = os.pipe()
            os.write(w, b"x")
        threading.Event().wait()  # "waits": on a lock (a futex)

    for name, does in spec["threads"]:
        ev = threading.Event()
        def run(name=name, does=does, ev=ev):
            if name:
                rename(name)
            ev.set()
            act(does)
        threading.Thread(target=run, daemon=True).start()
        ev.wait()
    os.write(ready, f"{spec['key']} {os.getpid()}\n".encode())
    while True:
        time.sleep(3600)
    """
)


class LiveNode:
    def __init__(self, procs: list[Proc]) -> None:
        self.procs = procs
        # the program every process runs: readable by the node's other users
        self.tmp = Path(tempfile.mkdtemp(prefix="hostd-standin-"))
        self.tmp.chmod(0o755)
        self.tag = uuid.uuid4().hex
        self.pids: dict[str, int] = {}
        self.made: list[Path] = []  # cgroup directories made, parents first
        self.mount = self._cgroup_mount()
        self.runtime = self.tmp / "containerd"  # its bundles by container id (driver_host)

    @staticmethod
    def _cgroup_mount() -> Path | None:
        layout = read_cgroup_layout(Host())
        if layout.v2_mount:
            return Path(layout.v2_mount)
        systemd = Path("/sys/fs/cgroup/systemd")
        return systemd if (systemd / "cgroup.procs").exists() else None

    def _cgroup_dir(self, path: str) -> str:
        if self.mount is None or path == "/":
            return ""
        here = self.mount
        for part in path.strip("/").split("/"):
            here = here / part
            if not here.exists():
                here.mkdir()
                self.made.append(here)
        return str(here)

    def _spec(self, proc: Proc, devices: list[str]) -> dict:
        children = [p for p in self.procs if p.parent == proc.key]
        threads = [
            (name, activity(does))
            for name, count, _, _, *does in proc.threads
            for _ in range(count)
        ]
        return {
            "key": proc.key,
            "comm": proc.comm,
            "uid": proc.uid,
            "env": {"PATH": "/usr/bin:/bin", **proc.env},
            "argv": (proc.cmdline or proc.comm).split(),
            "leads_session": proc.session is None,
            "fds": list(proc.fds),
            "threads": threads,
            "children": [self._spec(c, devices) for c in children],
        }

    def __enter__(self) -> LiveNode:
        script = self.tmp / "standin_child.py"
        script.write_text(CHILD)
        script.chmod(0o644)
        devices = sorted({d for p in self.procs for d in p.fds})
        roots = [p for p in self.procs if p.parent is None]
        top = {
            "key": "", "comm": "standin", "uid": 0, "env": {}, "argv": [],
            "leads_session": True, "fds": [], "threads": [], "namespace": True,
            "devices": devices, "major": NULL_MAJOR,
            "children": [self._spec(p, devices) for p in roots],
        }  # fmt: skip
        r, w = os.pipe()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.close(ready_r)
            os.setsid()
            env = {"PATH": "/usr/bin:/bin", "STANDIN_FD": str(r), "STANDIN_READY": str(ready_w),
                   "STANDIN_TAG": self.tag, "STANDIN_PYTHON": PYTHON}  # fmt: skip
            os.set_inheritable(r, True)
            os.set_inheritable(ready_w, True)
            os.execve(PYTHON, [PYTHON, str(script)], env)
        os.close(r)
        os.close(ready_w)
        self.top = pid
        os.write(w, json.dumps(top).encode())
        os.close(w)
        deadline = time.monotonic() + 60
        buf = b""
        with os.fdopen(ready_r, "rb", buffering=0) as fh:
            while len(self.pids) < len(self.procs) + 1 and time.monotonic() < deadline:
                if not select.select([fh], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    break
                chunk = fh.read(4096)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    key, _, num = line.decode().partition(" ")
                    self.pids[key] = int(num)
        if len(self.pids) < len(self.procs) + 1:
            self.__exit__(None, None, None)
            raise RuntimeError(f"the stand-in node started {len(self.pids)} of {len(self.procs)}")
        self.pids.pop("")
        # The container runtime's record of each pod container that has one (its namespace),
        # as containerd writes it into the container's bundle: read by ``driver_host``.
        for proc in self.procs:
            where = place(proc.cgroup)
            if proc.cgroup in NAMESPACES and where.container:
                bundle = self.runtime / where.container
                bundle.mkdir(parents=True, exist_ok=True)
                namespace, pod = NAMESPACES[proc.cgroup]
                (bundle / "config.json").write_text(json.dumps({"annotations": {
                    "io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.sandbox-namespace": namespace,
                    "io.kubernetes.cri.sandbox-name": pod,
                }}))  # fmt: skip
        # Into their cgroups, from here (root): a process of another user may not move itself
        for proc in self.procs:
            where = self._cgroup_dir(proc.cgroup)
            if where:
                Path(where, "cgroup.procs").write_text(str(self.pids[proc.key]))
        return self

    def tagged(self) -> list[int]:
        """Every live process that carries this node's tag (started by it)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as fh:
                if f"STANDIN_TAG={self.tag}".encode() in fh.read().split(b"\0"):
                    found.append(int(entry))
        return found

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):
            pids = self.tagged()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.top, os.WNOHANG)
            time.sleep(0.1)
        shutil.rmtree(self.tmp, ignore_errors=True)
        for path in reversed(self.made):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)  # a killed process still leaving it (EBUSY)


def driver_host(runtime: Path | None = None) -> Host:
    """The live host, whose driver table names /dev/null's major as NVIDIA's frontend, and
    whose container runtime's state (``runtime``: ``LiveNode.runtime``, containerd's bundles by
    container id) is the node's: the facts this machine lacks."""

    class DriverHost(Host):
        def char_majors(self) -> dict[int, str]:
            return {**super().char_majors(), NULL_MAJOR: "nvidia-frontend"}

        def pod_of(self, container: str) -> tuple[str, str, bool] | None:
            if runtime is None:
                return super().pod_of(container)
            spec = runtime / container / "config.json"
            return parse_pod_spec(spec.read_text()) if spec.exists() else None

    return DriverHost()

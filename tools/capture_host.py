#!/usr/bin/env python3
"""Capture the files hostd reads from this machine into a fixture tree.

Usage::

    python3 tools/capture_host.py DEST [--hostname NAME] [--max-processes N] [--force]

Copies from the live machine ("/") into DEST exactly the /proc and /sys files that
``hostd.host.Host`` readers open (``hostd/topology``, ``hostd/tasks``), at the same relative
paths, so that ``Host(DEST)`` reads them as it would read the live kernel. The result is meant
to be committed under ``tests/fixtures/hosts/<name>/`` (see the README there), so it is kept
small and free of secrets:

- of a process's environment only the job variables hostd reads are kept (``RANK``,
  ``WORLD_SIZE``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``, ...: ``hostd.model.jobs.JOB_VARS``,
  copied below so that this script needs only the standard library); a cmdline that contains
  "token", "secret", "password" (or a few similar words, or something shaped like
  ``NAME=value``) is left out, and the process reads with an empty cmdline;
- ``proc/PID/fd`` keeps only the links to GPU driver devices (``/dev/nvidia*``, ``/dev/kfd``,
  ``/dev/accel/*``, ``/dev/dri/*``);
- ``proc/self/mountinfo`` keeps only the cgroup mounts and the /, /proc and /sys lines;
- this capture process itself is left out;
- sysfs directories that hostd only lists (``msi_irqs``, ``drm``, ``accel``) become empty plain
  files, because git keeps no empty directories.

Files that vanish or refuse reads are skipped silently; a task that exits mid-capture is left
out. ``nvml.json`` is written when ``hostd.host.nvml.read_nvml(None)`` answers (needs the
hostd package and pynvml; the rest of this script uses only the standard library).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

LIVE = "/"

GPU_FD_PREFIXES = (
    "/dev/nvidia", "/dev/kfd", "/dev/accel/", "/dev/dri/", "/dev/hl", "/dev/neuron",
)  # fmt: skip
# hostd.model.jobs.JOB_VARS (tests/unit/test_fixture_hosts.py checks that the two agree).
JOB_VARS = (
    "RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "LOCAL_RANK", "WORLD_SIZE",
    "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID",
    "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_RESTART_COUNT", "NCCL_SET_THREAD_NAME",
    "SLURM_JOB_NAME", "HOSTD_PROTECT", "HOSTD_JOB", "HOSTD_THROUGHPUT_FILE",
)  # fmt: skip
# Words that mark a command line as possibly carrying a credential; such cmdlines are dropped.
SENSITIVE = re.compile(
    r"token|secret|passw|credential|api[_-]?key|bearer|private|auth|--env\b|\bssh-\w+ AAAA",
    re.IGNORECASE,
)
# "NAME=value" arguments look like environment assignments (env FOO=bar cmd ...): dropped too.
ENV_ASSIGNMENT = re.compile(r"(^|\x00)[A-Z_][A-Z0-9_]{2,}=")

CPU_TOPOLOGY = (
    "core_id",
    "physical_package_id",
    "die_id",
    "core_cpus_list",
    "thread_siblings_list",
)
CPU_CACHE = ("level", "type", "shared_cpu_list")
CPU_FREQ = (
    "scaling_driver",
    "scaling_governor",
    "scaling_available_governors",
    "scaling_min_freq",
    "scaling_max_freq",
    "cpuinfo_min_freq",
    "cpuinfo_max_freq",
    "energy_performance_preference",
    "energy_performance_available_preferences",
)
PCI_ATTRS = ("vendor", "device", "class", "numa_node", "local_cpulist")
IRQ_FILES = ("smp_affinity_list", "effective_affinity_list", "node")
MOUNT_POINTS_KEPT = ("/", "/proc", "/sys", "/sys/fs/cgroup")

_CPU_DIR = re.compile(r"^cpu\d+$")
_NODE_DIR = re.compile(r"^node\d+$")


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (proc(5))."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass
class Proc:
    """One process as read, before anything is written."""

    pid: int
    files: dict[str, bytes]  # stat, cgroup, comm, cmdline
    links: dict[str, str]  # exe, fd/N
    threads: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # tid: (stat, status)
    dropped: bool = False  # its cmdline was left out

    @property
    def gpu(self) -> bool:
        return any(name.startswith("fd/") for name in self.links)

    @property
    def kernel(self) -> bool:
        return "exe" not in self.links


class Capture:
    """Copies live files into ``dest``; every read failure is a silent skip."""

    def __init__(self, dest: str, src: str = LIVE) -> None:
        self.dest = os.path.abspath(dest)
        self.src = src
        self.files = 0

    # -- primitives ------------------------------------------------------------------------
    def live(self, rel: str) -> str:
        return os.path.join(self.src, rel)

    def out(self, rel: str) -> str:
        return os.path.join(self.dest, rel)

    def read(self, rel: str) -> bytes | None:
        try:
            with open(self.live(rel), "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.live(rel)))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self.live(rel))
        except OSError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        path = self.out(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        self.files += 1

    def symlink(self, rel: str, target: str) -> None:
        path = self.out(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(target, path)
        self.files += 1

    def copy(self, rel: str) -> bytes | None:
        data = self.read(rel)
        if data is not None:
            self.write(rel, data)
        return data

    def mark(self, rel: str) -> None:
        """An entry hostd only lists: an empty plain file."""
        self.write(rel, b"")

    # -- /proc: host-wide files --------------------------------------------------------------
    def mountinfo(self) -> list[str]:
        """Copy the cgroup (and /, /proc, /sys) lines of mountinfo; return the cgroup2 mounts."""
        data = self.read("proc/self/mountinfo")
        if data is None:
            return []
        kept: list[str] = []
        v2: list[str] = []
        for line in data.decode("utf-8", "replace").splitlines():
            left, sep, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if not sep or len(fields) < 5 or not rfields:
                continue
            mount_point = fields[4]
            if rfields[0] in ("cgroup", "cgroup2") or mount_point in MOUNT_POINTS_KEPT:
                kept.append(line)
            if rfields[0] == "cgroup2":
                v2.append(unescape(mount_point))
        self.write("proc/self/mountinfo", ("\n".join(kept) + "\n").encode())
        return v2

    def cgroup_roots(self, v2_mounts: list[str]) -> None:
        for mount_point in v2_mounts:
            self.copy(mount_point.strip("/") + "/cgroup.controllers")

    def hostname(self, override: str | None) -> None:
        if override is not None:
            self.write("proc/sys/kernel/hostname", (override + "\n").encode())
        else:
            self.copy("proc/sys/kernel/hostname")

    def irqs(self) -> None:
        self.copy("proc/interrupts")
        for irq in self.listdir("proc/irq"):
            if irq.isdigit():
                for name in IRQ_FILES:
                    self.copy(f"proc/irq/{irq}/{name}")

    def nvidia_driver(self) -> None:
        for gpu in self.listdir("proc/driver/nvidia/gpus"):
            self.copy(f"proc/driver/nvidia/gpus/{gpu}/information")

    # -- /proc: processes and threads ----------------------------------------------------------
    def process(self, pid: int) -> Proc | None:
        """Everything of one process, read before anything is written (None: it is gone)."""
        base = f"proc/{pid}/"
        stat = self.read(base + "stat")
        if stat is None:
            return None
        files: dict[str, bytes] = {"stat": stat}
        for name in ("cgroup", "comm"):
            data = self.read(base + name)
            if data is not None:
                files[name] = data
        environ = self.read(base + "environ")
        if environ is not None:
            keep = [
                item
                for item in environ.split(b"\0")
                if item.partition(b"=")[0].decode("ascii", "replace") in JOB_VARS
            ]
            files["environ"] = b"".join(item + b"\0" for item in keep)
        cmdline = self.read(base + "cmdline")
        dropped = False
        if cmdline is not None:
            text = cmdline.decode("utf-8", "replace")
            if SENSITIVE.search(text) or ENV_ASSIGNMENT.search(text):
                dropped = True
            else:
                files["cmdline"] = cmdline
        links: dict[str, str] = {}
        exe = self.readlink(base + "exe")
        if exe is not None:
            links["exe"] = exe
        for fd in self.listdir(base + "fd"):
            target = self.readlink(f"{base}fd/{fd}")
            if target is not None and target.startswith(GPU_FD_PREFIXES):
                links[f"fd/{fd}"] = target
        threads: dict[str, tuple[bytes, bytes]] = {}
        for tid in self.listdir(base + "task"):
            if not tid.isdigit():
                continue
            tstat = self.read(f"{base}task/{tid}/stat")
            tstatus = self.read(f"{base}task/{tid}/status")
            if tstat is not None and tstatus is not None:
                threads[tid] = (tstat, tstatus)
        if not threads and self.read(base + "stat") is None:
            return None  # exited while we read it
        return Proc(pid, files, links, threads, dropped)

    def write_process(self, proc: Proc) -> None:
        base = f"proc/{proc.pid}/"
        for name, data in proc.files.items():
            self.write(base + name, data)
        for name, target in proc.links.items():
            self.symlink(base + name, target)
        for tid, (tstat, tstatus) in proc.threads.items():
            self.write(f"{base}task/{tid}/stat", tstat)
            self.write(f"{base}task/{tid}/status", tstatus)

    def processes(self, max_processes: int | None, nvml_pids: set[int]) -> tuple[int, int]:
        """Capture processes; returns (captured, cmdlines dropped)."""
        me = os.getpid() if self.src == LIVE else None
        procs = []
        for entry in self.listdir("proc"):
            if entry.isdigit() and int(entry) != me:
                proc = self.process(int(entry))
                if proc is not None:
                    procs.append(proc)
        if max_processes is not None and len(procs) > max_processes:
            # GPU processes first, then user space, then kernel threads; each by pid.
            def rank(proc: Proc) -> tuple[int, int]:
                gpu = proc.gpu or proc.pid in nvml_pids
                return (0 if gpu else 2 if proc.kernel else 1, proc.pid)

            procs = sorted(procs, key=rank)[:max_processes]
        for proc in procs:
            self.write_process(proc)
        return len(procs), sum(proc.dropped for proc in procs)

    # -- /sys ------------------------------------------------------------------------------
    def cpus(self) -> None:
        base = "sys/devices/system/cpu/"
        for name in ("online", "possible", "present"):
            self.copy(base + name)
        for cpu in self.listdir(base):
            if not _CPU_DIR.match(cpu):
                continue
            for name in CPU_TOPOLOGY:
                self.copy(f"{base}{cpu}/topology/{name}")
            for index in self.listdir(f"{base}{cpu}/cache"):
                if index.startswith("index"):
                    for name in CPU_CACHE:
                        self.copy(f"{base}{cpu}/cache/{index}/{name}")
            for name in CPU_FREQ:
                self.copy(f"{base}{cpu}/cpufreq/{name}")

    def nodes(self) -> None:
        base = "sys/devices/system/node/"
        for name in ("online", "possible"):
            self.copy(base + name)
        for node in self.listdir(base):
            if _NODE_DIR.match(node):
                for name in ("cpulist", "distance", "meminfo"):
                    self.copy(f"{base}{node}/{name}")

    def pci(self) -> None:
        base = "sys/bus/pci/devices/"
        for dev in self.listdir(base):
            for name in PCI_ATTRS:
                self.copy(f"{base}{dev}/{name}")
            for sub in ("msi_irqs", "drm", "accel"):
                for entry in self.listdir(f"{base}{dev}/{sub}"):
                    self.mark(f"{base}{dev}/{sub}/{entry}")

    def net(self) -> None:
        """sys/class/net/IF/device as a relative link to DEST + the live realpath."""
        base = "sys/class/net/"
        for iface in self.listdir(base):
            link = self.live(f"{base}{iface}/device")
            if not os.path.lexists(link):
                continue  # virtual interface
            source = os.path.realpath(self.src).rstrip("/") + "/"
            real = os.path.realpath(link)
            if not real.startswith(source + "sys/"):
                continue
            here = os.path.dirname(self.out(f"{base}{iface}/device"))
            target = self.out(real[len(source) :])
            self.symlink(f"{base}{iface}/device", os.path.relpath(target, here))

    # -- NVML ------------------------------------------------------------------------------
    def nvml(self) -> set[int]:
        """Write nvml.json when NVML answers; return the pids it lists.

        From a fixture tree (``--source``), its nvml.json is copied instead.
        """
        if self.src != LIVE:
            data = self.copy("nvml.json")
            if data is None:
                return set()
            return {int(p["pid"]) for p in json.loads(data).get("processes", [])}
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, repo)
        try:
            from hostd.host.nvml import read_nvml
        except ImportError:
            print("note: hostd is not importable, no nvml.json", file=sys.stderr)
            return set()
        finally:
            sys.path.remove(repo)
        info, why = read_nvml(None)
        if info is None:
            print(f"note: no nvml.json ({why})", file=sys.stderr)
            return set()
        data = json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n"
        self.write("nvml.json", data.encode())
        return set(info.pids)


def prepare(dest: str, force: bool) -> None:
    if os.path.isdir(dest) and os.listdir(dest):
        entries = set(os.listdir(dest))
        if not force:
            sys.exit(f"{dest} is not empty (use --force to replace a fixture tree)")
        if not entries <= {"proc", "sys", "nvml.json"}:
            sys.exit(f"{dest} does not look like a fixture tree ({sorted(entries)}): not removed")
        shutil.rmtree(dest)
    os.makedirs(dest, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", help="folder to write the fixture tree into")
    parser.add_argument("--hostname", help="write this instead of the real hostname")
    parser.add_argument(
        "--max-processes",
        type=int,
        metavar="N",
        help="keep at most N processes (GPU processes first, kernel threads last)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing fixture tree")
    parser.add_argument(
        "--source",
        default=LIVE,
        metavar="ROOT",
        help="read below ROOT instead of / (re-capturing a fixture tree; used by the tests)",
    )
    args = parser.parse_args(argv)

    prepare(args.dest, args.force)
    cap = Capture(args.dest, args.source)
    nvml_pids = cap.nvml()
    cap.cgroup_roots(cap.mountinfo())
    cap.hostname(args.hostname)
    cap.irqs()
    cap.nvidia_driver()
    cap.cpus()
    cap.nodes()
    cap.pci()
    cap.net()
    count, dropped = cap.processes(args.max_processes, nvml_pids)
    print(
        f"captured {count} processes, {cap.files} files into {cap.dest}"
        f" ({dropped} cmdlines left out as possibly sensitive)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

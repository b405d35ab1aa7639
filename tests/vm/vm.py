"""Boot one small multi-NUMA, cgroup-v2 VM and run the inner test tier (tests/vm/inside) in it.

Role: the shared VM code of the VM tier. ``tests/vm/conftest.py`` calls ``run_tier()`` once per
pytest session; ``.ci/run`` calls ``python3 tests/vm/vm.py install`` to get what it needs
(Debian's ``qemu-system-x86`` and ``busybox-static``, and Debian's 6.1 kernel, unpacked into a
git-ignored cache). Standard library only, so it also runs before any venv exists.

The VM (plain QEMU, software emulation: ``-accel tcg,thread=multi -cpu max``): 8 CPUs over 4
NUMA nodes (``NUMA_NODES`` sockets of ``CPUS_PER_NODE`` cores, one node each: CPUs 0-1 on node
0, 2-3 on node 1, 4-5 on node 2, 6-7 on node 3, ``NODE_MEM_MIB`` = 512 MiB each), Debian's
kernel booted with ``cgroup_no_v1=all``, and a small initramfs (static busybox, the virtio/9p
modules, ``/init``). The inner tests read the shape from the live kernel (sysfs), and one of
them checks that it is the one asked for here.
The init mounts this machine's ``/`` read-only over 9p and ``chroot``s into it, so the repo,
the venv and the interpreter sit at the same paths inside as outside; it mounts its own
``/proc``, ``/sys``, ``/dev``, a tmpfs on ``/dev/shm`` (the root is read-only: the guest's
TMPDIR and PYTHONPYCACHEPREFIX are there) and cgroup2 on ``/sys/fs/cgroup``, and a read-write
9p share over the work folder (the same path inside). There it runs ``run.sh`` (written here):
the inner pytest, whose junit report, output and exit status land in the work folder. Then it
powers off.

The cache (``HOSTD_VM_CACHE``, default ``<repo>/.cache/vm``) holds ``vmlinuz``, the modules the
initramfs loads (``modules/NAME.ko`` and ``modules/order``, dependencies first) and
``kernel.txt`` (the Debian package they came from).
"""

from __future__ import annotations

import gzip
import lzma
import os
import platform
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSIDE = "tests/vm/inside"
# Loaded in dependency order (read from each module's .modinfo), so a newer kernel whose
# modules depend on others still boots.
WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
PACKAGES = {"qemu-system-x86_64": "qemu-system-x86", "busybox": "busybox-static"}
KERNEL_META = "linux-image-amd64"
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
# The whole boot, tests included: about 4.5-6 min for the 8-CPU VM on a 2-CPU machine.
BOOT_TIMEOUT_S = float(os.environ.get("HOSTD_VM_TIMEOUT", "900"))
MSIZE = 512 * 1024  # 9p message size: fewer round trips for Python's many small reads
INIT_MARK = "hostd-vm: init started"
# The VM's shape: NUMA_NODES nodes, each one socket of CPUS_PER_NODE CPUs (numbered in order:
# node N holds CPUs N*CPUS_PER_NODE ...) and NODE_MEM_MIB of memory.
NUMA_NODES = 4
CPUS_PER_NODE = 2
NODE_MEM_MIB = 512
VCPUS = NUMA_NODES * CPUS_PER_NODE


class Unavailable(Exception):
    """The VM cannot be booted here (no QEMU, no kernel, not x86-64): the tier skips."""


def cache_dir() -> Path:
    return Path(os.environ.get("HOSTD_VM_CACHE") or REPO / ".cache" / "vm")


# -- ELF: a module's dependencies, a binary's static linking ------------------------------------
def _elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + i * shentsize
        )
        headers.append((name, offset, size))
    _, str_off, str_size = headers[shstrndx]
    names = data[str_off : str_off + str_size]
    sections = {}
    for name, offset, size in headers:
        end = names.index(b"\0", name)
        sections[names[name:end].decode()] = data[offset : offset + size]
    return sections


def module_depends(data: bytes) -> list[str]:
    """The ``depends=`` of a kernel module's .modinfo (what ``modinfo -F depends`` prints)."""
    for entry in _elf_sections(data).get(".modinfo", b"").split(b"\0"):
        if entry.startswith(b"depends="):
            return [d for d in entry[8:].decode().split(",") if d]
    return []


def is_static(path: str) -> bool:
    """True when an ELF executable has no program interpreter (needs no shared libraries)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(
        struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3  # PT_INTERP
        for i in range(phnum)
    )


def _read_module(path: Path) -> bytes:
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(path.read_bytes())
    return path.read_bytes()


def resolve_modules(moddir: Path, wanted: tuple[str, ...] = WANTED_MODULES) -> list[tuple]:
    """[(name, module bytes)] for ``wanted`` and their dependencies, dependencies first.

    ``moddir`` is ``lib/modules/<version>``; modules already built into the kernel (listed in
    its ``modules.builtin``, or simply absent) are skipped.
    """
    files: dict[str, Path] = {}
    for path in moddir.rglob("*.ko*"):
        name = re.sub(r"\.ko(\.xz|\.gz|\.zst)?$", "", path.name).replace("-", "_")
        files[name] = path
    order: list[tuple[str, bytes]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        path = files.get(name)
        if path is None:
            return  # built in
        if path.name.endswith(".zst"):
            raise Unavailable(f"{path.name}: zstd-compressed modules are not supported")
        data = _read_module(path)
        for dep in module_depends(data):
            visit(dep)
        order.append((name, data))

    for name in wanted:
        visit(name)
    return order


# -- install (for .ci/run) ------------------------------------------------------------------
def _apt(*args: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "-q", "-y", *args], check=True, env=env, stdout=subprocess.DEVNULL)


def _kernel_package() -> str:
    """The Debian kernel package the ``linux-image-amd64`` meta package points at."""
    out = subprocess.run(
        ["apt-cache", "depends", KERNEL_META], check=True, capture_output=True, text=True
    ).stdout
    m = re.search(r"Depends: (linux-image-\S+-amd64)\b", out)
    if not m:
        raise Unavailable(f"apt-cache depends {KERNEL_META} names no kernel package")
    return m.group(1)


def install(cache: Path) -> None:
    """Install QEMU and busybox (Debian packages) and unpack Debian's kernel into ``cache``."""
    missing = sorted({pkg for cmd, pkg in PACKAGES.items() if not _find_command(cmd)})
    busybox = _find_command("busybox")
    if busybox and not is_static(busybox):
        missing.append(PACKAGES["busybox"])  # replaces Debian's dynamically linked busybox
    if missing:
        try:
            _apt("install", "--no-install-recommends", *missing)
        except subprocess.CalledProcessError:
            _apt("update")  # stale package lists on a fresh machine
            _apt("install", "--no-install-recommends", *missing)
    if (cache / "vmlinuz").exists() and (cache / "modules" / "order").exists():
        print(f"vm: kernel cached in {cache} ({(cache / 'kernel.txt').read_text().strip()})")
        return
    package = _kernel_package()
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hostd-vm-kernel-") as tmp:
        # As root (no drop to _apt, which could not write into this private folder).
        apt = ["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", package]
        subprocess.run(apt, cwd=tmp, check=True)
        (deb,) = Path(tmp).glob("*.deb")
        root = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (vmlinuz,) = (root / "boot").glob("vmlinuz-*")
        (moddir,) = (root / "lib" / "modules").iterdir()
        staging = Path(tempfile.mkdtemp(prefix=".vm-", dir=cache.parent))
        staging.chmod(0o755)
        (staging / "modules").mkdir()
        shutil.copyfile(vmlinuz, staging / "vmlinuz")
        names = []
        for name, data in resolve_modules(moddir):
            (staging / "modules" / f"{name}.ko").write_bytes(data)
            names.append(name)
        (staging / "modules" / "order").write_text("\n".join(names) + "\n")
        (staging / "kernel.txt").write_text(f"{deb.name}\n")
        if cache.exists():
            shutil.rmtree(cache)
        staging.rename(cache)
    print(f"vm: kernel {deb.name} unpacked into {cache} (modules: {' '.join(names)})")


# -- what the boot needs ------------------------------------------------------------------
@dataclass(frozen=True)
class Prereqs:
    qemu: str
    busybox: str
    kernel: Path
    modules: Path  # folder with NAME.ko and order
    accel: str


def _find_command(name: str) -> str | None:
    if name == "busybox":
        return next((p for p in BUSYBOX_PATHS if os.access(p, os.X_OK)), None)
    return shutil.which(name)


def find_prereqs() -> Prereqs:
    """What the boot needs, or Unavailable with the reason it cannot happen here."""
    if platform.machine() != "x86_64":
        raise Unavailable(f"the VM tier boots an x86-64 kernel; this is {platform.machine()}")
    if os.environ.get("HOSTD_VM", "1") == "0":
        raise Unavailable("HOSTD_VM=0")
    qemu = _find_command("qemu-system-x86_64")
    if qemu is None:
        raise Unavailable("no qemu-system-x86_64 (`python3 tests/vm/vm.py install` gets it)")
    busybox = _find_command("busybox")
    if busybox is None:
        raise Unavailable("no busybox (Debian: busybox-static; `tests/vm/vm.py install`)")
    if not is_static(busybox):
        raise Unavailable(f"{busybox} is dynamically linked: install busybox-static")
    cache = cache_dir()
    kernel, modules = cache / "vmlinuz", cache / "modules"
    if not kernel.exists() or not (modules / "order").exists():
        raise Unavailable(f"no kernel in {cache} (`python3 tests/vm/vm.py install` unpacks one)")
    accel = os.environ.get("HOSTD_VM_ACCEL", "tcg")
    if accel == "tcg":
        # Software emulation: KVM on the CI machines runs only specially built guest kernels.
        accel = "tcg,thread=multi"
    return Prereqs(qemu, busybox, kernel, modules, accel)


# -- the initramfs ---------------------------------------------------------------------------
INIT = r"""#!/bin/busybox sh
# The VM's init (tests/vm/vm.py): mount this machine's / read-only, chroot, run run.sh, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "hostd-vm: init started at $(cut -d' ' -f1 /proc/uptime) s"
for x in $(cat /proc/cmdline); do
  case "$x" in hostd.work=*) WORK="${x#hostd.work=}" ;; esac
done
for m in $(cat /modules/order); do
  insmod "/modules/$m.ko" || echo "hostd-vm: insmod $m failed"
done
R=/newroot
O="trans=virtio,version=9p2000.L,msize=@MSIZE@"
if mount -t 9p -o "$O,ro,cache=loose" hostroot $R \
  && mount -t proc proc $R/proc && mount -t sysfs sysfs $R/sys \
  && mount -t devtmpfs devtmpfs $R/dev && mkdir -p $R/dev/shm \
  && mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm \
  && mount -t cgroup2 cgroup2 $R/sys/fs/cgroup \
  && mount -t 9p -o "$O" work "$R$WORK"; then
  cut -d' ' -f1 /proc/uptime > "$R$WORK/uptime.start"
  echo "hostd-vm: running $WORK/run.sh"
  chroot $R /bin/sh "$WORK/run.sh"
  cut -d' ' -f1 /proc/uptime > "$R$WORK/uptime.end"
  sync
  umount "$R$WORK"
else
  echo "hostd-vm: mounting the shares failed"
fi
echo "hostd-vm: powering off"
poweroff -f
"""


def _cpio_entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> bytes:
    """One entry of a "newc" cpio archive (Documentation/driver-api/early-userspace)."""
    encoded = name.encode() + b"\0"
    fields = (1, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0)
    header = b"070701" + b"".join(b"%08X" % f for f in fields)
    out = header + encoded
    out += b"\0" * (-len(out) % 4)
    out += data + b"\0" * (-len(data) % 4)
    return out


def build_initramfs(path: Path, busybox: str, modules: Path) -> None:
    order = modules.joinpath("order").read_text().split()
    parts = [_cpio_entry(d, stat.S_IFDIR | 0o755) for d in ("bin", "dev", "proc", "sys")]
    parts += [_cpio_entry(d, stat.S_IFDIR | 0o755) for d in ("newroot", "modules")]
    parts.append(_cpio_entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    parts.append(_cpio_entry("bin/busybox", stat.S_IFREG | 0o755, Path(busybox).read_bytes()))
    init = INIT.replace("@MSIZE@", str(MSIZE)).encode()
    parts.append(_cpio_entry("init", stat.S_IFREG | 0o755, init))
    parts.append(_cpio_entry("modules/order", stat.S_IFREG | 0o644, "\n".join(order).encode()))
    for name in order:
        data = (modules / f"{name}.ko").read_bytes()
        parts.append(_cpio_entry(f"modules/{name}.ko", stat.S_IFREG | 0o644, data))
    parts.append(_cpio_entry("TRAILER!!!", 0))
    path.write_bytes(b"".join(parts))


# -- boot and run -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TierRun:
    """What one boot produced. ``rc`` is the inner pytest's exit status (None: it never ran)."""

    work: Path
    rc: int | None
    console: str
    qemu_rc: int | None
    wall_s: float
    boot_s: float | None  # guest uptime when the tests started (kernel + init + mounts)
    tests_s: float | None  # guest time spent in run.sh

    @property
    def junit(self) -> Path:
        return self.work / "junit.xml"

    @property
    def log(self) -> str:
        path = self.work / "pytest.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _run_script(work: Path, args: list[str], command: list[str] | None = None) -> str:
    """run.sh: the inner pytest, with the outer interpreter (its venv is visible read-only);
    ``command``: that command instead (``vm.py exec``), its output in the same log."""
    python = shlex.quote(sys.executable)
    venv_bin = shlex.quote(str(Path(sys.executable).parent))
    repo, log, rc = (shlex.quote(str(p)) for p in (REPO, work / "pytest.log", work / "rc"))
    pytest_args = " ".join(
        shlex.quote(arg)
        for arg in [
            *("-p", "no:cacheprovider", "-p", "no:hypothesispytest"),
            *("-o", "addopts=", "-o", "junit_logging=all", "-v", "-rA"),
            f"--junitxml={work}/junit.xml",
            f"--rootdir={REPO}",
            *args,
        ]
    )
    inner = f"{python} -m pytest {pytest_args}"
    if command is not None:
        inner = " ".join(shlex.quote(word) for word in command)
    return f"""#!/bin/sh
# Written by tests/vm/vm.py; runs inside the VM, chrooted into this machine's read-only /.
export HOSTD_IN_VM=1 TMPDIR=/dev/shm HOME=/dev/shm
# The root is read-only: bytecode is compiled once per boot into the tmpfs (not once per process).
export PYTHONPYCACHEPREFIX=/dev/shm/pycache
unset PYTHONDONTWRITEBYTECODE
export PATH={venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PYTHONPATH={repo}
cd {repo}
{inner} > {log} 2>&1
echo $? > {rc}
"""


def extra_args() -> list[str]:
    """More inner pytest arguments from ``HOSTD_VM_PYTEST_ARGS`` (e.g. "-k numa")."""
    return shlex.split(os.environ.get("HOSTD_VM_PYTEST_ARGS", ""))


def numa_args() -> list[str]:
    """One memory backend per node, then the nodes: node N gets CPUs N*CPUS_PER_NODE and on."""
    memory, nodes = [], []
    for n in range(NUMA_NODES):
        first, last = n * CPUS_PER_NODE, (n + 1) * CPUS_PER_NODE - 1
        memory += ["-object", f"memory-backend-ram,id=m{n},size={NODE_MEM_MIB}M"]
        nodes += ["-numa", f"node,nodeid={n},cpus={first}-{last},memdev=m{n}"]
    return memory + nodes


def qemu_command(pre: Prereqs, work: Path, initramfs: Path) -> list[str]:
    share = "security_model=none,multidevs=remap"
    append = f"console=ttyS0 panic=-1 quiet cgroup_no_v1=all hostd.work={work}"
    return [
        pre.qemu,
        "-nodefaults",
        "-no-user-config",
        "-display", "none",
        "-no-reboot",
        "-accel", pre.accel,
        "-cpu", "max",
        "-smp", f"{VCPUS},sockets={NUMA_NODES},cores={CPUS_PER_NODE},threads=1",
        "-m", f"{NUMA_NODES * NODE_MEM_MIB}M",
        *numa_args(),
        "-kernel", str(pre.kernel),
        "-initrd", str(initramfs),
        "-append", append,
        "-serial", f"file:{work}/console.log",
        "-fsdev", f"local,id=hostroot,path=/,readonly=on,{share}",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=work,path={work},{share}",
        "-device", "virtio-9p-pci,fsdev=work,mount_tag=work",
    ]  # fmt: skip


def _float(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def run_tier(
    work: Path,
    args: list[str] | None = None,
    timeout: float = BOOT_TIMEOUT_S,
    command: list[str] | None = None,
) -> TierRun:
    """Boot the VM once and run the inner tier in it. Raises Unavailable if it cannot boot here.

    ``work`` must be an empty folder that is visible at the same path through this machine's
    ``/`` (not below /proc, /sys, /dev): the guest mounts it read-write over that path.
    """
    pre = find_prereqs()
    work = work.resolve()
    # The guest mounts its own /proc, /sys and /dev: what lies below them here is hidden there.
    for what, path in (("work folder", work), ("repo", REPO), ("interpreter", sys.prefix)):
        if any(str(path).startswith(top) for top in ("/proc/", "/sys/", "/dev/")):
            raise Unavailable(f"the {what} {path} would be hidden inside the VM")
    if re.search(r"[\s,]", str(work)):
        raise Unavailable(
            f"the work folder {work!r} has a blank or a comma (QEMU, kernel command line)"
        )
    (work / "run.sh").write_text(_run_script(work, args or [INSIDE, *extra_args()], command))
    initramfs = work / "initramfs.cpio"
    build_initramfs(initramfs, pre.busybox, pre.modules)
    cmd = qemu_command(pre, work, initramfs)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
        qemu_rc, qemu_err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        qemu_rc, qemu_err = None, f"timed out after {timeout:.0f} s: {err or ''}"
    except OSError as exc:
        raise Unavailable(f"{pre.qemu} did not start: {exc}") from None
    wall = time.monotonic() - started
    console_path = work / "console.log"
    console = console_path.read_text(errors="replace") if console_path.exists() else ""
    if INIT_MARK not in console:
        # QEMU refused to start, or the kernel never reached the init: not a hostd failure.
        tail = "\n".join((qemu_err or console).strip().splitlines()[-15:])
        raise Unavailable(f"the VM did not boot (qemu exit {qemu_rc}): {tail}")
    rc_text = (work / "rc").read_text().strip() if (work / "rc").exists() else ""
    start = _float(work / "uptime.start")
    end = _float(work / "uptime.end")
    return TierRun(
        work=work,
        rc=int(rc_text) if rc_text.isdigit() else None,
        console=console + (f"\n[qemu stderr]\n{qemu_err}" if qemu_err else ""),
        qemu_rc=qemu_rc,
        wall_s=wall,
        boot_s=start,
        tests_s=None if start is None or end is None else end - start,
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        try:
            install(Path(argv[1]) if len(argv) > 1 else cache_dir())
        except (OSError, subprocess.CalledProcessError, Unavailable, ValueError) as exc:
            print(f"vm: install failed, the VM tier will skip: {exc}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["run"]:  # boot by hand: python3 tests/vm/vm.py run [inner pytest args]
        work = Path(tempfile.mkdtemp(prefix="hostd-vm-"))
        result = run_tier(work, [INSIDE, *argv[1:]])
        print(result.log or result.console)
        print(f"vm: wall {result.wall_s:.1f} s, boot {result.boot_s} s, tests {result.tests_s} s")
        return 1 if result.rc is None else result.rc
    if argv[:1] == ["exec"] and len(argv) > 1:  # any command inside: vm.py exec python bench/..
        work = Path(tempfile.mkdtemp(prefix="hostd-vm-"))
        timeout = float(os.environ.get("HOSTD_VM_TIMEOUT", 3600))
        result = run_tier(work, command=argv[1:], timeout=timeout)
        print(result.log or result.console)
        return 1 if result.rc is None else result.rc
    print("usage: vm.py install [CACHE] | run [PYTEST ARGS] | exec COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

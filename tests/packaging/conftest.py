"""Fixtures of the packaging tier: the deb, the rpm, a clean Debian 12 root and the image.

The builds (packaging/build-deb.sh, build-rpm.sh, build-image.sh) and the debootstrap of a clean
Debian 12 root run in the background, side by side, from the first test of this folder (only
those the selected tests need), so the tier takes about as long as its slowest chain of builds;
each is built once per run. A fixture waits for its own and skips with the reason when a tool or
a network service it needs is missing here, or fails with the end of the build's log when the
build itself fails. The Debian root is cached in .cache/packaging/ (git-ignored); a clean clone
builds it from scratch. The build durations are printed at the end of the session.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import hostd

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
CACHE = REPO / ".cache" / "packaging"
VERSION = hostd.__version__
MIRROR = os.environ.get("HOSTD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PYPI = "https://pypi.org/simple/"
SUITE = "bookworm"
# python3: the rpm's virtual environment needs /usr/bin/python3.11 in the root it is installed
# into (the deb pulls it in by itself, through its Depends).
ROOT_INCLUDE = ("python3",)
BASE_IMAGE = "docker.io/library/debian:12-slim"
BUILD_TIMEOUT = 900
# What a chrooted command sees: no host PATH (pyenv shims, venvs), a wide terminal for rich.
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "COLUMNS": "160",
    "DEBIAN_FRONTEND": "noninteractive",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def debian_version(version: str) -> str:
    """hostd's version as build-deb.sh writes it into debian/changelog (1.0rc1 -> 1.0~rc1-1)."""
    return re.sub(r"\.?(a|b|rc|dev)(\d+)$", r"~\1\2", version) + "-1"


def rpm_version(version: str) -> str:
    """hostd's version as build-rpm.sh passes it to the spec (1.0rc1 -> 1.0~rc1)."""
    return re.sub(r"\.?(a|b|rc|dev)(\d+)$", r"~\1\2", version)


# -- what this machine has ------------------------------------------------------------------


def missing_tools(tools: dict[str, str]) -> str | None:
    """A skip reason naming the Debian packages of the tools that are not installed, or None."""
    lacking = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    if lacking:
        return f"not installed: {', '.join(lacking)} (apt-get install {' '.join(lacking)})"
    return None


_reach_lock = threading.Lock()
_reach: dict[str, str | None] = {}


def unreachable(url: str) -> str | None:
    """Why ``url``'s host cannot be reached (a TCP connection within 10 s), or None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with _reach_lock:
        if url not in _reach:
            try:
                socket.create_connection((host, port), timeout=10).close()
                _reach[url] = None
            except OSError as exc:
                _reach[url] = f"{host}:{port} unreachable from this machine ({exc})"
        return _reach[url]


def not_root() -> str | None:
    return None if os.geteuid() == 0 else "needs root (chroot, mount, debootstrap, buildah)"


def pip_cert() -> str | None:
    """The CA bundle pip is configured with here (a TLS-intercepting proxy's), if any."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return value
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.cert"],
        capture_output=True,
        text=True,
        check=False,
    )
    value = proc.stdout.strip()
    return value if proc.returncode == 0 and value and Path(value).is_file() else None


# -- running things ---------------------------------------------------------------------------


def run_logged(cmd: list[str], log: Path, timeout: float = BUILD_TIMEOUT, **kw):
    """Run ``cmd`` with stdout and stderr appended to ``log``; return the CompletedProcess."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        return subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=out, text=True, timeout=timeout, check=False, **kw
        )


def log_tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(text[-lines:])


def in_root(root: Path, *cmd: str, check: bool = True, timeout: float = 300):
    """Run ``cmd`` chrooted into ``root``; on ``check``, fail the test with its output."""
    proc = subprocess.run(
        ["chroot", str(root), *cmd],
        env=CHROOT_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"chroot {root} {' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def mounts_under(root: Path) -> list[str]:
    out = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True
    ).stdout
    prefix = str(root).rstrip("/") + "/"
    return [line for line in out.splitlines() if line.startswith(prefix)]


@contextlib.contextmanager
def host_fs(root: Path) -> Iterator[Path]:
    """/proc (a procfs of this pid namespace) and the host's /sys, mounted into ``root``.

    /sys is bound recursively (cgroupfs lives under it) and made a slave, so that unmounting
    the copy never propagates to the host's mounts. Everything is unmounted on the way out,
    and the test fails if anything is left mounted under ``root``.
    """
    proc, sysfs = root / "proc", root / "sys"
    try:
        subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)
        subprocess.run(["mount", "--rbind", "/sys", str(sysfs)], check=True)
        subprocess.run(["mount", "--make-rslave", str(sysfs)], check=True)
        yield root
    finally:
        subprocess.run(["umount", "-R", str(sysfs)], check=False)
        subprocess.run(["umount", str(proc)], check=False)
        left = mounts_under(root)
        if left:
            for target in sorted(left, reverse=True):
                subprocess.run(["umount", "-l", target], check=False)
            pytest.fail(f"left mounted under {root} (now lazily unmounted): {left}")


def check_installed_hostd(root: Path) -> None:
    """The hostd installed in ``root`` works there: the shipped policy, its version, a policy
    check, a plan (table and JSON) and doctor, with /proc and /sys mounted."""
    shipped = (REPO / "hostd" / "policy" / "training.toml").read_bytes()
    assert (root / "etc/hostd/policy.toml").read_bytes() == shipped
    with host_fs(root):
        assert in_root(root, "hostd", "--version").stdout.strip() == f"hostd {VERSION}"
        check = in_root(root, "hostd", "policy", "check", "/etc/hostd/policy.toml")
        assert "/etc/hostd/policy.toml: ok" in check.stdout
        plan = in_root(root, "hostd", "plan")
        assert "policy training" in plan.stdout, plan.stdout
        plan_json = in_root(root, "hostd", "plan", "--json")
        assert plan_json.stdout.lstrip().startswith("{")
        doctor = in_root(root, "hostd", "doctor", check=False)
        assert "Traceback" not in doctor.stderr, doctor.stderr
        assert "proc connector" in doctor.stdout
        # the shell completion asks the installed hostd what completes
        words = in_root(
            root, "env", "_HOSTD_COMPLETE=complete_bash", "COMP_WORDS=hostd pol", "COMP_CWORD=1",
            "hostd",
        ).stdout.split()  # fmt: skip
        assert words == ["policy"], words
    man = next(p for p in (root / "usr/share/man/man1").glob("hostd.1*"))
    page = gzip.decompress(man.read_bytes()) if man.suffix == ".gz" else man.read_bytes()
    assert b".SH COMMANDS" in page and b"hostd policy check" in page
    completions = (root / "usr/share/bash-completion/completions/hostd").read_text()
    assert "_HOSTD_COMPLETE=complete_bash" in completions


@contextlib.contextmanager
def root_copy(base: Path, where: Path) -> Iterator[Path]:
    """A private, writable copy of the cached Debian root, to install a package into.

    An overlay mount over the cache (instant, and the cache stays untouched); a plain copy
    where overlayfs cannot be mounted. Unmounted and removed on the way out.
    """
    root, upper, work = where / "root", where / "upper", where / "work"
    for d in (root, upper, work):
        d.mkdir(parents=True)
    options = f"lowerdir={base},upperdir={upper},workdir={work}"
    overlay = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(root)],
        capture_output=True,
        check=False,
    )
    if overlay.returncode != 0:
        root.rmdir()
        subprocess.run(["cp", "-a", "--", str(base), str(root)], check=True)
    try:
        yield root
    finally:
        if overlay.returncode == 0:
            subprocess.run(["umount", str(root)], check=False)
        left = mounts_under(where)
        if left:
            pytest.fail(f"not removing {where}: still mounted: {left}")
        shutil.rmtree(where, ignore_errors=True)


# -- the background builds --------------------------------------------------------------------


@dataclass
class Built:
    """What a background job produced, or why it did not."""

    path: Path | None = None
    skip: str | None = None
    error: str | None = None
    seconds: float = 0.0
    note: str = ""
    extra: dict = field(default_factory=dict)

    def get(self) -> Path:
        """The product; skips or fails the calling test when there is none."""
        if self.skip:
            pytest.skip(self.skip)
        if self.error:
            pytest.fail(self.error, pytrace=False)
        assert self.path is not None
        return self.path


def _timed(job: Callable[[Builds], Built]) -> Callable[[Builds], Built]:
    def wrapper(builds: Builds) -> Built:
        started = time.monotonic()
        try:
            result = job(builds)
        except subprocess.TimeoutExpired as exc:
            result = Built(error=f"{job.__name__}: timed out after {exc.timeout:.0f} s")
        result.seconds = time.monotonic() - started
        return result

    wrapper.__name__ = job.__name__
    return wrapper


# The deb and the rpm are not on the critical path (debootstrap, then the image on it, is):
# they yield the CPU and the disk to it.
BACKGROUND = ["nice", "-n", "10", "ionice", "-c", "2", "-n", "7"]


def _build_script(script: str, out: Path, log: Path, env: dict | None = None) -> Built:
    proc = run_logged([*BACKGROUND, str(PACKAGING / script), str(out)], log, env=env)
    if proc.returncode != 0:
        return Built(
            error=f"{script} failed (exit {proc.returncode}); end of {log}:\n{log_tail(log)}"
        )
    path = Path(proc.stdout.strip().splitlines()[-1])
    if not path.is_file():
        return Built(error=f"{script} printed {path}, which is not a file")
    return Built(path=path)


@_timed
def job_deb(builds: Builds) -> Built:
    why = missing_tools(
        {"dpkg-buildpackage": "dpkg-dev", "dh": "debhelper", "dh_virtualenv": "dh-virtualenv"}
    ) or unreachable(PYPI)
    if why:
        return Built(skip=f"deb: {why}")
    venv = subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, venv"], check=False)
    if venv.returncode != 0:
        return Built(skip="deb: Debian's python3 has no venv (apt-get install python3-venv)")
    return _build_script("build-deb.sh", builds.dir / "deb", builds.dir / "deb.log")


@_timed
def job_rpm(builds: Builds) -> Built:
    why = missing_tools({"rpmbuild": "rpm"}) or unreachable(PYPI)
    if why:
        return Built(skip=f"rpm: {why}")
    return _build_script("build-rpm.sh", builds.dir / "rpm", builds.dir / "rpm.log")


@_timed
def job_bookworm(builds: Builds) -> Built:
    """A minimal Debian 12 root (debootstrap --variant=minbase), cached across sessions."""
    why = not_root() or missing_tools({"debootstrap": "debootstrap", "chroot": "coreutils"})
    if why:
        return Built(skip=f"Debian 12 root: {why}")
    key = f"{SUITE} minbase include={','.join(ROOT_INCLUDE)}\n"
    root = CACHE / SUITE
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        stamp = root / ".hostd-cache-key"
        if stamp.is_file() and stamp.read_text() == key:
            return Built(path=root, note="cached")
        why = unreachable(MIRROR)
        if why:
            return Built(skip=f"Debian 12 root: no debootstrap: {why}")
        shutil.rmtree(root, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{SUITE}.", dir=CACHE))
        log = builds.dir / "debootstrap.log"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_INCLUDE)}"]
        proc = run_logged([*cmd, SUITE, str(tmp), MIRROR], log)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            return Built(error=f"debootstrap failed; end of {log}:\n{log_tail(log)}")
        run_logged(["chroot", str(tmp), "apt-get", "clean"], log)
        (tmp / ".hostd-cache-key").write_text(key)
        tmp.rename(root)
        return Built(path=root, note="debootstrapped")


def _local_base(builds: Builds, buildah: list[str], log: Path) -> tuple[str | None, str]:
    """A base image made of the Debian 12 root, where no registry serves debian:12-slim."""
    root = builds.get("bookworm")
    if root.path is None:
        return None, root.skip or root.error or "no Debian 12 root"
    made = run_logged([*buildah, "from", "scratch"], log)
    ctr = made.stdout.strip()
    mounted = run_logged([*buildah, "mount", ctr], log)
    mnt = mounted.stdout.strip()
    if made.returncode or mounted.returncode or not mnt:
        return None, f"buildah could not make a scratch container; see {log}"
    # Like the slim image: no documentation, locales or downloaded packages.
    excludes = ["./usr/share/doc/*", "./usr/share/man/*", "./usr/share/locale/*"]
    excludes += ["./var/cache/apt/archives/*.deb", "./var/lib/apt/lists/*", "./.hostd-cache-key"]
    pack = subprocess.Popen(
        ["tar", "-C", str(root.path), *(f"--exclude={e}" for e in excludes), "-cf", "-", "."],
        stdout=subprocess.PIPE,
    )
    subprocess.run(["tar", "-C", mnt, "-xf", "-"], stdin=pack.stdout, check=True)
    pack.wait()
    run_logged([*buildah, "umount", ctr], log)
    tag = "localhost/hostd-test-base:bookworm"
    if run_logged([*buildah, "commit", "--rm", "-q", ctr, tag], log).returncode != 0:
        return None, f"committing the base image failed; see {log}"
    return tag, ""


@_timed
def job_image(builds: Builds) -> Built:
    why = (
        not_root()
        or missing_tools({"buildah": "buildah"})
        or unreachable(PYPI)
        or unreachable(MIRROR)
    )
    if why:
        return Built(skip=f"image: {why}")
    storage = builds.dir / "containers"
    buildah = ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run")]
    buildah += ["--storage-driver", "vfs"]
    log = builds.dir / "image.log"
    pull = run_logged([*buildah, "pull", "-q", BASE_IMAGE], log, timeout=300)
    if pull.returncode == 0:
        base, note = BASE_IMAGE, f"base {BASE_IMAGE}"
    else:
        # buildah's last line ends with the cause: "...: lookup HOST on DNS: no such host".
        why = ": ".join(log_tail(log, 1).strip().split(": ")[-2:])
        base, reason = _local_base(builds, buildah, log)
        if base is None:
            return Built(skip=f"image: {BASE_IMAGE} cannot be pulled ({why}) and {reason}")
        note = (
            f"{BASE_IMAGE} cannot be pulled here ({why}); built on a local Debian 12 "
            "minbase root instead"
        )
    tag = f"localhost/hostd:{VERSION}"
    env = dict(os.environ, BASE=base, TAG=tag)
    cert = pip_cert()
    if cert:
        env["PIP_CERT"] = cert
    script = [str(PACKAGING / "build-image.sh"), *buildah[1:], "--isolation", "chroot"]
    proc = run_logged(script, log, env=env)
    if proc.returncode != 0:
        return Built(error=f"build-image.sh failed; end of {log}:\n{log_tail(log)}")
    return Built(path=storage, note=note, extra={"buildah": buildah, "tag": tag})


JOBS: dict[str, Callable[[Builds], Built]] = {
    "deb": job_deb,
    "rpm": job_rpm,
    "bookworm": job_bookworm,
    "image": job_image,
}
# Which job each fixture waits for.
FIXTURE_JOBS = {"deb": "deb", "rpm": "rpm", "bookworm_root": "bookworm", "image": "image"}


class Builds:
    """The session's background jobs; ``get(name)`` starts one if needed and waits for it."""

    def __init__(self, directory: Path):
        self.dir = directory
        self._pool = ThreadPoolExecutor(max_workers=len(JOBS), thread_name_prefix="packaging")
        self._futures: dict[str, Future[Built]] = {}
        self._lock = threading.Lock()

    def start(self, name: str) -> None:
        with self._lock:
            if name not in self._futures:
                self._futures[name] = self._pool.submit(JOBS[name], self)

    def get(self, name: str) -> Built:
        self.start(name)
        return self._futures[name].result()

    def summary(self) -> list[str]:
        lines = []
        for name, future in self._futures.items():
            if not future.done():
                continue
            built = future.result()
            state = "skipped" if built.skip else "FAILED" if built.error else "ok"
            note = f" ({built.note})" if built.note else ""
            lines.append(f"{name:9} {built.seconds:6.1f} s  {state}{note}")
        return lines

    def close(self) -> None:
        self._pool.shutdown(wait=True)


_session_builds: Builds | None = None


@pytest.fixture(scope="package")
def builds(tmp_path_factory, request) -> Iterator[Builds]:
    global _session_builds
    directory = tmp_path_factory.mktemp("packaging")
    _session_builds = Builds(directory)
    # Start every job the selected tests will need, now, so that they run side by side.
    wanted = set()
    here = Path(__file__).parent
    for item in request.session.items:
        if here not in Path(item.path).parents:
            continue
        for name in getattr(item, "fixturenames", ()):
            if name in FIXTURE_JOBS:
                wanted.add(FIXTURE_JOBS[name])
    for name in sorted(wanted):
        _session_builds.start(name)
    yield _session_builds
    _session_builds.close()
    shutil.rmtree(directory / "containers", ignore_errors=True)


@pytest.fixture(scope="package", autouse=True)
def _start_builds(builds) -> None:
    """Start the background builds as soon as the first packaging test runs.

    Package-scoped: every build has finished (and its storage is removed) before the next tier
    of the test suite starts, so none of them competes with timing-sensitive tests.
    """


@pytest.fixture(scope="package")
def deb(builds) -> Path:
    return builds.get("deb").get()


@pytest.fixture(scope="package")
def rpm(builds) -> Path:
    return builds.get("rpm").get()


@pytest.fixture(scope="package")
def bookworm_root(builds) -> Path:
    return builds.get("bookworm").get()


@pytest.fixture(scope="package")
def image(builds) -> Built:
    built = builds.get("image")
    built.get()
    return built


def pytest_terminal_summary(terminalreporter) -> None:
    if _session_builds is not None and _session_builds.summary():
        terminalreporter.section("packaging builds (in the background, side by side)")
        for line in _session_builds.summary():
            terminalreporter.write_line(line)

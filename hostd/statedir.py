"""hostd's own folders (the run dir, the state dir) and the files in them, safe from other users.

The agent runs as root; its folders must not be a way for another user to make it write where
it should not. A folder is created with the given mode, or, when it exists, used only if it is
a real folder (not a symlink) owned by the user hostd runs as and not writable by group or
others (``UnsafeDir`` otherwise, with what is wrong). Files in it are opened relative to the
folder's fd with ``O_NOFOLLOW``, and replaced atomically (a fresh temporary name, created
exclusively, then renamed over), so a link planted under a name hostd uses is never followed.

One hostd per host: every agent and every ``hostd restore`` holds ``HOST_LOCK`` (``/run`` is
root's), whatever run and state dirs they were given; the second one refuses. A sidecar runs in
its own container, whose ``/run`` is its own: sidecars lock per pod and never touch host-wide
knobs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
from pathlib import Path


class UnsafeDir(Exception):
    """A folder hostd would write in that another user could subvert."""


def open_dir(path: str | Path, mode: int = 0o755) -> int:
    """An fd of folder ``path`` (created with ``mode`` if missing, parents 0755), checked."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
            os.chmod(path, mode)  # whatever the umask took away
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeDir(f"{path}: not a folder hostd can use ({exc.strerror})") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"owned by uid {st.st_uid}, not {os.geteuid()}"
    elif st.st_mode & 0o022:
        problem = f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        os.close(fd)
        raise UnsafeDir(f"{path}: {problem}: another user could make hostd write elsewhere")
    return fd


def write_atomic(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``name`` in the folder with ``data``: a new temporary file, then a rename."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)  # ours, from a crash; a planted link is only unlinked
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of ``name`` in the folder, never through a symlink."""
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def owned_file(path: str | Path) -> bool:
    """``path`` is a regular file (not a link) owned by the user hostd runs as."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


HOST_LOCK = "/run/hostd.lock"
DEFAULT_STATE_DIR = "/var/lib/hostd"  # the journal
DEFAULT_RUN_DIR = "/run/hostd"  # pid, status and switch files


class Locked(Exception):
    """Another hostd holds the host: ``pid`` is its process (0: unknown)."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.pid = pid


def lock_host(path: str = HOST_LOCK) -> int:
    """Hold the host-wide lock (one agent, or one restore, per host, whatever their run and
    state dirs) until the returned fd is closed, or raise ``Locked``. The lock lives in a
    root-only folder, so no other user can take it first. Where that folder cannot hold it
    (a read-only /run), an abstract socket name holds the lock instead (per network
    namespace; any user could take that name first, so it is only the fallback)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.ENOENT):
            raise
        return _lock_socket()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise Locked(int(text) if text.isdigit() else 0) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_socket() -> int:
    """The lock as a listening abstract socket: its name is free again when the process exits;
    a second taker learns the holder's pid from the socket's peer credentials."""
    name = b"\0hostd.lock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(name)
        sock.listen(1)
    except OSError:
        sock.close()
        pid = 0
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(name)
            cred = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", cred)[0]
        raise Locked(pid) from None
    return sock.detach()

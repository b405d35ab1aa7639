"""Kernel files below a root: read, list, write, make and remove them; ``HostFiles``, the base of
``hostd.host.Host``.

Every path is relative to the host's root ("proc/1/stat"), so the same calls read the live
machine or a fixture tree. Reads use ``os.open`` + ``os.read`` (cheaper than ``open()``, see
FACTS.md) and turn errno values into the domain errors of ``hostd.host.errors``; a file that
vanished reads as ``None``, never as an exception. Writes are unbuffered, so the kernel's refusal
surfaces at the write.

Callers: ``Host`` (``hostd.host``) inherits it, through ``HostThreads`` (``hostd.host.threads``);
everything else reaches it as ``Host``'s methods.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat

from hostd.host import paths
from hostd.host.errors import Gone, HostError, from_oserror

_READ_CHUNK = 4096
_O_READ = os.O_RDONLY | os.O_CLOEXEC


class HostFiles:
    """Files below ``root``: the generic access every reader builds on. ``Host.__init__`` sets
    the attributes named here."""

    root: str  # "/" for the live machine, an absolute folder for a fixture tree
    _prefix: str  # root ending in one "/": put before every relative path

    # -- generic access ---------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """True when this reads the running kernel rather than a fixture tree."""
        return self.root == "/"

    def path(self, rel: str) -> str:
        """The absolute path of ``rel`` ("proc/1/stat") below this host's root."""
        return self._prefix + rel.lstrip("/")

    def read(self, rel: str) -> str | None:
        """The whole text of a file, or None if it (or its task) does not exist.

        Raises NotPermitted on EPERM/EACCES and HostError for anything unexpected.
        """
        data = self.read_bytes(rel)
        return None if data is None else data.decode("utf-8", "replace")

    def read_bytes(self, rel: str) -> bytes | None:
        """``read``, undecoded (a process's environment: searched as bytes, never decoded
        whole)."""
        # The hot path of a scan (once per thread): kept lean on purpose.
        path = self._prefix + rel
        try:
            fd = os.open(path, _O_READ)
        except OSError as exc:
            err = from_oserror(exc, path)
            if isinstance(err, Gone):
                return None
            raise err from None
        try:
            # One small read is enough for most kernel files; loop only when it filled up.
            data = os.read(fd, _READ_CHUNK)
            if len(data) == _READ_CHUNK:
                chunks = [data]
                while True:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    chunks.append(chunk)
                data = b"".join(chunks)
        except OSError as exc:
            err = from_oserror(exc, path)
            if isinstance(err, Gone):
                return None
            raise err from None
        finally:
            os.close(fd)
        return data

    def read_quiet(self, rel: str) -> str | None:
        """Like ``read`` but a refused read is None too (for optional, best-effort values)."""
        try:
            return self.read(rel)
        except OSError:
            return None

    def read_line(self, rel: str) -> str | None:
        """The first line of a file without its newline (sysfs attributes), or None."""
        text = self.read_quiet(rel)
        return None if text is None else text.strip()

    def listdir(self, rel: str) -> list[str]:
        """Entries of a directory; empty when it does not exist or cannot be listed."""
        try:
            return os.listdir(self._prefix + rel)
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        """The target of a symbolic link, or None when it is gone or unreadable."""
        try:
            return os.readlink(self._prefix + rel)
        except OSError:
            return None

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self._prefix + rel)

    def inode(self, rel: str) -> int | None:
        """The inode number of a directory (a cgroup: the kernel's id of it, so a cgroup removed
        and made again under the same path is another one), or None when it is gone."""
        try:
            st = os.stat(self._prefix + rel)
        except OSError:
            return None
        return st.st_ino if stat.S_ISDIR(st.st_mode) else None

    def char_device(self, rel: str) -> tuple[int, int] | None:
        """(major, minor) of the character device that ``rel`` leads to (an open file's
        ``proc/PID/fd/N``: the kernel's own link to it, whatever the path the process used),
        or None: not a character device, gone, or a fixture tree (its links dangle)."""
        if not self.live:
            return None
        try:
            st = os.stat(self._prefix + rel)
        except OSError:
            return None
        if not stat.S_ISCHR(st.st_mode):
            return None
        return os.major(st.st_rdev), os.minor(st.st_rdev)

    def char_majors(self) -> dict[int, str]:
        """Character device majors and their drivers' names, from /proc/devices."""
        out: dict[int, str] = {}
        for line in (self.read_quiet(paths.DEVICES) or "").split("Block devices:")[0].splitlines():
            num, _, name = line.strip().partition(" ")
            if num.isdigit():
                out[int(num)] = name.strip()
        return out

    def kernel_config(self) -> str | None:
        """The running kernel's build configuration (``/proc/config.gz``, else
        ``/boot/config-RELEASE``), or None where neither is there or readable."""
        try:
            with open(self._prefix + paths.CONFIG_GZ, "rb") as f:
                return gzip.decompress(f.read()).decode("utf-8", "replace")
        except (OSError, EOFError, gzip.BadGzipFile):
            pass
        release = self.read_line(paths.sysctl("kernel/osrelease"))
        return self.read_quiet(paths.boot_config(release)) if release else None

    # -- writes ------------------------------------------------------------------------------
    def write(self, rel: str, text: str) -> None:
        """Write one value to a kernel file, unbuffered, so the kernel's refusal surfaces here.

        (A buffered ``open().write()`` can report the kernel's error only at close, or lose it.)
        Raises Gone, NotPermitted, Unchangeable or HostError.
        """
        path = self._prefix + rel
        data = (text if text.endswith("\n") else text + "\n").encode()  # as `echo` writes it
        try:
            # O_TRUNC as a shell's ">" does: kernel files ignore it, fixture trees need it.
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise HostError(errno.EIO, path, f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            if isinstance(exc, HostError):
                raise
            raise from_oserror(exc, path) from None
        finally:
            os.close(fd)

    def mkdir(self, rel: str) -> bool:
        """Create a directory (a cgroup); False if it already existed."""
        try:
            os.mkdir(self._prefix + rel)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            raise from_oserror(exc, self._prefix + rel) from None

    def rmdir(self, rel: str) -> None:
        try:
            os.rmdir(self._prefix + rel)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise from_oserror(exc, self._prefix + rel) from None

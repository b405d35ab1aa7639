"""Domain errors for kernel interfaces, and the one place where errno values are mapped.

DESIGN.md: ESRCH/ENOENT on a task means it is gone (normal, quiet); EPERM/EACCES means not
permitted; EIO means unchangeable. Readers and (later) actuators raise these instead of bare
OSError so that callers can report outcomes instead of crashing.
"""

from __future__ import annotations

import errno


class HostError(OSError):
    """A kernel interface refused or failed; ``path`` says which file or object."""

    outcome = "error"

    def __init__(self, err: int, path: str, detail: str = "") -> None:
        super().__init__(err, detail or errno.errorcode.get(err, str(err)), path)
        self.path = path


class Gone(HostError):
    """The task, IRQ or file no longer exists (ESRCH, ENOENT, ENOTDIR)."""

    outcome = "gone"


class NotPermitted(HostError):
    """The kernel said no for lack of privilege (EPERM, EACCES)."""

    outcome = "not-permitted"


class Unchangeable(HostError):
    """The knob exists but cannot take this value (EIO, e.g. a kernel-managed IRQ)."""

    outcome = "unchangeable"


_GONE = {errno.ESRCH, errno.ENOENT, errno.ENOTDIR}
_PERM = {errno.EPERM, errno.EACCES}
_UNCHANGEABLE = {errno.EIO}


def from_oserror(exc: OSError, path: str) -> HostError:
    """Turn an OSError into the matching domain error (HostError for anything unexpected)."""
    code = exc.errno or 0
    if code in _GONE:
        cls: type[HostError] = Gone
    elif code in _PERM:
        cls = NotPermitted
    elif code in _UNCHANGEABLE:
        cls = Unchangeable
    else:
        cls = HostError
    return cls(code, path, exc.strerror or "")

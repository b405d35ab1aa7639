"""Policy files: TOML in, a validated, frozen ``Policy`` out (pure: no I/O beyond reading it).

A policy is an ordered list of layers; each layer's ``match`` is an OR of AND-groups of
predicates; the first layer that matches a thread wins and the last layer must match every
thread. ``load_policy(path)`` and ``load_default()`` are the entry points; a policy that does not
validate raises ``PolicyError`` with every error of the file, one line each: the file, the
line and column of the key (``hostd.policy.positions``), the key path, the bad value, what was
expected and, for a misspelled key, predicate, role or choice, what was probably meant. Unknown
keys are errors (they are usually typos). Rules that look dangerous (an RT layer an unprivileged
user could enter by renaming a thread) are kept as warnings on the Policy.

The package, by concern: ``schema`` (how a key is declared, the words keys take), ``values``
and ``tables`` (the frozen values of layers and of tables, and every key's one declaration),
``check`` and ``layers`` (the checker the declarations drive, and what they cannot say),
``regex`` (the limits on regular expressions), ``errors`` (``PolicyError``, did-you-mean),
``positions`` (where a key path sits in the text), ``docs`` (the reference and the JSON
Schema, generated; ``hostd policy show``'s values).

Called by the CLI (``hostd policy check``, and every command that takes ``--policy``) and by the
classifier (``hostd.classify``), which compiles the predicates kept here.
"""

from __future__ import annotations

import os
import stat
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from hostd.policy.check import Checker
from hostd.policy.errors import NOTHING, PolicyError, did_you_mean
from hostd.policy.layers import (
    BOOL_PREDICATES,
    ID_PREDICATES,
    NICE_PREDICATES,
    PREDICATES,
    REGEX_PREDICATES,
    STRING_PREDICATES,
    USER_CONTROLLED,
    elevation,
    gated,
)  # fmt: skip
from hostd.policy.positions import position
from hostd.policy.regex import MAX_REGEX_CHARS, MAX_REGEX_DEPTH, MAX_REPEAT_COUNT, regex_problem
from hostd.policy.schema import (
    EPP_VALUES,
    GOVERNORS,
    GROWTH_ORDERS,
    IRQ_MODES,
    KINDS,
    MODES,
    NUMA_MODES,
    RT_POLICIES,
    SCHED_POLICIES,
    SOURCES,
    WEIGH_JOB,
)  # fmt: skip
from hostd.policy.tables import (
    INFRA_NAMESPACES,
    Agent,
    Cgroups,
    Guard,
    Jobs,
    Metrics,
    Policy,
    Preempt,
    Sizing,
)
from hostd.policy.values import CpuAmount, Layer, Predicate, Sched

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "BOOL_PREDICATES", "DEFAULT_POLICY", "EPP_VALUES", "GOVERNORS", "GROWTH_ORDERS",
    "ID_PREDICATES", "INFRA_NAMESPACES", "IRQ_MODES", "KINDS", "MAX_POLICY_BYTES",
    "MAX_REGEX_CHARS", "MAX_REGEX_DEPTH", "MAX_REPEAT_COUNT", "MODES", "NICE_PREDICATES",
    "NUMA_MODES", "PREDICATES", "REGEX_PREDICATES", "RT_POLICIES", "SCHED_POLICIES", "SOURCES",
    "STRING_PREDICATES", "USER_CONTROLLED", "WEIGH_JOB", "Agent", "Cgroups", "CpuAmount",
    "Guard", "Jobs", "Layer", "Metrics", "Policy", "PolicyError", "Predicate", "Preempt",
    "Sched", "Sizing", "default_policy_bytes", "did_you_mean", "elevation", "gated",
    "insecure_reason", "installed_policies", "load_checked", "load_default", "load_policy",
    "parse_policy", "position", "regex_problem",
]  # fmt: skip

DEFAULT_POLICY = "training.toml"


def parse_policy(raw: bytes, source: str) -> Policy:
    """Validate policy bytes; ``source`` names them in errors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            source, "", NOTHING, f"UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(source, "", NOTHING, f"valid TOML ({exc})") from None
    except RecursionError:
        raise PolicyError(source, "", NOTHING, "TOML nested less deep") from None
    return Checker(source, text).policy(data, raw)


MAX_POLICY_BYTES = 1 << 20


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file: a regular file of at most 1 MiB (a FIFO or a device
    would hang or flood the reader). Raises PolicyError (also for a missing file)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(str(path), "", NOTHING, f"a readable file ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise PolicyError(str(path), "", NOTHING, "a policy file, not a folder")
        if not stat.S_ISREG(mode):
            raise PolicyError(str(path), "", NOTHING, "a regular file (not a FIFO or a device)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise PolicyError(str(path), "", NOTHING, f"a readable file ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(str(path), "", NOTHING, "a policy file of at most 1 MiB")
    return parse_policy(raw, str(path))


def load_checked(path: str | None, allow_insecure: bool) -> Policy:
    """The policy an agent runs (``None``: the embedded default), refusing one that a non-root
    user could have written while hostd runs as root (raises PolicyError)."""
    if path is None:
        return load_default()
    policy = load_policy(path)  # a missing, looping or non-regular file is said as such first
    if os.geteuid() == 0 and not allow_insecure:
        why = insecure_reason(path)
        if why:
            raise PolicyError.about_file(
                str(path),
                f"a policy only root can change ({why}); "
                "pass --allow-insecure-policy to use it anyway",
            )
    return policy


def insecure_reason(path: str | Path) -> str | None:
    """Why a policy file may not be trusted by a root agent, or None.

    A file or folder that a non-root user can write lets that user choose which threads become
    real-time: hostd refuses it unless told otherwise (``--allow-insecure-policy``).
    """
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        return f"{path}: cannot be resolved ({exc})"
    for target in (path, path.parent):
        try:
            st = target.stat()
        except OSError as exc:
            return f"{target}: cannot stat ({exc.strerror})"
        if st.st_uid != 0:
            return f"{target} is owned by uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not (target.is_dir() and st.st_mode & 0o1000):
            return f"{target} is writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def default_policy_bytes() -> bytes:
    return resources.files(__package__).joinpath(DEFAULT_POLICY).read_bytes()


def load_default() -> Policy:
    """The embedded default policy (the same file as policies/training.toml)."""
    return parse_policy(default_policy_bytes(), f"<embedded {DEFAULT_POLICY}>")


def installed_policies() -> dict[str, Traversable]:
    """The policies shipped in the package (``hostd/policy/*.toml``), by name (the file's stem),
    the embedded default first: what ``hostd policy list`` lists and ``--policy NAME`` loads."""
    files = [f for f in resources.files(__package__).iterdir() if f.name.endswith(".toml")]
    files.sort(key=lambda f: (f.name != DEFAULT_POLICY, f.name))
    return {f.name.removesuffix(".toml"): f for f in files}

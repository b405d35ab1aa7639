"""CPU sets as frozensets of ints, and the kernel's two text forms for them (pure: no I/O).

Used by the host parsers (``cpulist`` files in /sys, ``Cpus_allowed_list`` in /proc), by the
planner (sets of CPUs per layer) and by renderers; also the names of hostd's own cpuset cgroups
(``hostd.cpuset.cgroup`` says why they are where they are). The formats are the ones described in
Documentation/admin-guide/cputopology.rst ("0-3,8-11") and in cpuset(7) ("mask format":
comma-separated 32-bit hex words, most significant first).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

CpuSet = frozenset  # frozenset[int]; an alias so signatures say what they mean

EMPTY: frozenset[int] = frozenset()

CPUSET_ROOT = "/hostd"  # v1: hostd's layers' cpusets are CPUSET_ROOT/<layer>
V2_PREFIX = "hostd."  # v2: threaded children G/hostd.<layer> of the job's own cgroup G


@functools.lru_cache(maxsize=1024)  # once per thread in a plan, over a few distinct paths
def home_of(path: str) -> str:
    """Where a thread in one of hostd's cpusets belongs: "/" for v1's ``/hostd/<layer>``, G for
    v2's ``G/hostd.<layer>``. Any other path is its own home."""
    if path == CPUSET_ROOT or path.startswith(CPUSET_ROOT + "/"):
        return "/"
    parent, _, name = path.rstrip("/").rpartition("/")
    if name.startswith(V2_PREFIX):
        return parent or "/"
    return path


def v2_group(home: str, layer: str) -> str:
    """hostd's v2 threaded cgroup for ``layer``'s threads whose home cgroup is ``home``."""
    return f"{home.rstrip('/')}/{V2_PREFIX}{layer}"


class CpuListError(ValueError):
    """A cpulist or mask string that does not parse."""


# Memoized: the agent parses and formats the same few sets once per thread (100k times at 100k
# threads), and one shared copy of each keeps that memory flat (BENCHMARKS.md, steady RSS).
@functools.lru_cache(maxsize=1024)
def parse_cpulist(text: str) -> frozenset[int]:
    """Parse "0-3,8,10-11" (also "0-31:2/8" stride groups, see cpuset(7)) into a set of ints."""
    text = text.strip()
    if not text:
        return EMPTY
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                span, _, stride = part.partition(":")
                lo_s, hi_s = span.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo > hi or lo < 0:
                    raise CpuListError(f"bad range {part!r}")
                if stride:
                    used_s, group_s = stride.split("/", 1)
                    used, group = int(used_s), int(group_s)
                    if used <= 0 or group <= 0:
                        raise CpuListError(f"bad stride {part!r}")
                    cpus.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
                else:
                    cpus.update(range(lo, hi + 1))
            else:
                value = int(part)
                if value < 0:
                    raise CpuListError(f"negative cpu {part!r}")
                cpus.add(value)
        except ValueError as exc:
            if isinstance(exc, CpuListError):
                raise
            raise CpuListError(f"bad cpulist {text!r}") from exc
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The canonical kernel form: sorted, ranges collapsed ("0-3,8")."""
    return _format_cpulist(cpus if isinstance(cpus, frozenset) else frozenset(cpus))


@functools.lru_cache(maxsize=1024)
def _format_cpulist(cpus: frozenset[int]) -> str:
    ordered = sorted(cpus)
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for cpu in ordered[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = cpu
    parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


def parse_mask(text: str) -> frozenset[int]:
    """Parse the hex mask form ("ff,00000001") used by smp_affinity and Cpus_allowed."""
    words = text.strip().replace(",", "")
    if not words:
        return EMPTY
    try:
        value = int(words, 16)
    except ValueError as exc:
        raise CpuListError(f"bad cpu mask {text!r}") from exc
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_mask(cpus: Iterable[int], nr_cpus: int | None = None) -> str:
    """The kernel's mask form, in 32-bit words, at least as wide as ``nr_cpus``."""
    cpus = set(cpus)
    width = max([nr_cpus or 1, *(c + 1 for c in cpus)])
    value = sum(1 << c for c in cpus)
    nwords = max(1, (width + 31) // 32)
    words = [f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(nwords))]
    return ",".join(words)

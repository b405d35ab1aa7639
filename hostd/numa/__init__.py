"""NUMA placement: move a process's memory to its target node, a few milliseconds at a time.

The knob ``task/PID@START/numa`` (keyed by the thread-group leader) reads the node holding most
of the process's pages (``/proc/PID/numa_maps``, proc(5)) and writes by moving its private
pages there with ``move_pages(2)`` in batches: each batch is sized to take about ``BUDGET_S``
(the batch doubles while it is fast and halves when it is slow), and the mover sleeps between
batches, so the process is held up for milliseconds at a time, never for the whole copy.
``migrate_pages(2)`` (everything at once, in the kernel) is the alternative for callers that
prefer speed to smoothness. Its threads follow through the plan's affinity (the node's CPUs).
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections import Counter
from dataclasses import dataclass

from hostd import knobs
from hostd.host import Gone, Host, HostError, paths

BUDGET_S = 0.005  # per batch: how long the process may be held up at a time
PAUSE_S = 0.001  # between batches
PAGE = os.sysconf("SC_PAGE_SIZE")
_NODE_RE = re.compile(r"\bN(\d+)=(\d+)")
# Private, writable mappings hold the process's own memory; file-backed shared text is left.
_MAPS_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ")


@dataclass(frozen=True, slots=True)
class MoveReport:
    pages: int  # pages asked to move
    moved: int  # pages now on the target node
    failed: int  # pages the kernel could not move (busy, pinned, absent)
    batches: int
    longest_batch_s: float


def pages_by_node(host: Host, pid: int) -> Counter[int]:
    """How many pages of ``pid`` sit on each node (numa_maps)."""
    text = host.read(paths.proc(pid, "numa_maps"))
    if text is None:
        raise Gone(errno.ESRCH, paths.proc(pid, "numa_maps"), "the process exited")
    counts: Counter[int] = Counter()
    for node, pages in _NODE_RE.findall(text):
        counts[int(node)] += int(pages)
    return counts


def private_pages(host: Host, pid: int) -> list[int]:
    """Page addresses of the process's private writable mappings (its heap, stacks, anon)."""
    text = host.read(paths.proc(pid, "maps"))
    if text is None:
        raise Gone(errno.ESRCH, paths.proc(pid, "maps"), "the process exited")
    pages: list[int] = []
    for line in text.splitlines():
        m = _MAPS_RE.match(line)
        if not m or m.group(3)[1] != "w" or m.group(3)[3] != "p" or "[vsyscall]" in line:
            continue
        start, end = int(m.group(1), 16), int(m.group(2), 16)
        pages.extend(range(start, end, PAGE))
    return pages


def move_process(host: Host, pid: int, node: int, *, budget_s: float = BUDGET_S) -> MoveReport:
    """Move the private pages of ``pid`` to ``node`` in time-boxed batches.

    A page move_pages cannot see (-EFAULT: a huge page the NUMA balancer has marked no-access
    while it samples an idle process, found in the VM tier) is left to one migrate_pages(2) call
    at the end, which moves such pages.
    """
    calls = host.threads()
    pages = private_pages(host, pid)
    batch, i, moved, failed, batches, longest, hidden = 64, 0, 0, 0, 0, 0.0, 0
    while i < len(pages):
        chunk = pages[i : i + batch]
        started = time.perf_counter()
        status = calls.move_pages(pid, chunk, node)
        took = time.perf_counter() - started
        longest = max(longest, took)
        batches += 1
        moved += sum(1 for s in status if s == node)
        failed += sum(1 for s in status if s < 0 and s not in (-errno.ENOENT, -errno.EFAULT))
        hidden += sum(1 for s in status if s == -errno.EFAULT)
        i += len(chunk)
        if took < budget_s / 2:
            batch = min(batch * 2, 65536)
        elif took > budget_s:
            batch = max(batch // 2, 16)
        time.sleep(PAUSE_S)
    if hidden:
        left = migrate_process(host, pid, node)
        moved += max(0, hidden - left)
        failed += min(hidden, left)
    return MoveReport(len(pages), moved, failed, batches, longest)


def migrate_process(host: Host, pid: int, node: int) -> int:
    """Everything at once, in the kernel (migrate_pages(2)); returns pages it could not move."""
    others = frozenset(pages_by_node(host, pid)) - {node}
    if not others:
        return 0
    return host.threads().migrate_pages(pid, others, frozenset({node}))


def _read(host: Host, key: str) -> list:
    """[the node holding most of its pages, None]: the method is how, not what."""
    pid = knobs.live_tid(host, key)
    counts = pages_by_node(host, pid)
    return [max(counts, key=lambda n: (counts[n], -n)) if counts else 0, None]


def _write(host: Host, key: str, value: object) -> None:
    node, method = value  # type: ignore[misc]
    pid = knobs.live_tid(host, key)
    if method == "migrate_pages":
        migrate_process(host, pid, int(node))
        return
    report = move_process(host, pid, int(node))
    if report.pages and not report.moved:
        raise HostError(errno.EAGAIN, key, f"none of {report.pages} pages could be moved")


def _check(value: object) -> str | None:
    if (
        isinstance(value, list)
        and len(value) == 2
        and type(value[0]) is int
        and 0 <= value[0] < 4096
        and value[1] in (None, "move_pages", "migrate_pages")
    ):
        return None
    return f"{value!r} is not [node, method]"


NUMA = knobs.Spec(
    "numa",
    "task/PID@START/numa",
    _read,
    _write,
    _check,
    noun="process memory placement",
    apply_order=9,  # last: threads are already on the node's CPUs when their memory follows
    per_task=True,
)

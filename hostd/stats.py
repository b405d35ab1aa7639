"""Which threads waited: per-layer scheduler statistics over an interval (``hostd stats``).

Per thread, two samples ``interval`` seconds apart of the kernel's cumulative counters:
``/proc/PID/task/TID/schedstat`` (ns on a CPU, ns runnable but waiting on a run queue,
timeslices run; Documentation/scheduler/sched-stats.rst) and the ``voluntary_ctxt_switches`` /
``nonvoluntary_ctxt_switches`` lines of its ``status`` (proc(5)). Their differences, summed per
layer of the policy's classification, say how much CPU each layer got and how long its runnable
threads were kept off a CPU: a latency-critical layer that waits is one to protect.

Only threads present in both samples count; a thread is keyed by (tid, start time), as
``hostd.model.tasks.Task.key``, so a tid reused in between is not mistaken for the same thread.

``measure(host, policy, interval)`` takes a snapshot (``hostd.snapshot.take``), samples, sleeps
and samples again; ``compare(before, after, classified, interval)`` is the pure arithmetic.
Called by ``hostd.cli.stats``; reads go through ``Host`` only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hostd.classify import Classified
from hostd.host import Host, paths
from hostd.host.parsers import parse_schedstat, parse_stat, parse_status
from hostd.model.tasks import Task
from hostd.policy import Policy
from hostd.snapshot import take

Key = tuple[int, int]  # (tid, start time), as Task.key


class StatsError(ValueError):
    """Bad input to a measurement: an interval that is not positive, an unknown process."""


class Unavailable(RuntimeError):
    """This host cannot say: no thread's schedstat could be read, or it reads all zeros."""


@dataclass(frozen=True, slots=True)
class Counters:
    """A thread's cumulative scheduler counters, or the difference of two samples (a delta)."""

    run_ns: int = 0  # on a CPU
    wait_ns: int = 0  # runnable, waiting on a run queue
    timeslices: int = 0
    voluntary: int = 0  # context switches: it blocked (sleep, lock, I/O)
    involuntary: int = 0  # context switches: it was preempted

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.run_ns + other.run_ns,
            self.wait_ns + other.wait_ns,
            self.timeslices + other.timeslices,
            self.voluntary + other.voluntary,
            self.involuntary + other.involuntary,
        )

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.run_ns - other.run_ns,
            self.wait_ns - other.wait_ns,
            self.timeslices - other.timeslices,
            self.voluntary - other.voluntary,
            self.involuntary - other.involuntary,
        )


@dataclass(frozen=True, slots=True)
class Rates:
    """A delta over ``interval`` seconds, per second."""

    cpu: float  # CPU seconds per second (1.0: one CPU's worth)
    wait: float  # run-queue wait, seconds per second
    wait_share: float  # wait / (run + wait): the fraction of its runnable time spent waiting
    wait_per_slice_ms: float  # mean run-queue wait before each timeslice, milliseconds
    involuntary_per_s: float
    voluntary_per_s: float


def rates(delta: Counters, interval: float) -> Rates:
    if interval <= 0:
        raise StatsError(f"interval {interval}: expected a positive number of seconds")
    busy = delta.run_ns + delta.wait_ns
    return Rates(
        cpu=delta.run_ns / 1e9 / interval,
        wait=delta.wait_ns / 1e9 / interval,
        wait_share=delta.wait_ns / busy if busy else 0.0,
        wait_per_slice_ms=delta.wait_ns / 1e6 / delta.timeslices if delta.timeslices else 0.0,
        involuntary_per_s=delta.involuntary / interval,
        voluntary_per_s=delta.voluntary / interval,
    )


@dataclass(frozen=True, slots=True)
class LayerStats:
    layer: str
    threads: int  # present in both samples
    delta: Counters
    rates: Rates


@dataclass(frozen=True, slots=True)
class ThreadStats:
    tid: int
    pid: int
    comm: str
    layer: str
    delta: Counters
    rates: Rates


@dataclass(frozen=True, slots=True)
class Stats:
    interval: float  # seconds between the two samples, as measured
    threads: int  # counted: present in both samples
    vanished: int  # sampled first, gone (or its tid reused) by the second sample
    appeared: int  # only in the second sample
    layers: tuple[LayerStats, ...]  # policy order
    top: tuple[ThreadStats, ...]  # the threads that waited most, most first (none that waited 0)


def read_counters(host: Host, pid: int, tid: int) -> tuple[Key, Counters] | None:
    """One thread's key and counters now, or None when it is gone or its files are unreadable."""
    try:
        stat, sched, status = (
            host.read(paths.task(pid, tid, name)) for name in ("stat", "schedstat", "status")
        )
        if stat is None or sched is None or status is None:
            return None
        run = parse_schedstat(sched)
        st = parse_status(status)
        start = parse_stat(stat).start_time
    except (OSError, ValueError, IndexError):
        return None
    counters = Counters(
        run.run_ns,
        run.wait_ns,
        run.timeslices,
        st.voluntary_ctxt_switches,
        st.nonvoluntary_ctxt_switches,
    )
    return (tid, start), counters


def sample(host: Host, tasks: Iterable[Task]) -> dict[Key, Counters]:
    """The counters of each of ``tasks`` that is still there, by (tid, start time)."""
    found: dict[Key, Counters] = {}
    for task in tasks:
        read = read_counters(host, task.pid, task.tid)
        if read is not None:
            found[read[0]] = read[1]
    return found


def compare(
    before: Mapping[Key, Counters],
    after: Mapping[Key, Counters],
    classified: Iterable[Classified],
    interval: float,
    *,
    layers: Sequence[str] | None = None,
    top: int | None = 10,
) -> Stats:
    """Per-layer and per-thread deltas of the threads in both samples, over ``interval`` s.

    ``layers``: the layer names in policy order (so that empty layers are listed too); by
    default the layers of ``classified`` in order of appearance. ``top``: how many of the
    threads that waited, most first (None: every thread, those that did not wait too). Pure:
    no I/O.
    """
    if interval <= 0:
        raise StatsError(f"interval {interval}: expected a positive number of seconds")
    by_key = {c.task.key: c for c in classified}
    if layers is None:
        layers = list(dict.fromkeys(c.layer for c in by_key.values()))
    totals = dict.fromkeys(layers, Counters())  # a frozen value: sharing it is fine
    counts = dict.fromkeys(layers, 0)
    threads: list[ThreadStats] = []
    for key in sorted(before.keys() & after.keys()):
        item = by_key.get(key)
        if item is None:
            continue  # sampled but not classified (outside the snapshot): nothing to file it under
        delta = after[key] - before[key]
        totals[item.layer] = totals.get(item.layer, Counters()) + delta
        counts[item.layer] = counts.get(item.layer, 0) + 1
        t = item.task
        threads.append(ThreadStats(t.tid, t.pid, t.comm, item.layer, delta, rates(delta, interval)))
    waited = sorted(
        (t for t in threads if t.delta.wait_ns > 0 or top is None),
        key=lambda t: (-t.delta.wait_ns, t.tid),
    )
    return Stats(
        interval=interval,
        threads=len(threads),
        vanished=len(before.keys() - after.keys()),
        appeared=len(after.keys() - before.keys()),
        layers=tuple(
            LayerStats(name, counts[name], totals[name], rates(totals[name], interval))
            for name in totals
        ),
        top=tuple(waited if top is None else waited[: max(top, 0)]),
    )


def measure(
    host: Host,
    policy: Policy,
    interval: float,
    scope: list[int] | None = None,
    top: int = 10,
    keep: Callable[[Classified], bool] | None = None,
) -> Stats:
    """Classify the host's threads (or ``scope``'s processes and their descendants, and of
    those the ones ``keep`` keeps), sample
    their counters, sleep ``interval`` seconds, sample again and compare.

    Rates are over the time between the starts of the two sampling passes (each thread is
    read at about the same offset in both), not the bare sleep. On a live host hostd's own
    process is left out: its CPU is the measuring itself. Raises StatsError on bad input and
    Unavailable when the kernel does not keep the counters.
    """
    if not (interval > 0 and math.isfinite(interval)):
        raise StatsError(f"interval {interval}: expected a positive number of seconds")
    for pid in scope or ():
        if pid <= 0 or not host.exists(paths.proc(pid, "task")):
            raise StatsError(f"process {pid}: no such process")
    snap = take(host, policy, scope)
    own = os.getpid() if host.live else None
    items = [c for c in snap.classified if c.task.pid != own and (keep is None or keep(c))]
    tasks = [c.task for c in items]
    start = time.monotonic()
    before = sample(host, tasks)
    if tasks and not before:
        where = "the kernel needs CONFIG_SCHED_INFO" if host.live else f"none below {host.root}"
        raise Unavailable(f"no thread's schedstat could be read ({where})")
    if before and not any(c.run_ns for c in before.values()):
        raise Unavailable("every schedstat reads 0: the kernel does not keep scheduler statistics")
    time.sleep(interval)
    elapsed = time.monotonic() - start
    after = sample(host, tasks)
    return compare(before, after, items, elapsed, layers=[ly.name for ly in policy.layers], top=top)

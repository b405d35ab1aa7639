"""Per-layer CPU time and run-queue wait, for the exporter: every thread's schedstat, read now
and then by the agent's own thread.

``LayerStats.sample()`` reads ``/proc/PID/task/TID/schedstat`` (time on a CPU, time runnable but
waiting, timeslices) of every thread the agent has classified, and adds each thread's change
since the last sample to its layer: CPU seconds, wait seconds, and a histogram of the wait per
wakeup (each thread's mean wait per timeslice over the interval, counted once per timeslice:
the kernel keeps no single wakeups). It samples every ``EVERY_S`` seconds, or 100 times its own
cost when that is longer (at most 1 % of a CPU however many threads the host has). ``doc()`` is
what the status document (and so a scrape) holds.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from hostd.agent.metrics import Histogram

if TYPE_CHECKING:
    from hostd.agent.core import Agent

EVERY_S = 5.0
COST_FACTOR = 100
# Wait per wakeup, seconds: 10 us (an idle CPU) to 1 s (a starved thread).
WAIT_BOUNDS = (1e-5, 5e-5, 1e-4, 5e-4, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)


class LayerStats:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.prev: dict[tuple[int, int], tuple[int, int, int]] = {}  # key -> run, wait, slices
        self.cpu: dict[str, float] = defaultdict(float)  # layer -> seconds on a CPU
        self.wait: dict[str, float] = defaultdict(float)  # layer -> seconds runnable, waiting
        self.per_wakeup: dict[str, Histogram] = {}
        self.due = 0.0  # monotonic time of the next sample
        self.cost = 0.0  # seconds the last sample took

    def sample(self) -> None:
        started = time.monotonic()
        host, seen = self.agent.host, {}
        for tid, item in list(self.agent.inc.classified.items()):
            task = item.task
            got = host.schedstat(task.pid, tid)
            if got is None:
                continue
            run, wait, slices = got
            key = task.key
            seen[key] = (run, wait, slices)
            before = self.prev.get(key)
            if before is None:
                continue  # its first sample: the change comes next time
            d_run, d_wait, d_slices = run - before[0], wait - before[1], slices - before[2]
            if d_run < 0 or d_wait < 0 or d_slices < 0:
                continue
            layer = item.layer
            self.cpu[layer] += d_run / 1e9
            self.wait[layer] += d_wait / 1e9
            hist = self.per_wakeup.setdefault(layer, Histogram(WAIT_BOUNDS))
            if d_slices:
                hist.observe_many(d_wait / 1e9 / d_slices, d_slices, d_wait / 1e9)
        self.prev = seen
        self.cost = time.monotonic() - started
        self.due = time.monotonic() + max(EVERY_S, COST_FACTOR * self.cost)

    def doc(self) -> dict:
        return {
            "cpu_seconds": {k: round(v, 6) for k, v in self.cpu.items()},
            "wait_seconds": {k: round(v, 6) for k, v in self.wait.items()},
            "wait_per_wakeup": {k: h.doc() for k, h in self.per_wakeup.items()},
            "sample_seconds": round(self.cost, 6),
        }

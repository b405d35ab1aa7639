"""Per-layer CPU time and run-queue wait, for the exporter and the record of job attempts
(``hostd.agent.attempts``): every thread's schedstat, read now and then by the agent's thread.
For the exporter only, also each thread's involuntary switches (``status``, for threads that
ran) and the CPU pressure (PSI) of the cgroup v2 groups hostd made for its layers.

``LayerStats.sample()`` reads ``/proc/PID/task/TID/schedstat`` (time on a CPU, time runnable but
waiting, timeslices) of every thread the agent has classified, and adds each thread's change
since the last sample to its layer: CPU seconds, wait seconds, and a histogram of the wait per
wakeup (each thread's mean wait per timeslice over the interval, counted once per timeslice:
the kernel keeps no single wakeups). It samples every ``[metrics] sample_interval`` seconds
(5), or 100 times its own cost when that is longer (at most 1 % of a CPU however many threads
the host has). ``doc()`` is what the status document (and so a scrape) holds. Nothing is read
while neither the exporter nor the attempts' record (``[jobs] record``) wants it.

The agent's loop takes a sample a slice at a time (``sample(budget_s)``; ``parts.Stats``),
between event passes: at 100,000 threads a sample reads for about a second, and in one piece it
held every new thread waiting that long (at 1,000 threads, 50 ms every 5 s: a third of a storm's
misses). It reads, through the host door, the threads the incremental state has classified; it
is given the policy (``AgentState``), the attempts' record and the exporter, never the agent.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from hostd.agent.metrics import Histogram

if TYPE_CHECKING:
    from hostd.agent.attempts import Attempts
    from hostd.agent.incremental import Incremental
    from hostd.agent.metrics import Exporter
    from hostd.agent.state import AgentState
    from hostd.host import Host

COST_FACTOR = 100
# Wait per wakeup, seconds: 10 us (an idle CPU) to 1 s (a starved thread).
WAIT_BOUNDS = (1e-5, 5e-5, 1e-4, 5e-4, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)


class LayerStats:
    def __init__(
        self,
        host: Host,
        inc: Incremental,
        state: AgentState,
        attempts: Attempts,
        exporter: Exporter,
    ) -> None:
        self.host, self.inc, self.state = host, inc, state
        self.attempts, self.exporter = attempts, exporter
        self.prev: dict[tuple[int, int], tuple[int, int, int]] = {}  # key -> run, wait, slices
        self.cpu: dict[str, float] = defaultdict(float)  # layer -> seconds on a CPU
        self.wait: dict[str, float] = defaultdict(float)  # layer -> seconds runnable, waiting
        self.per_wakeup: dict[str, Histogram] = {}
        self.involuntary: dict[str, int] = defaultdict(int)  # layer -> preempted while runnable
        self.prev_invol: dict[tuple[int, int], int] = {}
        self.pressure: dict[str, list[float]] = {}  # layer -> [some, full] seconds (PSI, v2)
        self.prev_psi: dict[str, tuple[int, int]] = {}  # hostd's cgroup -> (some, full) us
        self.due = 0.0  # monotonic time of the next sample
        self.cost = 0.0  # seconds the last sample read for (its slices summed)
        self.taken = 0.0  # monotonic time the last sample began (0: none yet)
        # The sample under way: the tids still to read (None: none under way), what it read,
        # when it began, the seconds its slices took, and when its last slice ran.
        self.left: list[int] | None = None
        self.seen: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.invol: dict[tuple[int, int], int] = {}
        self.began = 0.0
        self.busy = 0.0
        self.last_slice = 0.0
        self.recording = False  # the sample under way tells the attempts' record

    @property
    def wanted(self) -> bool:
        """Whether anyone uses the samples: the exporter, or the record of job attempts."""
        return self.exporter.address is not None or self.state.policy.jobs_record

    @property
    def sampling(self) -> bool:
        """Whether a sample is under way (``sample`` with a budget left threads to read)."""
        return self.left is not None

    def sample(self, budget_s: float | None = None) -> bool:
        """Read the threads' schedstat and add each one's change to its layer: all of them
        (``budget_s`` None), or for about ``budget_s`` seconds, the next call going on where
        this one stopped. Returns whether the sample ended (its PSI read, the attempts told,
        the next one due)."""
        now = time.monotonic()
        policy = self.state.policy
        if self.left is None:  # a new sample: the threads classified now
            self.left, self.seen, self.invol = list(self.inc.classified), {}, {}
            self.began, self.busy = now, 0.0
            self.recording = bool(policy.jobs_record)  # for the whole sample
            if self.recording:
                self.attempts.begin()
        host, left, seen, invol = self.host, self.left, self.seen, self.invol
        classified = self.inc.classified  # (a full pass meanwhile builds a new one)
        attempts = self.attempts if self.recording else None
        exported = self.exporter.address is not None
        deadline = None if budget_s is None else now + budget_s
        read = 0
        while left:
            if deadline is not None and read % 8 == 7 and time.monotonic() >= deadline:
                break
            item = classified.get(left.pop())
            if item is None:  # gone since the sample began
                continue
            read += 1
            task = item.task
            got = host.schedstat(task.pid, task.tid)
            if got is None:
                continue
            run, wait, slices = got
            key = task.key
            seen[key] = (run, wait, slices)
            before = self.prev.get(key)
            if before is None:
                if attempts is not None and self.taken:  # new since the last sample
                    attempts.add(task, item.layer, run, wait, slices)
                continue  # the host's first sample: the change comes next time
            d_run, d_wait, d_slices = run - before[0], wait - before[1], slices - before[2]
            if d_run < 0 or d_wait < 0 or d_slices < 0:
                continue
            layer = item.layer
            self.cpu[layer] += d_run / 1e9
            self.wait[layer] += d_wait / 1e9
            hist = self.per_wakeup.setdefault(layer, Histogram(WAIT_BOUNDS))
            if d_slices:
                hist.observe_many(d_wait / 1e9 / d_slices, d_slices, d_wait / 1e9)
            if attempts is not None:
                attempts.add(task, layer, d_run, d_wait, d_slices)
            if exported and d_slices:  # a thread that never ran was never preempted either
                count = host.involuntary_switches(task.pid, task.tid)
                if count is not None:
                    invol[key] = count
                    was = self.prev_invol.get(key)
                    if was is not None and count >= was:
                        self.involuntary[layer] += count - was
            elif key in self.prev_invol:
                invol[key] = self.prev_invol[key]
        self.last_slice = time.monotonic()
        self.busy += self.last_slice - now
        if left:
            return False
        self.left, self.prev, self.prev_invol = None, seen, invol
        if exported:
            self._pressure()
        if attempts is not None and self.taken:
            attempts.close(self.began - self.taken)
        self.taken = self.began
        self.cost = self.busy
        every = policy.metrics.sample_interval
        self.due = time.monotonic() + max(every, COST_FACTOR * self.cost)
        return True

    def _pressure(self) -> None:
        """Each layer's CPU pressure (PSI) from the cgroups hostd made for it, where they are
        cgroup v2 groups (v1 keeps no pressure): the change since the last sample, summed."""
        topo, plan = self.inc.topology, self.inc.plan
        if topo is None or plan is None or topo.cgroup.cpuset != "v2" or not topo.cgroup.v2_mount:
            return
        mount, seen = topo.cgroup.v2_mount.rstrip("/"), {}
        for cs in plan.cpusets:
            got = self.host.pressure(f"{mount}{cs.path}")
            if got is None:
                continue
            seen[cs.path] = got
            before = self.prev_psi.get(cs.path)
            into = self.pressure.setdefault(cs.layer, [0.0, 0.0])
            if before is not None and got[0] >= before[0] and got[1] >= before[1]:
                into[0] += (got[0] - before[0]) / 1e6
                into[1] += (got[1] - before[1]) / 1e6
        self.prev_psi = seen

    def doc(self) -> dict:
        return {
            "involuntary_switches": dict(self.involuntary),
            "cpu_pressure_seconds": {
                k: {"some": round(v[0], 6), "full": round(v[1], 6)}
                for k, v in self.pressure.items()
            },
            "cpu_seconds": {k: round(v, 6) for k, v in self.cpu.items()},
            "wait_seconds": {k: round(v, 6) for k, v in self.wait.items()},
            "wait_per_wakeup": {k: h.doc() for k, h in self.per_wakeup.items()},
            "sample_seconds": round(self.cost, 6),
        }

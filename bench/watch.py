#!/usr/bin/env python3
"""What the preemption watch and the starvation guard cost per tick, at many threads.

Run as root from the repository root::

    python3 bench/watch.py [--threads 1000,10000,100000] [--ticks 20]

For each count it starts bench/scan.py's helper tree of idle threads (same names, same kernel
limits raised and put back), then runs the real agent in this process (``hostd.agent.Agent``,
observe mode, scoped to the helpers, policy ``bench/watch_policy.toml``: the launcher is the
protected layer, everything else preemptible) through one full pass, and times:

* **a tick** (``WatchLoop.tick``) as the agent runs it: one ``/proc/PID/stat`` per process,
  and schedstat + stat of the threads of processes that ran or are runnable (the helpers are
  idle: almost none);
* **the worst case**: schedstat + stat of EVERY thread, as if every process had run since the
  last tick (``WatchLoop.sample`` with every process forced in).

It prints per count the median and max of each over ``--ticks`` repetitions. Never part of the
tests; results go to BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from scan import Helpers, Limits, _subreaper  # noqa: E402

from hostd.agent import Agent  # noqa: E402
from hostd.host import Host  # noqa: E402

POLICY = HERE / "watch_policy.toml"


def measure(threads: int, ticks: int) -> dict:
    helpers = Helpers(threads, timeout=600)
    try:
        helpers.start()
        assert helpers.root is not None
        with tempfile.TemporaryDirectory(prefix="hostd-watch-bench-") as tmp:
            agent = Agent(
                Host(),
                str(POLICY),
                state_dir=Path(tmp) / "state",
                run_dir=Path(tmp) / "run",
                mode="observe",
                allow_insecure_policy=True,
                scope=[helpers.root.pid],
            )
            agent.pass_once()
            watcher = agent.watcher
            assert watcher.active(), "the launcher (protected) was not found"
            tick, worst = [], []
            sampled = 0
            for _ in range(ticks):
                t0 = time.perf_counter()
                watcher.tick(time.monotonic())
                tick.append(time.perf_counter() - t0)
            procs = list(agent.cache.procs)
            for _ in range(max(1, ticks // 4)):
                watcher.sampler.cpu.clear()  # every process counts as new ...
                for pid in procs:  # ... and as having run: all its threads are sampled
                    watcher.sampler.cpu[pid] = (agent.cache.procs[pid].start_time, -1)
                t0 = time.perf_counter()
                samples, *_ = watcher.sampler.sample(set())
                worst.append(time.perf_counter() - t0)
                sampled = len(samples)
            return {
                "threads": len(agent.cache.tasks),
                "processes": len(procs),
                "tick_ms": [1000 * x for x in tick],
                "worst_ms": [1000 * x for x in worst],
                "worst_sampled": sampled,
            }
    finally:
        helpers.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1000,10000,100000")
    ap.add_argument("--ticks", type=int, default=20)
    args = ap.parse_args()
    counts = [int(x.replace("k", "000")) for x in args.threads.split(",")]
    _subreaper()
    limits = Limits()
    try:
        for n in counts:
            limits.ensure(n)
            r = measure(n, args.ticks)
            print(
                f"{r['threads']:>7} threads in {r['processes']:>5} processes: tick median "
                f"{statistics.median(r['tick_ms']):.1f} ms (max {max(r['tick_ms']):.1f}); "
                f"every thread sampled ({r['worst_sampled']}): median "
                f"{statistics.median(r['worst_ms']):.0f} ms (max {max(r['worst_ms']):.0f}), "
                f"{1e3 * statistics.median(r['worst_ms']) / max(1, r['worst_sampled']):.1f} us "
                "a thread",
                flush=True,
            )
    finally:
        limits.restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())

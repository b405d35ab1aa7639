"""The agent's event pass on new threads, in-process: what a storm costs hostd per thread.

bench/reaction.py measures the storm end to end (creators and agent sharing the machine,
threads that check themselves); this times only the agent's side, in one process, so that a
change to the storm path can be judged in a minute and in microseconds. A helper process named
``bench_hot`` (the hot layer of bench/reaction_policy.toml) holds waves of ``--threads`` fresh
threads, each wave born unplaced (the helper puts itself back to all CPUs, SCHED_OTHER, nice 0
and its own cpuset first, as reaction.py's creators do). An ``Agent`` scoped to the helper makes
its first pass, then for each wave gets the threads' fork events (one event pass, and more while
threads wait in the backlog: ``READ_CHUNK`` a pass) and, once the helper ended them, their exit
events. The first wave warms up and is not counted.

    sudo python3 bench/event_pass.py                  # 40 waves of 256 threads
    sudo python3 bench/event_pass.py --phases         # + where the time goes, per thread
    sudo python3 bench/event_pass.py --profile        # + cProfile of the passes (slower;
                                                      # SORT=cumulative TOP=60 to choose)

Prints microseconds per thread of the fork passes (the fastest wave, the median wave, all) and
of the exit passes, the collector's time, and what the last wave's knobs came to. The
collector runs as in the agent (``hostd.agent.loop`` sets its thresholds; the first pass is
frozen). Everything is undone at the end: the agent restores what it changed, the helper ends,
the temporary state and run folders go. Never part of the test suite (see bench/README.md).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import hostd.reconcile  # noqa: E402
from hostd import journal, tasks  # noqa: E402
from hostd.agent import core, incremental, loop  # noqa: E402
from hostd.agent.core import Agent  # noqa: E402
from hostd.host import Host  # noqa: E402
from hostd.host.connector import Event  # noqa: E402
from hostd.reconcile import restore  # noqa: E402

HELPER = r"""
import os, sys, threading, ctypes
ctypes.CDLL(None).prctl(15, b"bench_hot", 0, 0, 0)  # PR_SET_NAME
cpus = set(range(os.cpu_count()))
me = [line.rstrip("\n").split(":", 2) for line in open("/proc/self/cgroup")]
v1 = [path for _, ctrls, path in me if "cpuset" in ctrls.split(",")]
home = ("/sys/fs/cgroup/cpuset" + v1[0].rstrip("/") + "/tasks") if v1 else (
    "/sys/fs/cgroup" + me[0][2].rstrip("/") + "/cgroup.threads")
print("ready", flush=True)
go, threads = None, []
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "spawn":  # unplaced first: the wave is born with the wrong settings
        try:
            with open(home, "w") as fh:
                fh.write(str(threading.get_native_id()))
        except OSError:
            pass
        os.sched_setaffinity(0, cpus)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, 0)
        go, tids, started = threading.Event(), [], threading.Semaphore(0)
        def body():
            tids.append(threading.get_native_id())
            started.release()
            go.wait()
        threads = [threading.Thread(target=body) for _ in range(int(cmd[1]))]
        for t in threads:
            t.start()
        for _ in threads:
            started.acquire()
        print(" ".join(map(str, tids)), flush=True)
    elif cmd[0] == "end":
        go.set()
        for t in threads:
            t.join()
        print("ok", flush=True)
"""

PHASES = (
    (core.Agent, "event_pass"), (core.Agent, "reconcile"), (incremental.Incremental, "read"),
    (incremental.Incremental, "classify"), (incremental.Incremental, "decide"),
    (incremental.Incremental, "note_applied"), (hostd.reconcile, "prepare"),
    (hostd.reconcile, "finish"), (journal.Journal, "record"), (journal.Journal, "done"),
    (tasks.TaskCache, "refresh"), (core.Agent, "close_exited"),
)  # fmt: skip


def _timed(spent: Counter, owner: object, name: str) -> None:
    fn = getattr(owner, name)
    label = f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"  # type: ignore[attr-defined]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=256, help="threads a wave (default 256)")
    ap.add_argument("--waves", type=int, default=40, help="waves, the first not counted")
    ap.add_argument("--phases", action="store_true", help="time the pass's parts")
    ap.add_argument("--profile", action="store_true", help="cProfile the passes")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (it changes real threads)", file=sys.stderr)
        return 2
    spent: Counter = Counter()
    if args.phases:
        for owner, name in PHASES:
            _timed(spent, owner, name)
    collected: Counter = Counter()
    began: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            collected[info["generation"]] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)
    old_threshold = gc.get_threshold()
    gc.set_threshold(*loop.GC_THRESHOLD)
    helper = subprocess.Popen(
        [sys.executable, "-c", HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdout.readline()
    scratch = Path(tempfile.mkdtemp(prefix="hostd-event-pass-"))
    agent = Agent(
        Host("/"), str(ROOT / "bench" / "reaction_policy.toml"), state_dir=scratch / "state",
        run_dir=scratch / "run", scope=[helper.pid],
    )  # fmt: skip
    profile = cProfile.Profile() if args.profile else None
    fork_s, exit_s, counted, per_wave = 0.0, 0.0, 0, []
    outcomes: Counter = Counter()
    try:
        agent.pass_once("start")
        gc.collect()
        gc.freeze()
        spent.clear()
        collected.clear()
        for wave in range(args.waves):
            helper.stdin.write(f"spawn {args.threads}\n")
            helper.stdin.flush()
            tids = [int(t) for t in helper.stdout.readline().split()]
            born = time.monotonic_ns()  # (after the wave: as the kernel stamps each fork)
            forks = [Event("fork", tid, helper.pid, helper.pid, "", born) for tid in tids]
            if profile and wave:
                profile.enable()
            t0 = time.perf_counter()
            results = agent.event_pass(forks).results
            while agent.inc.backlog:
                results += agent.event_pass([]).results
            t1 = time.perf_counter()
            if profile:
                profile.disable()
            helper.stdin.write("end\n")
            helper.stdin.flush()
            helper.stdout.readline()
            exits = [Event("exit", tid, helper.pid) for tid in tids]
            if profile and wave:
                profile.enable()
            t2 = time.perf_counter()
            agent.event_pass(exits)
            agent.close_exited()  # (the agent's loop does it once no event waits)
            t3 = time.perf_counter()
            if profile:
                profile.disable()
            if wave == 0:  # warming up
                spent.clear()
                collected.clear()
                continue
            fork_s, exit_s, counted = fork_s + t1 - t0, exit_s + t3 - t2, counted + len(tids)
            per_wave.append((t1 - t0) / len(tids) * 1e6)
            outcomes = Counter((r.key.rsplit("/", 1)[1], r.outcome) for r in results)
    finally:
        helper.stdin.close()
        helper.wait()
        restore(agent.host, agent.journal)
        agent.journal.close()
        agent.status.close()
        shutil.rmtree(scratch, ignore_errors=True)
        gc.set_threshold(*old_threshold)
    per_wave.sort()
    gc_us = sum(collected.values()) / counted * 1e6
    print(
        f"{args.waves - 1} waves of {args.threads} new threads: fork passes "
        f"{per_wave[0]:.1f} (fastest wave) / {per_wave[len(per_wave) // 2]:.1f} (median) / "
        f"{fork_s / counted * 1e6:.1f} (all) us a thread; exit passes "
        f"{exit_s / counted * 1e6:.1f} us a thread; collector {gc_us:.2f} us a thread"
    )
    print("last wave:", ", ".join(f"{k} {o} {n}" for (k, o), n in sorted(outcomes.items())))
    for label, seconds in spent.most_common():
        print(f"  {label:28s} {seconds / counted * 1e6:6.1f} us a thread")
    if profile:
        order, top = os.environ.get("SORT", "tottime"), int(os.environ.get("TOP", "30"))
        pstats.Stats(profile).sort_stats(order).print_stats(top)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A soak: the agent under churn, renames, scrapes and job starts and stops for a long while, its
own cost sampled all along, and every original back after the stop (issue 44, item 15).

    sudo python3 bench/soak.py --minutes 60 --write RELIABILITY.md

``hostd run`` on its default policy (the whole host) while, round after round: a stand-in
training job (tests/workload.py) starts and stops; a process makes and ends 200 short threads; a
thread renames itself 20,000 times; 20 scrapes of the metrics port, and 20 connections opened
and left idle until the next round. Every 10 s: the agent's open files, threads, resident memory
and CPU. At the end one job stays, its threads' scheduling and affinity are compared before
the agent started and after it stopped, and the journal must be gone. Never part of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.workload import TrainingJob  # noqa: E402

SECTION = "## Soak (bench/soak.py)"
CHURN = textwrap.dedent(
    """
    import threading, time
    for _ in range(200):
        t = threading.Thread(target=time.sleep, args=(0.01,))
        t.start()
        t.join()
    """
)
RENAMES = textwrap.dedent(
    """
    import threading
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
        for i in range(20000):
            fh.write(f"soak{i % 100}")
            fh.flush()
    """
)


def agent_cost(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "rss_mb": round(rss / 1024, 1),
        "cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
    }


def thread_state(pids: list[int]) -> dict:
    state = {}
    for pid in pids:
        for tid in map(int, os.listdir(f"/proc/{pid}/task")):
            with contextlib.suppress(OSError):
                state[tid] = (
                    os.sched_getscheduler(tid),
                    os.getpriority(os.PRIO_PROCESS, tid),
                    tuple(sorted(os.sched_getaffinity(tid))),
                )
    return state


def round_of_load(port: int, idle: list[socket.socket]) -> None:
    with TrainingJob(ranks=1, workers=1):
        time.sleep(2)
    subprocess.run([sys.executable, "-c", CHURN], check=False)
    subprocess.run([sys.executable, "-c", RENAMES], check=False)
    for c in idle:
        c.close()
    idle.clear()
    for _ in range(20):
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        with contextlib.suppress(OSError):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench/soak.py needs root: the agent")
    samples: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hostd-soak-") as tmp, TrainingJob(2, 1) as kept:
        before = thread_state(kept.pids)
        run, state = Path(tmp) / "run", Path(tmp) / "state"
        with open(Path(tmp) / "agent.log", "w") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "hostd", "run", "--run-dir", str(run), "--state-dir",
                 str(state)], stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
            )  # fmt: skip
        try:
            while not (run / "status.json").exists():
                time.sleep(0.2)
            url = json.loads((run / "status.json").read_text())["metrics"]
            port = urllib.parse.urlparse(url).port
            stop, idle = threading.Event(), []

            def sampler() -> None:
                t0 = time.monotonic()
                while not stop.wait(10):
                    samples.append({"t": round(time.monotonic() - t0), **agent_cost(agent.pid)})

            watch = threading.Thread(target=sampler, daemon=True)
            watch.start()
            end, rounds = time.monotonic() + args.minutes * 60, 0
            while time.monotonic() < end:
                round_of_load(port, idle)
                rounds += 1
            stop.set()
            for c in idle:
                c.close()
        finally:
            agent.terminate()
            code = agent.wait(timeout=300)
        after = thread_state(kept.pids)
        text = (Path(tmp) / "agent.log").read_text()
        journal_left = (state / "journal.jsonl").exists()
    changed = sum(1 for tid, st in before.items() if after.get(tid) != st)
    first, last = samples[len(samples) // 10], samples[-1]
    cpu = (last["cpu_s"] - first["cpu_s"]) / max(1, last["t"] - first["t"])
    summary = {
        "minutes": args.minutes, "rounds": rounds, "exit": code, "journal_left": journal_left,
        "threads_left_changed": changed, "errors": text.count(" ERROR "),
        "fds": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
        "threads": [min(s["threads"] for s in samples), max(s["threads"] for s in samples)],
        "rss_mb": [first["rss_mb"], max(s["rss_mb"] for s in samples), last["rss_mb"]],
        "cpu_share": round(cpu, 3),
    }  # fmt: skip
    print(json.dumps(summary))
    if args.write:
        row = (
            f"`sudo python3 bench/soak.py --minutes {args.minutes:g}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs: "
            f"{rounds} rounds (a job started and stopped, 200 short threads, 20,000 renames, 20 "
            "scrapes and 20 idle connections each). The agent's open files "
            f"{summary['fds'][0]}-{summary['fds'][1]}, threads {summary['threads'][0]}-"
            f"{summary['threads'][1]}, resident memory {summary['rss_mb'][0]} MB (after the "
            f"first tenth) / {summary['rss_mb'][1]} MB at most / {summary['rss_mb'][2]} MB at "
            f"the end, CPU {summary['cpu_share']:.1%} of one CPU; exit {code}, errors logged "
            f"{summary['errors']}, journal left {'yes' if journal_left else 'no'}, threads of "
            f"the job that stayed left changed {changed}."
        )
        path = args.write
        old = path.read_text()
        if SECTION in old:
            start = old.index(SECTION)
            stop_at = old.find("\n## ", start + len(SECTION))
            old = old[:start] + (old[stop_at + 1 :] if stop_at >= 0 else "")
        path.write_text(old.rstrip("\n") + f"\n\n{SECTION}\n\n{row}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Churn: the agent under thousands of short-lived threads in hundreds of processes.

    sudo python3 bench/churn.py [--processes 200] [--threads 25] [--write RELIABILITY.md]

A stand-in launcher that looks like torchrun on a node (``python3 .../torchrun ...``, renamed
``pt_elastic`` once it runs) starts ``--processes`` ranks, one after another, as torchrun does:
each leads a session of its own with torchrun's environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``TORCHELASTIC_RUN_ID``, ...) and execs python, which starts
``--threads`` threads named
``pt_gloo_runloop`` that live ``--life`` seconds, then exits. So the agent (``hostd run``,
the shipped policy with the ranks' weight always given, ``[preempt] weigh_job = "always"``, as
it shipped until 2026-11-28: without a busy competitor the default gives a job on a 2-CPU host
nothing to change; scoped to the launcher's tree, temporary folders) sees every child become a
rank (trainer: its session weighed nice -5, journaled, restored) and every thread become comms,
and all of them exit again. Reported: the agent's errors (ERROR lines, tracebacks), its CPU
time over the churn as a share of one CPU, its RSS at the start, highest and end, its action
counts, and whether the stop restored everything (an empty journal). A run in which the agent
applied nothing fails: it saw no job. Never part of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hostd.policy import default_policy_bytes  # noqa: E402

SECTION = "## Churn (bench/churn.py)"
CLK = os.sysconf("SC_CLK_TCK")

# What torchrun gives each rank (not itself: the launcher has none of it), without which the
# default policy sees no job: no rank, no trainer, no comms, nothing to apply.
RANK_ENV = {
    "LOCAL_RANK": "0", "RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0", "ROLE_NAME": "default",
    "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "churn",
    "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1",
}  # fmt: skip

RANK = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL(None)
per, life = int(sys.argv[1]), float(sys.argv[2])
def work():
    libc.prctl(15, b"pt_gloo_runloop", 0, 0, 0)
    time.sleep(life)
ts = [threading.Thread(target=work) for _ in range(per)]
for t in ts: t.start()
for t in ts: t.join()
"""

LAUNCHER = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None)
libc.prctl(15, b"pt_elastic", 0, 0, 0)
n, per, life, rank = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
env = {**os.environ, **json.loads(sys.argv[5])}
sys.stdin.readline()  # the agent is up
for _ in range(n):
    pid = os.fork()
    if pid == 0:  # a rank, as torchrun starts one: a session of its own, python exec'd
        try:
            os.setsid()
            os.execve(sys.executable, [sys.executable, "-c", rank, per, str(life)], env)
        finally:
            os._exit(127)  # never back into the launcher's loop
    time.sleep(life / 4)
    os.waitpid(-1, os.WNOHANG)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print("done", flush=True)
"""


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="hostd-churn-") as tmp:
        policy = Path(tmp) / "policy.toml"
        policy.write_bytes(
            default_policy_bytes().replace(
                b'weigh_job = "while-needed"\n', b'weigh_job = "always"\n'
            )
        )
        script = Path(tmp) / "torchrun"  # as torchrun's console script runs: python3 .../torchrun
        script.write_text(LAUNCHER)
        launcher = subprocess.Popen(
            [sys.executable, str(script), str(args.processes), str(args.threads),
             str(args.life), RANK, json.dumps(RANK_ENV)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        log = Path(tmp) / "agent.log"
        with open(log, "w") as err:  # the agent keeps its own copy of the fd
            agent = subprocess.Popen(
                [sys.executable, "-m", "hostd", "run", "--policy", str(policy),
                 "--state-dir", f"{tmp}/state",
                 "--run-dir", f"{tmp}/run", "--scope-pid", str(launcher.pid)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
            )  # fmt: skip
        status = Path(tmp) / "run" / "status.json"
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        rss0, cpu0, t0 = _rss_mib(agent.pid), _cpu(agent.pid), time.monotonic()
        peak = rss0
        launcher.stdin.write("go\n")
        launcher.stdin.flush()
        while launcher.poll() is None:
            peak = max(peak, _rss_mib(agent.pid))
            time.sleep(0.25)
        time.sleep(2)  # the agent catches up with the last exits
        cpu1, t1, rss1 = _cpu(agent.pid), time.monotonic(), _rss_mib(agent.pid)
        st = json.loads(status.read_text())
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
        text = log.read_text()
        journal = Path(tmp) / "state" / "journal.jsonl"
        return {
            "processes": args.processes,
            "threads": args.processes * args.threads,
            "seconds": round(t1 - t0, 1),
            "cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3),
            "rss_mib": [round(rss0, 1), round(peak, 1), round(rss1, 1)],
            "errors": text.count(" ERROR ") + text.count("Traceback"),
            "counters": st.get("events", {}),
            "exit": agent.returncode,
            "journal_left": journal.exists(),
        }


def render(r: dict) -> str:
    counters = ", ".join(f"{k} {v}" for k, v in sorted(r["counters"].items())) or "none"
    return (
        f"{SECTION}\n\n"
        f"`sudo python3 bench/churn.py --processes {r['processes']}` on "
        f"this host ({os.cpu_count()} CPUs, kernel "
        f"{platform.release()}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{r['threads']:,} threads in {r['processes']} processes over {r['seconds']} s.\n\n"
        "| errors | agent CPU (share of one CPU) | agent RSS MiB: start / highest / end | "
        "exit | journal left after the stop |\n|---:|---:|---|---:|---|\n"
        f"| {r['errors']} | {r['cpu_share']:.1%} | {' / '.join(map(str, r['rss_mib']))} | "
        f"{r['exit']} | {'yes' if r['journal_left'] else 'no'} |\n\n"
        f"The agent's event and action counters at the end: {counters}.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=200)
    ap.add_argument("--threads", type=int, default=25)
    ap.add_argument("--life", type=float, default=0.4, help="seconds each thread lives")
    ap.add_argument("--write", type=Path, help="replace the section in this file")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/churn.py needs root (the agent changes the churn's threads)")
    result = run(args)
    text = render(result)
    print(text)
    if not result["counters"].get("applied"):  # a churn the policy does not see measures nothing
        sys.exit("bench/churn.py: the agent applied nothing: it saw no job in the churn")
    if args.write:
        doc = args.write.read_text()
        if SECTION in doc:
            head, _, rest = doc.partition(SECTION)
            tail = rest[rest.find("\n## ") :] if "\n## " in rest else "\n"
            doc = head + text + tail
        else:
            doc = doc.rstrip("\n") + "\n\n" + text
        args.write.write_text(doc)


if __name__ == "__main__":
    main()

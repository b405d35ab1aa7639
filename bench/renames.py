"""What one thread renaming itself in a loop costs the agent (issue 44.10).

    sudo python3 bench/renames.py --threads 20000 --seconds 20 --write BENCHMARKS.md
    sudo python3 bench/renames.py --hostd-src /path/to/another/checkout ...   # the same, older

A tree of idle threads (``--threads``, so that a full pass costs what it costs on a busy host)
and ``hostd run`` on its default policy (the whole host) start first; once the agent is past its
first pass, one process renames one of its threads as fast as it can for ``--seconds``. Reported:
the agent's CPU time over the storm (a share of one CPU), its event-buffer overflows, full passes
and rename storms (its status), and the renames made. ``--hostd-src``: run the agent from
another checkout (``PYTHONPATH``), for the code before a change. Never part of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE / "trainer"))

from run import write_section  # noqa: E402

from hostd.demo import kill_session  # noqa: E402

SECTION = "## A rename storm (bench/renames.py)"
IDLE = textwrap.dedent(
    """
    import sys, threading
    n = int(sys.argv[1])
    ev = threading.Event()
    for _ in range(n):
        threading.Thread(target=ev.wait, daemon=True).start()
    print("ready", flush=True)
    ev.wait()
    """
)
RENAMER = textwrap.dedent(
    """
    import sys, threading, time
    end = time.monotonic() + float(sys.argv[1])
    n = 0
    def loop():
        global n
        path = f"/proc/self/task/{threading.get_native_id()}/comm"
        with open(path, "w") as fh:
            while time.monotonic() < end:
                fh.write(f"r{n % 1000}")
                fh.flush()
                n += 1
    t = threading.Thread(target=loop)
    t.start()
    t.join()
    print(n, flush=True)
    """
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(run: Path) -> dict:
    try:
        return json.loads((run / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def one(args: argparse.Namespace, work: Path) -> dict:
    per = 1000
    idle = [
        subprocess.Popen([sys.executable, "-c", IDLE, str(per)], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
        for _ in range(max(1, args.threads // per))
    ]  # fmt: skip
    for p in idle:
        p.stdout.readline()
    env = dict(os.environ)
    if args.hostd_src:
        env["PYTHONPATH"] = str(args.hostd_src)
    run, state = work / "run", work / "state"
    with open(work / "agent.log", "w") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "hostd", "run", "--run-dir", str(run), "--state-dir",
             str(state)],
            env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=args.hostd_src or REPO,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while status(run).get("passes", 0) < 1:
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError((work / "agent.log").read_text()[-2000:])
            time.sleep(0.2)
        time.sleep(2)
        before, t0 = cpu_seconds(agent.pid), time.monotonic()
        ev0 = status(run).get("events", {})
        renamer = subprocess.run(
            [sys.executable, "-c", RENAMER, str(args.seconds)], capture_output=True, text=True
        )
        spent, took = cpu_seconds(agent.pid) - before, time.monotonic() - t0
        time.sleep(1.5)  # the status file, written at most once a second
        ev1 = status(run).get("events", {})
    finally:
        agent.terminate()
        agent.wait(timeout=120)
        for p in idle:
            kill_session(p)
    return {
        "renames": int(renamer.stdout.strip() or 0),
        "cpu_share": spent / took,
        **{k: ev1.get(k, 0) - ev0.get(k, 0) for k in
           ("overflows", "full_passes", "rename_storms", "event_passes")},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hostd-src", type=Path, help="run the agent from this checkout")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--write", type=Path)
    ap.add_argument("--append", action="store_true", help="add rows to the section's table")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench/renames.py needs root: the agent")
    rows = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="hostd-renames-") as tmp:
            r = one(args, Path(tmp))
        rows.append(r)
        print(json.dumps({"rep": rep, **r}), flush=True)
    lines = [
        f"| {args.label} | {args.threads} | {r['renames']} | {r['cpu_share']:.2f} | "
        f"{r['overflows']} | {r['full_passes']} | {r['rename_storms']} |"
        for r in rows
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        old = args.write.read_text()
        if args.append and SECTION in old:
            start = old.index(SECTION)
            end = old.find("\n## ", start + len(SECTION))
            end = len(old) if end < 0 else end + 1
            block = old[start:end].rstrip("\n") + "\n" + text
            args.write.write_text(old[:start] + block + old[end:])
        else:
            head = (
                f"{SECTION}\n\nOne thread renames itself as fast as it can for {args.seconds:g} s "
                f"next to {args.threads} idle threads, under `hostd run` (default policy, whole "
                f"host); machine: {os.cpu_count()} CPUs, kernel {os.uname().release}, "
                f"{time.strftime('%Y-%m-%d', time.gmtime())}. `sudo python3 bench/renames.py "
                f"--threads {args.threads} --seconds {args.seconds:g}` (`--hostd-src` for the "
                "code before).\n\n| agent | threads | renames | agent CPU (share of one CPU) "
                "| overflows | full passes | rename storms |\n|---|---:|---:|---:|---:|---:|---:|\n"
            )
            write_section(args.write, head + text, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The A/B rollout, end to end: the trainer benchmark's job run as several attempts under CPU
contention, half opted out of hostd's protection, then ``hostd report`` on what the agent
recorded.

    sudo python3 bench/ab.py --python /path/to/venv/bin/python --write BENCHMARKS.md \\
        --picture docs/report-trainer-ab.png --html /tmp/hostd-report.html

``--python`` is an interpreter with bench/trainer/requirements.txt (the CPU build of torch). One
``hostd run`` (the embedded default policy, unchanged, whole host, its state in a temporary
folder) and one ``stress-ng --cpu 2N`` run throughout. Each attempt is ``torchrun
--nproc-per-node 2 bench/trainer/train.py`` with ``HOSTD_JOB=trainer-ab`` and
``HOSTD_THROUGHPUT_FILE`` (rank 0 writes its steps/s there every second) in its environment, and
``HOSTD_PROTECT=1`` or ``0``, in the order P U U P P U ... (so that a drift of the machine
shifts both arms alike). Each attempt's own count of steps/s (train.py's ``--out``) is kept
beside what hostd recorded, to check the record. Results go to stdout and, with ``--write
FILE``, replace the section "## A/B report on the trainer job" of FILE. Never part of the tests
(tests/privileged/test_attempts.py checks the record with a stand-in job).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))
import scan as scanbench  # noqa: E402  (bench/scan.py: write_section)

from hostd.demo import AgentProc, Contention, kill_session  # noqa: E402
from hostd.report import compare, load_attempts, render_html, save_figure, summarise  # noqa: E402

TRAIN = REPO / "bench" / "trainer" / "train.py"
SECTION = "## A/B report on the trainer job"
JOB = "trainer-ab"


def order(n: int) -> list[bool]:
    """P U U P P U U P ...: protected or not, attempt by attempt."""
    return [(i + 1) // 2 % 2 == 0 for i in range(n)]


def attempt(args: argparse.Namespace, workdir: Path, protect: bool, index: int) -> dict:
    out, rate = workdir / f"result-{index}.json", workdir / f"rate-{index}"
    cmd = [
        args.python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(29500 + index), str(TRAIN),
        "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--out", str(out),
    ]  # fmt: skip
    env = {
        **os.environ, "PYTHONWARNINGS": "ignore", "HOSTD_JOB": JOB,
        "HOSTD_THROUGHPUT_FILE": str(rate), "HOSTD_PROTECT": "1" if protect else "0",
    }  # fmt: skip
    started = time.time()
    with open(workdir / f"job-{index}.log", "w") as log:
        job = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=log, env=env)  # fmt: skip
        try:
            job.wait(timeout=args.seconds + args.warmup + 240)
        finally:
            kill_session(job)
    result = json.loads(out.read_text()) if out.exists() else {}
    return {"index": index, "protect": protect, "start": started,
            "steps_per_s": result.get("steps_per_s")}  # fmt: skip


def section(runs: list[dict], comparison: dict, summaries: list[dict], args) -> str:
    own = {round(r["start"]): r for r in runs}
    lines = [
        SECTION,
        "",
        f"`sudo python3 bench/ab.py --python VENV/bin/python --attempts {args.attempts} "
        f"--seconds {args.seconds:g}` on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} CPUs, {platform.release()}), {time.strftime('%Y-%m-%d')}: the "
        "trainer benchmark's job (2 ranks, DDP over gloo, 2 DataLoader workers each) under "
        f"`stress-ng --cpu {2 * (os.cpu_count() or 1)}`, one `hostd run` with the embedded "
        "default policy throughout, attempts alternating P U U P P U (`HOSTD_PROTECT=1`/`0`, "
        f"`HOSTD_JOB={JOB}`). Then `hostd report`. Its verdict:",
        "",
        f"> {comparison.get('verdict', '')}",
        "",
        "| attempt | protected (recorded) | steps/s (job's own count) | steps/s (hostd's record) "
        "| job threads' run-queue wait share |",
        "|---:|:---:|---:|---:|---:|",
    ]
    for i, s in enumerate(sorted(summaries, key=lambda s: s["start"] or 0), 1):
        mine = min(own.values(), key=lambda r: abs(r["start"] - (s["start"] or 0)))
        steps = mine["steps_per_s"]
        tp = s.get("throughput")
        share = s.get("wait_share")
        lines.append(
            f"| {i} | {'yes' if s['protected'] else 'no'} | "
            f"{'-' if steps is None else f'{steps:.2f}'} | {'-' if tp is None else f'{tp:.2f}'}"
            f" | {'-' if share is None else f'{share:.0%}'} |"
        )
    diffs = []
    for s in summaries:
        mine = min(own.values(), key=lambda r: abs(r["start"] - (s["start"] or 0)))
        if s.get("throughput") and mine["steps_per_s"]:
            diffs.append(abs(s["throughput"] / mine["steps_per_s"] - 1))
    if diffs:
        lines += [
            "",
            f"hostd's record of each attempt's throughput (the median of its 5 s samples of "
            f"what rank 0 wrote, the first left out) is within {max(diffs):.0%} of the job's "
            f"own count (median {statistics.median(diffs):.1%}).",
        ]
    lines += [
        "",
        f"![the report's first plot]({args.picture})" if args.picture else "",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="an interpreter with torch")
    ap.add_argument("--attempts", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--write", type=Path, help="replace the section in this Markdown file")
    ap.add_argument("--picture", help="save the report's first plot here (PNG)")
    ap.add_argument("--html", type=Path, help="write the HTML report here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/ab.py runs hostd for real: run it as root")
    with tempfile.TemporaryDirectory(prefix="hostd-ab-") as tmp:
        workdir = Path(tmp)
        agent = AgentProc(workdir / "agent")
        contention = Contention(2 * (os.cpu_count() or 1))
        runs = []
        try:
            agent.wait_passes(1)
            for index, protect in enumerate(order(args.attempts), 1):
                runs.append(attempt(args, workdir, protect, index))
                print(json.dumps(runs[-1]), flush=True)
                time.sleep(12)  # two samples: the agent sees the attempt end
        finally:
            contention.stop()
            agent.stop()
        attempts, warnings = load_attempts(agent.state / "attempts")
        for w in warnings:
            print("warning:", w, file=sys.stderr)
        ours = [a for a in attempts if a.get("job") == JOB]
        comparison = compare(ours, job=JOB)
        summaries = [summarise(a) for a in ours]
        print(json.dumps(comparison, indent=1, default=str))
        if args.html:
            args.html.write_text(render_html([comparison], summaries))
        if args.picture:
            save_figure(comparison, args.picture)
        if args.write:
            scanbench.write_section(args.write, section(runs, comparison, summaries, args), SECTION)


if __name__ == "__main__":
    main()

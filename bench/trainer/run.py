"""The trainer benchmark: PyTorch DDP steps/s under CPU contention, seven arms side by side.

    sudo python3 bench/trainer/run.py --python /path/to/venv/bin/python --write BENCHMARKS.md

``--python`` is an interpreter with ``pip install -r bench/trainer/requirements.txt`` (the CPU
build of torch 2.13.0). Each repetition runs every arm once, in a rotated order (interleaved,
so that a machine that gets slower or faster over the run shifts every arm alike):

- ``alone``: the job (``torchrun --nproc-per-node 2 bench/trainer/train.py``) and nothing else;
- ``alone+hostd``: the same with ``hostd run`` (embedded default policy, the whole host);
- ``contended``: ``stress-ng --cpu 2N`` (N = online CPUs) in a session of its own;
- ``contended+hostd``: the shipped default policy, unchanged, host-wide, started before the job;
- ``contended+nice``: what ananicy-style tools do: nice -10 for every thread of the job's
  processes and nice 19 for the stressors, by process name, re-applied every 2 s;
- ``contended+tuned``: tuned's scheduler plugin with ``bench/tuned/hostd-trainer``;
- ``contended+pinned``: launch-time pinning: each rank (and the DataLoader workers it forks)
  bound with ``numactl --physcpubind`` (``taskset`` without numactl) to its share of the CPUs,
  what torchrun's NUMA binding and similar launch wrappers do.

In every arm a "system service" runs: a process in its own session and, where systemd's named
v1 hierarchy is mounted, in the cgroup ``/system.slice/hostd-bench-probe.service`` (created for
the run, removed after). It asks for a 2 ms slice of CPU work every 50 ms (4 % of a CPU) and
reports which fraction of those it got done (1.00: it kept up) and how far it fell behind.

While the job counts steps, ``hostd.stats.measure`` (what ``hostd stats`` prints) samples every
thread of the host for half the measured time and reports, per layer of the default policy, CPU,
run-queue wait share and involuntary switches: the "why" of each arm.

Steps/s of each arm is divided by the ``alone`` arm of the same repetition; the table gives the
median and the range over repetitions. Results go to stdout and, with ``--write FILE``, replace
the section "## Trainer throughput under contention" of FILE. Never part of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hostd.demo import (  # noqa: E402
    AgentProc,
    Contention,
    busy,
    calibrate,
    kill_session,
    layer_summary,
)
from hostd.host import Host  # noqa: E402
from hostd.policy import load_default  # noqa: E402
from hostd.stats import measure  # noqa: E402
from hostd.tasks import descendants  # noqa: E402

ARMS = (
    "alone",
    "alone+hostd",
    "contended",
    "contended+hostd",
    "contended+nice",
    "contended+tuned",
    "contended+pinned",
)
TRAIN = REPO / "bench" / "trainer" / "train.py"
TUNED_PROFILE = REPO / "bench" / "tuned" / "hostd-trainer"
TUNED_ETC = Path("/etc/tuned")
TUNED_STATE_FILES = ("active_profile", "profile_mode", "post_loaded_profile")
PROBE_CGROUP = Path("/sys/fs/cgroup/systemd/system.slice/hostd-bench-probe.service")
SECTION = "## Trainer throughput under contention"

PROBE = r"""
import json, signal, sys, time
chunk, period = int(sys.argv[1]), float(sys.argv[2])
def busy(n):
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc
done = late = 0
worst = 0.0
start = nxt = time.monotonic()
def report(*_):
    asked = max(1, int((time.monotonic() - start) / period))
    print(json.dumps({"asked": asked, "done": done, "late": late, "worst_ms": worst * 1000}))
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
while True:
    busy(chunk)
    done += 1
    now = time.monotonic()
    nxt += period
    if now > nxt:  # finished after the next slice was due: it fell behind
        late += 1
        worst = max(worst, now - nxt)
        nxt = now
    else:
        time.sleep(nxt - now)
"""


class Probe:
    """The system service stand-in (see the module docstring)."""

    def __init__(self, chunk: int, period: float = 0.05) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(chunk), str(period)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.cgroup = None
        if PROBE_CGROUP.parent.parent.is_dir():
            with contextlib.suppress(OSError):
                PROBE_CGROUP.mkdir(parents=True, exist_ok=True)
                (PROBE_CGROUP / "cgroup.procs").write_text(str(self.proc.pid))
                self.cgroup = "/system.slice/hostd-bench-probe.service"

    def stop(self) -> dict:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
            result = json.loads(out.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            self.proc.kill()
            self.proc.wait()
            result = {"asked": 0, "done": 0, "late": 0, "worst_ms": 0.0}
        if self.cgroup:
            with contextlib.suppress(OSError):
                PROBE_CGROUP.rmdir()
                PROBE_CGROUP.parent.rmdir()  # only if this run created system.slice and it is empty
        result["progress"] = min(1.0, result["done"] / result["asked"]) if result["asked"] else 0
        result["cgroup"] = self.cgroup
        return result


class Tuned:
    """tuned in the foreground with bench/tuned/hostd-trainer; /etc/tuned is put back after."""

    def __init__(self, workdir: Path) -> None:
        self.saved = {}
        for name in TUNED_STATE_FILES:
            path = TUNED_ETC / name
            self.saved[name] = path.read_bytes() if path.exists() else None
        self.profile = TUNED_ETC / TUNED_PROFILE.name
        shutil.copytree(TUNED_PROFILE, self.profile, dirs_exist_ok=True)
        self.log = workdir / "tuned.log"
        self.log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            ["tuned", "--profile", TUNED_PROFILE.name, "--no-dbus", "--no-socket",
             "--pid", str(workdir / "tuned.pid"), "--log", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "static tuning from profile" not in _text(self.log):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tuned did not apply its profile:\n{_text(self.log)[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
        for name, data in self.saved.items():
            path = TUNED_ETC / name
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(data)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def renice_loop(launcher: int, contention: Contention, stop: threading.Event) -> None:
    """ananicy-style rules: every thread of the job's processes nice -10, the stressors 19."""
    while not stop.is_set():
        for pids, nice in ((descendants(Host(), [launcher]), -10), (contention.pids(), 19)):
            for pid in pids:
                with contextlib.suppress(OSError):
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        with contextlib.suppress(OSError):
                            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        stop.wait(2.0)


def pinned_wrapper(workdir: Path, python: str, ranks: int) -> list[str]:
    """A --no-python entry point binding each rank to its share of the CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // ranks)
    binder = (
        "numactl --physcpubind={cpus} --localalloc"
        if shutil.which("numactl")
        else "taskset -c {cpus}"
    )
    script = workdir / "pinned.py"
    script.write_text(
        "import os, sys\n"
        f"cpus = {cpus!r}\nshare = {share}\n"
        "r = int(os.environ['LOCAL_RANK'])\n"
        "mine = ','.join(str(c) for c in cpus[r * share:(r + 1) * share] or cpus)\n"
        f"argv = {binder!r}.format(cpus=mine).split() + [{python!r}] + sys.argv[1:]\n"
        "os.execvp(argv[0], argv)\n"
    )
    return ["--no-python", python, str(script), str(TRAIN)]


def run_arm(arm: str, args: argparse.Namespace, workdir: Path, chunk: int) -> dict:
    host, policy = Host(), load_default()
    ncpu = len(os.sched_getaffinity(0))
    probe = Probe(chunk)
    contention = Contention(2 * ncpu) if arm.startswith("contended") else None
    agent = tuned = None
    stop_nice = threading.Event()
    out = workdir / "result.json"
    out.unlink(missing_ok=True)
    job = None
    stats_box: list = []
    try:
        if arm.endswith("hostd"):
            agent = AgentProc(workdir / "agent")
            agent.wait_passes(1)
        elif arm.endswith("tuned"):
            tuned = Tuned(workdir)
        entry = [str(TRAIN)]
        if arm.endswith("pinned"):
            entry = pinned_wrapper(workdir, args.python, args.ranks)
        cmd = [
            args.python, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
            "--master-port", str(29500 + os.getpid() % 1000), *entry,
            "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--out", str(out),
            "--device", args.device,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        job = subprocess.Popen(
            cmd, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=open(workdir / "job.log", "w"), env=env,  # noqa: SIM115
        )  # fmt: skip
        if arm.endswith("nice"):
            assert contention is not None
            threading.Thread(
                target=renice_loop, args=(job.pid, contention, stop_nice), daemon=True
            ).start()

        def sample() -> None:
            # Wait for both ranks' DataLoader workers (the job is then past its imports).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and job.poll() is None:
                names = []
                for pid in descendants(host, [job.pid]):
                    with contextlib.suppress(OSError):
                        names.append(Path(f"/proc/{pid}/comm").read_text().strip())
                if names.count("pt_data_worker") >= args.ranks:
                    break
                time.sleep(0.2)
            time.sleep(args.warmup + args.seconds / 4)
            with contextlib.suppress(Exception):
                stats_box.append(measure(host, policy, args.seconds / 2, top=5))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        job.wait(timeout=args.seconds + args.warmup + 240)
        sampler.join(timeout=args.seconds)
    finally:
        stop_nice.set()
        if job is not None:
            kill_session(job)
        log = agent.stop() if agent is not None else ""
        if tuned is not None:
            tuned.stop()
        if contention is not None:
            contention.stop()
        probe_result = probe.stop()
    result = json.loads(out.read_text()) if out.exists() else {}
    stats = stats_box[0] if stats_box else None
    return {
        "arm": arm,
        "steps_per_s": result.get("steps_per_s"),
        "error": None if result else f"no result: {_text(workdir / 'job.log')[-1500:]}",
        "probe": probe_result,
        "layers": layer_summary(stats) if stats else {},
        "top": [
            {"comm": t.comm, "layer": t.layer, "wait_ms_per_s": round(t.rates.wait * 1000, 1)}
            for t in (stats.top if stats else ())
        ],
        "agent_errors": [ln for ln in log.splitlines() if " ERROR " in ln][:5],
    }


# -- reporting --------------------------------------------------------------------------------
def summarize(runs: list[dict], arms: list[str]) -> list[dict]:
    by_rep: dict[int, dict[str, dict]] = {}
    for r in runs:
        by_rep.setdefault(r["rep"], {})[r["arm"]] = r
    rows = []
    for arm in arms:
        rel, rates, probes = [], [], []
        layer_vals: dict[str, dict[str, list[float]]] = {}
        for rep in by_rep.values():
            r, alone = rep.get(arm), rep.get("alone")
            if not r or r["steps_per_s"] is None:
                continue
            rates.append(r["steps_per_s"])
            if alone and alone["steps_per_s"]:
                rel.append(r["steps_per_s"] / alone["steps_per_s"])
            probes.append(r["probe"]["progress"])
            for ly, vals in r["layers"].items():
                for k, v in vals.items():
                    layer_vals.setdefault(ly, {}).setdefault(k, []).append(v)
        med = {
            ly: {k: statistics.median(v) for k, v in vals.items()}
            for ly, vals in layer_vals.items()
        }
        rows.append(
            {
                "arm": arm,
                "n": len(rates),
                "steps_per_s": statistics.median(rates) if rates else None,
                "rel": statistics.median(rel) if rel else None,
                "rel_min": min(rel) if rel else None,
                "rel_max": max(rel) if rel else None,
                "probe": min(probes) if probes else None,
                "layers": med,
            }
        )
    return rows


def _f(v, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(rows: list[dict], runs: list[dict], args: argparse.Namespace, meta: dict) -> str:
    lines = [
        SECTION + " (bench/trainer/run.py)",
        "",
        "Goal (the trainer issue): under contention, hostd's shipped default policy reaches at "
        "least 0.97 of the job's speed alone, starves no data worker or comm thread, and a "
        "system service keeps getting CPU.",
        "",
        f"Machine: {meta['cpu']}, {meta['ncpu']} CPUs online, kernel {meta['kernel']}, "
        f"autogroups {'on' if meta['autogroup'] else 'off'}; Python {meta['python']}, torch "
        f"{meta['torch']}; hostd at `{meta['rev']}`; measured {meta['when']}.",
        "",
        f"Method: `python3 bench/trainer/run.py --reps {args.reps} --seconds {args.seconds:g} "
        f"--warmup {args.warmup:g} --device {args.device}` (see its docstring). The job: "
        "`torchrun --nproc-per-node "
        f"{args.ranks}` of bench/trainer/train.py (2-layer transformer, DDP over gloo, 2 "
        f"DataLoader worker processes per rank), steps counted for {args.seconds:g} s after "
        f"{args.warmup:g} s of warm-up. Contention: `stress-ng --cpu {2 * meta['ncpu']}` (2x the "
        "CPUs) in a session of its own. All arms interleaved in each of "
        f"{args.reps} repetitions (order rotated); `vs alone` is steps/s over the same "
        "repetition's `alone`, median [min-max]. `probe` is the least, over repetitions, of the "
        "system service's slices done over those it asked for (1.00: it kept up). Per-layer "
        "numbers are medians of `hostd stats` over half the measured time (layers of the default "
        "policy: trainer = rank threads, comms = gloo threads, data = DataLoader workers, "
        "rest = everything else, here the stressors): CPU/s, the share of runnable time spent "
        "waiting on a run queue, involuntary context switches/s.",
        "",
        "| arm | steps/s | vs alone | probe | trainer CPU/s | trainer wait | comms wait | "
        "data wait | trainer invol/s | comms invol/s | data invol/s | rest CPU/s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ly = r["layers"]

        def g(layer: str, key: str, fmt: str = "{:.2f}", ly: dict = ly) -> str:
            return _f(ly.get(layer, {}).get(key), fmt)

        rel = (
            f"{r['rel']:.2f} [{r['rel_min']:.2f}-{r['rel_max']:.2f}]"
            if r["rel"] is not None
            else "-"
        )
        lines.append(
            f"| {r['arm']} | {_f(r['steps_per_s'])} | {rel} | {_f(r['probe'])} | "
            f"{g('trainer', 'cpu')} | {g('trainer', 'wait_share', '{:.0%}')} | "
            f"{g('comms', 'wait_share', '{:.0%}')} | {g('data', 'wait_share', '{:.0%}')} | "
            f"{g('trainer', 'invol_per_s', '{:.0f}')} | {g('comms', 'invol_per_s', '{:.0f}')} | "
            f"{g('data', 'invol_per_s', '{:.0f}')} | {g('rest', 'cpu')} |"
        )
    lines += ["", "Every run (steps/s; probe: slices done / asked, worst lateness):", ""]
    lines += ["| rep | arm | steps/s | probe | worst late ms | most-waiting threads |"]
    lines += ["|---:|---|---:|---:|---:|---|"]
    for r in runs:
        top = ", ".join(f"{t['comm']} ({t['layer']}) {t['wait_ms_per_s']}" for t in r["top"][:3])
        lines.append(
            f"| {r['rep']} | {r['arm']} | {_f(r['steps_per_s'])} | "
            f"{r['probe']['done']}/{r['probe']['asked']} | {r['probe']['worst_ms']:.0f} | "
            f"{top or '-'}{' ERROR ' + r['error'][:200] if r['error'] else ''} |"
        )
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str, section: str = SECTION) -> None:
    """Replace the section of ``path`` that starts with ``section`` (up to the next "## ")
    with ``text``, or append ``text`` when there is none (also bench/trainer/matrix.py's)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    start = old.find(section)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(section))
        new = old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    path.write_text(new)


def meta(args: argparse.Namespace) -> dict:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    torch = subprocess.run(
        [args.python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    rev = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "ncpu": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch or "?",
        "rev": rev or "?",
        "autogroup": _text(Path("/proc/sys/kernel/sched_autogroup_enabled")).strip() == "1",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch 2.13.0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="the job's device")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of the arms")
    ap.add_argument("--write", type=Path, help="replace the section in this markdown file")
    ap.add_argument("--json", type=Path, help="also write every run as JSON here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/trainer/run.py needs root (hostd, tuned, nice -10, the probe's cgroup)")
    arms = [a.strip() for a in args.arms.split(",")]
    unknown = set(arms) - set(ARMS)
    if unknown:
        sys.exit(f"unknown arms {sorted(unknown)}; expected some of {list(ARMS)}")
    if "alone" not in arms:
        arms.insert(0, "alone")
    if "contended+tuned" in arms and shutil.which("tuned") is None:
        sys.exit("the tuned arm needs tuned (apt-get install tuned linux-perf)")
    info = meta(args)
    chunk = calibrate(2)
    busy(1)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hostd-trainer-bench-") as tmp:
        for rep in range(args.reps):
            order = arms[rep % len(arms) :] + arms[: rep % len(arms)]
            for arm in order:
                time.sleep(2)  # let the last arm's processes go
                r = run_arm(arm, args, Path(tmp), chunk)
                r["rep"] = rep + 1
                runs.append(r)
                print(
                    f"rep {rep + 1} {arm:20s} steps/s {_f(r['steps_per_s'])} probe "
                    f"{r['probe']['progress']:.2f} {r['error'] or ''}",
                    flush=True,
                )
    rows = summarize(runs, arms)
    text = render(rows, runs, args, info)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"meta": info, "runs": runs, "rows": rows}, indent=1))
    if args.write:
        write_section(args.write, text)


if __name__ == "__main__":
    main()

"""Which mechanism makes busy work yield to a job at once: measured, on cgroup v1 and v2.

    sudo python3 bench/preempt.py --json /tmp/v1.json   # this host, 5 repetitions
    sudo python3 tests/vm/vm.py exec python bench/preempt.py  # in the VM tier: cgroup v2

The job is a small C program (compiled here with gcc): one thread per online CPU, each step a
fixed slice of arithmetic (``--step-us``, 2 ms) and then a ``pthread_barrier_wait``, so every
step waits for the slowest thread, as OpenMP regions, collectives and DataLoader hand-offs do.
It runs in a session of its own and prints steps/s and its step time p50/p99. The contention is
another session (another tenant): ``2 x CPUs`` busy loops, or kernel-mode work
(``--competitor``, see ``competitor``). Arms, interleaved, rotated per
repetition (none needs hostd; each puts back what it changed):

- ``alone``; ``contended`` (nothing done);
- ``nice 19``: every competitor thread nice 19;
- ``SCHED_IDLE``: every competitor thread SCHED_IDLE (sched(7));
- ``session nice 19``: the competitors' autogroup nice 19 (/proc/PID/autogroup);
- ``SCHED_IDLE + session nice 19``: both: what hostd's preemption does;
- ``cgroup cpu.idle``: the competitors moved to a new cgroup with ``cpu.idle = 1`` (v1: a child
  of the cpu hierarchy's root; v2: a child of the root with the cpu controller enabled);
- ``cgroup min weight``: the same cgroup with ``cpu.shares = 2`` (v1) / ``cpu.weight = 1`` (v2);
- ``hostd``: the agent itself (``hostd run --policy bench/preempt_policy.toml``, scoped to this
  benchmark's process tree): a sleeping stand-in of the job (comm ``jobwait``, in the job's
  session and cgroup) starts first, the agent runs until it has demoted the busy loops, then
  the job runs; SIGTERM puts everything back.

The cgroup arms move the competitors out of the cgroup they were in (and out of their
autogroup, which applies only in the root cpu cgroup); hostd does that too, for processes of the
root cpu cgroup only (into its own ``/hostd.demoted``), since 2026-11-25.

``--job wakeup`` measures what a job's wake-ups wait instead of its steps: threads that sleep
1 ms and then work ``--step-us``/4, each wake-up's lateness (p50/p99/p99.9); ``--pin same`` /
``--pin apart`` put the competitors on CPU 0 and the job on CPU 0 too / on the other CPUs.

``--placement scopes`` starts the job and the competitors each in a cgroup of its own under a
common parent (as systemd puts login sessions and services into scopes and slices, and a
container runtime its containers): autogroups then do not apply, and the cgroup arms set
``cpu.idle`` / the least weight on the competitors' own cgroup instead of moving them.

Results: steps/s over the same repetition's ``alone``, median and worst, and step time p99, as
a markdown table on stdout (BENCHMARKS.md, "Preemptible work", holds the runs and what they
mean). Never part of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECTION = "## Preemptible work: which mechanism (bench/preempt.py)"
ARMS = (
    "alone",
    "contended",
    "nice 19",
    "SCHED_IDLE",
    "session nice 19",
    "SCHED_IDLE + session nice 19",
    "cgroup cpu.idle",
    "cgroup min weight",
    "hostd",
)
REPO = Path(__file__).resolve().parents[1]

JOB_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static pthread_barrier_t bar;
static double step_us, seconds;
static volatile int stop;
static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
static volatile unsigned long sink;
static unsigned long per_us;
static void work(double us) {
    unsigned long n = (unsigned long)(us * per_us), acc = 0;
    for (unsigned long i = 0; i < n; i++) acc = acc * 31 + i;
    sink = acc;
}
static double *times; static long nsteps, cap;
static void *run(void *arg) {
    long me = (long)arg; double start = now(), last = start;
    for (;;) {
        work(step_us);
        int r = pthread_barrier_wait(&bar);
        if (me == 0) {
            double t = now();
            if (nsteps < cap) times[nsteps] = t - last;
            nsteps++; last = t;
            if (t - start >= seconds) stop = 1;
        }
        pthread_barrier_wait(&bar);
        if (stop) return NULL;
        (void)r;
    }
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y);
}
int main(int argc, char **argv) {
    int threads = atoi(argv[1]); step_us = atof(argv[2]); seconds = atof(argv[3]);
    double t0 = now(); unsigned long n = 0;
    while (now() - t0 < 0.2) { work(0); for (int i = 0; i < 100000; i++) sink += i; n += 100000; }
    per_us = n / 200000 ? n / 200000 : 1;
    cap = 10000000; times = malloc(sizeof(double) * cap);
    pthread_barrier_init(&bar, NULL, threads);
    pthread_t th[256];
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, run, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    long k = nsteps < cap ? nsteps : cap;
    qsort(times, k, sizeof(double), cmp);
    printf("{\"steps_per_s\": %.3f, \"p50_ms\": %.3f, \"p99_ms\": %.3f}\n", nsteps / seconds,
           1000 * times[k / 2], 1000 * times[(long)(k * 0.99)]);
    return 0;
}
"""

WAKE_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double step_us, seconds;
static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
#define CAP 1000000
static double *late[256]; static long count[256];
static void *run(void *arg) {
    long me = (long)arg; double start = now();
    late[me] = malloc(sizeof(double) * CAP);
    while (now() - start < seconds) {
        struct timespec s = {0, 1000000};
        double t0 = now(); nanosleep(&s, NULL);
        double t1 = now();
        if (count[me] < CAP) late[me][count[me]++] = t1 - t0 - 0.001;
        while (now() - t1 < step_us / 1e6) ;
    }
    return NULL;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y);
}
int main(int argc, char **argv) {
    int threads = atoi(argv[1]); step_us = atof(argv[2]) / 4; seconds = atof(argv[3]);
    pthread_t th[256];
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, run, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    long k = 0;
    for (int i = 0; i < threads; i++) k += count[i];
    double *all = malloc(sizeof(double) * k); long j = 0;
    for (int i = 0; i < threads; i++) for (long n = 0; n < count[i]; n++) all[j++] = late[i][n];
    qsort(all, k, sizeof(double), cmp);
    printf("{\"steps_per_s\": %.3f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"p999_ms\": %.3f}\n",
           k / seconds, 1000 * all[k / 2], 1000 * all[(long)(k * 0.99)],
           1000 * all[(long)(k * 0.999)]);
    return 0;
}
"""

HOGS = "import os\nfor _ in range({n} - 1):\n    if os.fork() == 0: break\nwhile True: pass\n"
_DD_FILE = "while :; do dd if=/dev/zero of={dir}/w{i} bs=1M count=256 {flags} status=none; done"
_DD_FLAGS = {
    "file-writer": "conv=fdatasync",
    "file-buffered": "",
    "file-direct": "oflag=direct",
    "tmpfs-writer": "",
}


def competitor(kind: str, ncpu: int, scratch: str) -> list[str]:
    """The command of the contention (``--competitor``), a session leader of its own.

    ``python``: 2 x CPUs busy loops (user mode). ``dev-zero``: 2 x CPUs ``dd`` copies from
    /dev/zero to /dev/null (kernel mode, no file system: the kernel offers to reschedule every
    page). ``file-writer``: 2 ``dd ... conv=fdatasync`` loops writing 256 MiB files to disk (the
    trainer matrix's io contention: kernel mode, page cache, writeback); ``file-buffered``: the
    same without fdatasync (page cache, writeback later); ``file-direct``: with O_DIRECT (no
    page cache); ``tmpfs-writer``: the buffered loops into /dev/shm (page cache, no file system
    on disk, no writeback)."""
    if kind == "python":
        return [sys.executable, "-c", HOGS.format(n=2 * ncpu)]
    if kind == "dev-zero":
        loops = ["dd if=/dev/zero of=/dev/null bs=1M status=none"] * (2 * ncpu)
    else:
        where = "/dev/shm" if kind == "tmpfs-writer" else scratch
        loops = [
            _DD_FILE.format(dir=where, i=f"{i}-{os.getpid()}", flags=_DD_FLAGS[kind])
            for i in range(2)
        ]
    return ["sh", "-c", " & ".join(loops) + " & wait"]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Cgroup:
    """A new cgroup for the competitors: v1 under the cpu hierarchy, v2 under the root."""

    def __init__(self, name: str) -> None:
        v1 = Path("/sys/fs/cgroup/cpu")
        self.v1 = (v1 / "cpu.shares").exists()
        self.enabled_cpu = False
        if self.v1:
            self.path = v1 / name
        else:
            root = Path("/sys/fs/cgroup")
            if "cpu" not in _read(root / "cgroup.subtree_control").split():
                _write(root / "cgroup.subtree_control", "+cpu")
                self.enabled_cpu = True
            self.path = root / name
        self.path.mkdir()
        self.procs = self.path / ("tasks" if self.v1 else "cgroup.threads")

    def set(self, arm: str) -> None:
        if arm == "cgroup cpu.idle":
            _write(self.path / "cpu.idle", "1")
        elif self.v1:
            _write(self.path / "cpu.shares", "2")
        else:
            _write(self.path / "cpu.weight", "1")

    def join(self, tid: int) -> None:
        if self.v1:
            _write(self.procs, str(tid))
        else:
            _write(self.path / "cgroup.procs", str(tid))

    def remove(self) -> None:
        home = self.path.parent / ("tasks" if self.v1 else "cgroup.procs")
        for _ in range(50):
            left = _read(self.path / ("tasks" if self.v1 else "cgroup.procs")).split()
            for tid in left:
                with contextlib.suppress(OSError):
                    _write(home, tid)
            with contextlib.suppress(OSError):
                self.path.rmdir()
                break
            time.sleep(0.05)
        if self.enabled_cpu:
            with contextlib.suppress(OSError):
                _write(self.path.parent / "cgroup.subtree_control", "-cpu")


class Scopes:
    """``--placement scopes``: a parent cgroup with the cpu controller and two children, ``job``
    and ``hogs``; :meth:`set` sets an arm's knob on ``hogs``, :meth:`reset` puts it back."""

    def __init__(self, name: str) -> None:
        self.parent = Cgroup(name)
        self.v1 = self.parent.v1
        if not self.v1:
            _write(self.parent.path / "cgroup.subtree_control", "+cpu")
        self.job, self.hogs = self.parent.path / "job", self.parent.path / "hogs"
        self.job.mkdir()
        self.hogs.mkdir()

    def enter(self, cgroup: Path) -> None:
        """Move the calling process into ``cgroup`` (a child's ``preexec_fn``)."""
        _write(cgroup / "cgroup.procs", "0")

    def set(self, arm: str) -> None:
        if arm == "cgroup cpu.idle":
            _write(self.hogs / "cpu.idle", "1")
        else:
            _write(self.hogs / ("cpu.shares" if self.v1 else "cpu.weight"), "2" if self.v1 else "1")

    def reset(self) -> None:
        with contextlib.suppress(OSError):  # no cpu.idle before Linux 5.15
            _write(self.hogs / "cpu.idle", "0")
        _write(
            self.hogs / ("cpu.shares" if self.v1 else "cpu.weight"), "1024" if self.v1 else "100"
        )

    def remove(self) -> None:
        home = self.parent.path.parent / "cgroup.procs"
        for child in (self.job, self.hogs):
            for _ in range(50):
                for pid in _read(child / "cgroup.procs").split():
                    with contextlib.suppress(OSError):
                        _write(home, pid)
                with contextlib.suppress(OSError):
                    child.rmdir()
                    break
                time.sleep(0.05)
        if not self.v1:
            with contextlib.suppress(OSError):
                _write(self.parent.path / "cgroup.subtree_control", "-cpu")
        self.parent.remove()


def threads_of(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            out += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return out


class Agent:
    """``hostd run`` on bench/preempt_policy.toml, scoped to this benchmark's process tree, with a
    sleeping stand-in of the job (so that the busy loops are demoted before the job starts)."""

    def __init__(self, scopes: Scopes | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hostd-bench-agent-"))
        enter = (lambda: scopes.enter(scopes.job)) if scopes else None
        code = (
            "import os, time\n"
            "open(f'/proc/self/task/{os.getpid()}/comm', 'w').write('jobwait')\n"
            "time.sleep(600)\n"
        )
        self.standin = subprocess.Popen(
            [sys.executable, "-c", code], start_new_session=True, preexec_fn=enter
        )
        policy = REPO / "bench" / "preempt_policy.toml"
        with open(self.dir / "log", "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hostd", "run", "--policy", str(policy),
                 "--state-dir", str(self.dir / "state"), "--run-dir", str(self.dir / "run"),
                 "--scope-pid", str(os.getpid())],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

    def wait_demoted(self, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                status = json.loads((self.dir / "run/status.json").read_text())
                if (status.get("preempt") or {}).get("demoted"):
                    time.sleep(0.3)  # the cgroup's weight follows in the same tick
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("hostd demoted nothing: " + _read(self.dir / "log")[-2000:])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.standin.kill()
        self.standin.wait()
        if self.proc.returncode != 0:
            print(_read(self.dir / "log")[-2000:], file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_arm(
    arm: str, job: str, ncpu: int, args: argparse.Namespace, scopes: Scopes | None = None
) -> dict:
    hogs = None
    cgroup = None
    agent = None
    try:
        if arm != "alone":
            hogs = subprocess.Popen(
                competitor(args.competitor, ncpu, args.scratch),
                start_new_session=True,
                preexec_fn=lambda: _enter(scopes, "hogs", args.hog_cpus),
            )  # fmt: skip
            time.sleep(0.5)
            pids = _session(hogs.pid)
            for tid in threads_of(pids):
                with contextlib.suppress(OSError):
                    if arm == "nice 19":
                        os.setpriority(os.PRIO_PROCESS, tid, 19)
                    if "SCHED_IDLE" in arm:
                        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            if arm == "hostd":
                agent = Agent(scopes)
                agent.wait_demoted()
            if "session nice 19" in arm:
                _write(Path(f"/proc/{hogs.pid}/autogroup"), "19")
            if arm.startswith("cgroup") and scopes is not None:
                scopes.set(arm)
            elif arm.startswith("cgroup"):
                cgroup = Cgroup(f"hostd-bench-preempt-{os.getpid()}")
                cgroup.set(arm)
                for pid in pids:
                    cgroup.join(pid)
        threads = len(args.job_cpus) if args.job_cpus else ncpu
        out = subprocess.run(
            [job, str(threads), str(args.step_us), str(args.seconds)],
            capture_output=True, text=True, start_new_session=True, timeout=args.seconds + 120,
            preexec_fn=lambda: _enter(scopes, "job", args.job_cpus),
        )  # fmt: skip
        return json.loads(out.stdout)
    finally:
        if agent is not None:
            agent.stop()
        if scopes is not None and arm.startswith("cgroup"):
            scopes.reset()
        if hogs is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hogs.pid, signal.SIGKILL)
            hogs.wait()
        if cgroup is not None:
            time.sleep(0.2)
            cgroup.remove()


def _enter(scopes: Scopes | None, who: str, cpus: set[int] | None) -> None:
    """In the child before exec: its scope (``--placement scopes``) and CPUs (``--pin``)."""
    if scopes is not None:
        scopes.enter(getattr(scopes, who))
    if cpus:
        os.sched_setaffinity(0, cpus)


def _session(sid: int) -> list[int]:
    """The processes of session ``sid``, its leader first."""
    return [sid] + [
        int(p) for p in os.listdir("/proc") if p.isdigit() and _sid(int(p)) == sid and int(p) != sid
    ]


def _sid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return -1


def render(runs: list[dict], info: dict, args: argparse.Namespace) -> str:
    lines = [
        f"### {info['cgroup']}: {info['ncpu']} CPUs, kernel {info['kernel']}, autogroups "
        f"{'on' if info['autogroup'] else 'off'} ({info['where']}, {info['when']})",
        "",
        f"`bench/preempt.py --reps {args.reps} --seconds {args.seconds:g} --step-us "
        f"{args.step_us:g} --placement {args.placement} --competitor {args.competitor} --job "
        f"{args.job} --pin {args.pin}`: the job against {info['competitor']}; "
        f"{info['placement']}.",
        "",
        "| arm | steps/s (median) | vs alone, median | vs alone, worst rep | step p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    if args.job == "wakeup":
        lines[-2:] = [
            "| arm | wakeups/s (median) | vs alone, median | vs alone, worst rep | "
            "wakeup late p50 / p99 / p99.9 ms (medians over repetitions) |",
            "|---|---:|---:|---:|---|",
        ]
    by_rep: dict[int, dict[str, dict]] = {}
    for r in runs:
        by_rep.setdefault(r["rep"], {})[r["arm"]] = r
    for arm in ARMS:
        rel, rates, p50, p99, p999 = [], [], [], [], []
        for rep in by_rep.values():
            r, alone = rep.get(arm), rep.get("alone")
            if r and "steps_per_s" in r:
                rates.append(r["steps_per_s"])
                p50.append(r["p50_ms"])
                p99.append(r["p99_ms"])
                p999.append(r.get("p999_ms", 0.0))
                if alone and alone.get("steps_per_s"):
                    rel.append(r["steps_per_s"] / alone["steps_per_s"])
        if not rates:
            continue
        late = (
            f"{statistics.median(p50):.2f} / {statistics.median(p99):.2f} / "
            f"{statistics.median(p999):.2f}"
            if args.job == "wakeup"
            else f"{statistics.median(p99):.1f}"
        )
        lines.append(
            f"| {arm} | {statistics.median(rates):.1f} | {statistics.median(rel):.2f} | "
            f"{min(rel):.2f} | {late} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--step-us", type=float, default=2000.0)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--json", type=Path, help="write runs and the rendered table here")
    ap.add_argument(
        "--placement", choices=("root", "scopes"), default="root",
        help="root: everything in the root cpu cgroup (autogroups apply); scopes: the job and "
        "the competitors each in a cgroup of its own",
    )  # fmt: skip
    ap.add_argument(
        "--competitor", choices=("python", "dev-zero", *_DD_FLAGS), default="python",
        help="the contention (see ``competitor``)",
    )  # fmt: skip
    ap.add_argument(
        "--job", choices=("barrier", "wakeup"), default="barrier",
        help="barrier: threads that step together (steps/s); wakeup: threads that sleep 1 ms "
        "and work step-us/4, measuring how late each wakeup runs",
    )  # fmt: skip
    ap.add_argument(
        "--pin", choices=("none", "same", "apart"), default="none",
        help="same: the competitors and one job thread on CPU 0; apart: the competitors on CPU "
        "0, the job on the other CPUs",
    )  # fmt: skip
    args = ap.parse_args()
    every = sorted(os.sched_getaffinity(0))
    args.hog_cpus = {every[0]} if args.pin != "none" else None
    args.job_cpus = {"none": None, "same": {every[0]}, "apart": set(every[1:])}[args.pin]
    if os.geteuid() != 0:
        sys.exit("bench/preempt.py needs root (SCHED_IDLE, autogroups, cgroups)")
    arms = [a.strip() for a in args.arms.split(",")]
    ncpu = len(os.sched_getaffinity(0))
    cgroup = (
        "cgroup v1 (cpu hierarchy)"
        if Path("/sys/fs/cgroup/cpu/cpu.shares").exists()
        else ("cgroup v2")
    )
    info = {
        "ncpu": ncpu,
        "kernel": platform.release(),
        "cgroup": cgroup,
        "autogroup": _read(Path("/proc/sys/kernel/sched_autogroup_enabled")).strip() == "1",
        "placement": (
            "job and competitors in the root cpu cgroup, each its own session"
            if args.placement == "root"
            else "job and competitors each in a cgroup of its own (as systemd scopes)"
        ),
        "where": "the VM tier (QEMU TCG)" if os.environ.get("HOSTD_IN_VM") else "this host",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "competitor": {
            "python": f"{2 * ncpu} busy Python loops",
            "dev-zero": f"{2 * ncpu} dd copies /dev/zero -> /dev/null",
            "file-writer": "2 dd loops writing 256 MiB files with fdatasync",
            "file-buffered": "2 dd loops writing 256 MiB files (buffered, no fdatasync)",
            "file-direct": "2 dd loops writing 256 MiB files with O_DIRECT",
            "tmpfs-writer": "2 dd loops writing 256 MiB files into /dev/shm",
        }[args.competitor]
        + {"none": "", "same": ", pinned to the job's CPU", "apart": ", pinned apart from the job"}[
            args.pin
        ],
    }
    runs = []
    with (
        tempfile.TemporaryDirectory(prefix="hostd-preempt-") as tmp,
        tempfile.TemporaryDirectory(prefix="hostd-preempt-", dir="/var/tmp") as scratch,
    ):
        args.scratch = scratch  # on disk, not tmpfs: the file writers' files
        src, job = Path(tmp) / "job.c", Path(tmp) / "job"
        src.write_text(WAKE_C if args.job == "wakeup" else JOB_C)
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            sys.exit("bench/preempt.py needs gcc")
        subprocess.run([cc, "-O1", "-pthread", "-o", str(job), str(src)], check=True)
        scopes = Scopes(f"hostd-bench-scopes-{os.getpid()}") if args.placement == "scopes" else None
        try:
            _reps(args, arms, str(job), ncpu, scopes, runs)
        finally:
            if scopes is not None:
                scopes.remove()
            for i in range(2):  # the tmpfs writers' files
                with contextlib.suppress(OSError):
                    os.unlink(f"/dev/shm/w{i}-{os.getpid()}")
    text = render(runs, info, args)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"info": info, "runs": runs, "text": text}, indent=1))


def _reps(args, arms, job: str, ncpu: int, scopes: Scopes | None, runs: list[dict]) -> None:
    """Every arm once per repetition, in an order rotated per repetition."""
    for rep in range(args.reps):
        order = arms[rep % len(arms) :] + arms[: rep % len(arms)]
        for arm in order:
            time.sleep(0.5)
            try:
                r = run_arm(arm, job, ncpu, args, scopes)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                r = {"error": str(exc)}
            r.update(arm=arm, rep=rep + 1)
            runs.append(r)
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()

"""The trainer effect matrix: a real PyTorch DDP job under five kinds of CPU contention.

    sudo python3 bench/trainer/matrix.py --python /path/to/venv/bin/python --write BENCHMARKS.md

``--python`` is an interpreter with ``pip install -r bench/trainer/requirements.txt``. Each
*cell* (``CELLS`` below; ``--list`` prints them) is a job shape (model, ``OMP_NUM_THREADS`` per
rank, DataLoader workers per rank) under one kind of contention (``KINDS``), each about twice the
online CPUs of CPU demand:

- ``stress``: ``stress-ng --cpu 2N`` in a session of its own;
- ``launcher-python``: 2N busy ``python -c 'while True: pass'`` processes of the ranks' own
  interpreter, children of torchrun's launcher (``pt_elastic``) in its session: the job is
  started through a wrapper that forks them, waits 1 s and execs torchrun;
- ``other-python``: the same busy processes in a session of their own;
- ``build``: another user's (``nobody``) parallel C build, ``make -s clean; make -s -j 2N`` of
  ~200 generated C files, in a loop, in a session of its own without a terminal;
- ``io``: 2 ``dd ... conv=fdatasync`` writers of 256 MiB files, in a loop, in a session of its own.

Each cell runs in up to five *arms*: ``alone`` (the job only), ``alone+hostd`` (the job with
``hostd run`` and no contention: what hostd's placement does to the job itself), ``contended``
(job + contention), ``contended+hostd`` (``hostd run``, the shipped default policy, the whole
host, started and past its first pass before the contention and the job; SIGTERM after, which
restores) and ``contended+tuned`` (the best hand-tuned recipe, ``hand_tune``: every 0.5 s every
thread of the contention's processes SCHED_IDLE and their sessions' autogroup nice 19; put back
after). Each repetition runs every cell's arms in a rotated order (repetition r starts at arm r
mod the number of arms).

Per run: the job's steps/s and step time p50/p99 (``train.py --out``), the "system service"
probe of ``run.py`` (slices of CPU work done in time), ``hostd stats`` per layer of the default
policy and the threads that waited most over the middle half of the counted window, the agent's
log errors and its status' ``preempt`` object. The report judges every cell on the median AND
the worst repetition. Never part of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from run import Probe, _f, _text, meta, write_section  # noqa: E402

from hostd.demo import (  # noqa: E402
    HOSTD,
    AgentProc,
    Contention,
    busy,
    calibrate,
    kill_session,
    layer_summary,
    session_pids,
)
from hostd.host import Host  # noqa: E402
from hostd.policy import default_policy_bytes, load_default, parse_policy  # noqa: E402
from hostd.stats import measure  # noqa: E402
from hostd.tasks import descendants  # noqa: E402

TRAIN = HERE / "train.py"
SECTION = "## Trainer effect matrix (bench/trainer/matrix.py)"
ARMS = (
    "alone", "alone+hostd", "contended", "contended+hostd", "contended+sizing", "contended+tuned"
)  # fmt: skip
HOSTD_ARMS = ("alone+hostd", "contended+hostd", "contended+sizing")
# The ``contended+sizing`` arm's policy: the default with self-sizing layers (``sizing_policy``).
SIZING_UTIL = "{ low = 0.5, high = 0.8 }"
SIZING_DATA_CPUS = '{ min = 1, max = "25%" }'
GOAL_SPEED, GOAL_PROBE = 0.97, 0.95
STARVE_MARGIN = 0.10  # a data/comms layer waits this much more of its runnable time than alone
STARTUP_S = 12.0  # per run, on top of --seconds and --warmup, for the time estimate
BUSY = "while True: pass"
NOBODY, NOGROUP = "nobody", "nogroup"
IO_WRITERS, IO_MIB = 2, 256


@dataclass(frozen=True)
class Cell:
    id: str
    model: str  # train.py --model
    omp: int  # OMP_NUM_THREADS per rank
    workers: int  # DataLoader worker processes per rank
    contention: str  # a key of KINDS


# Together the cells cover every level of every factor: both models, each at OMP 1, 2 and 4;
# 0, 1, 2, 3 and 4 DataLoader workers; every contention kind (launcher-python, stress and build
# with both models). 8 cells x 4 arms x 5 reps of 15 + 5 s: about 1.5 h on a 2-CPU VM.
CELLS = (
    Cell("mlp-omp2-w3-launcher", "mlp", 2, 3, "launcher-python"),  # the issue's cell
    Cell("tf-omp4-w4-launcher", "transformer", 4, 4, "launcher-python"),
    Cell("tf-omp1-w2-stress", "transformer", 1, 2, "stress"),  # run.py's job and contention
    Cell("mlp-omp1-w0-stress", "mlp", 1, 0, "stress"),
    Cell("mlp-omp4-w1-other", "mlp", 4, 1, "other-python"),
    Cell("tf-omp2-w4-build", "transformer", 2, 4, "build"),
    Cell("mlp-omp4-w2-build", "mlp", 4, 2, "build"),
    Cell("mlp-omp1-w4-io", "mlp", 1, 4, "io"),
)

# Every process this run starts (except the agent) carries this in its environment, so that a
# sweep finds what is left of them, whatever session or user they ended up in; and the sessions
# the current arm started are remembered (stress-ng overwrites its workers' environment).
TAG_VAR = "HOSTD_MATRIX_RUN"
TAG = f"{os.getpid()}-{os.urandom(4).hex()}"
SESSIONS: set[int] = set()  # emptied once the arm's processes are gone (pids are reused)
STOP = threading.Event()  # SIGINT/SIGTERM: stop at the next safe point


class Interrupted(KeyboardInterrupt):
    pass


def pause(seconds: float) -> None:
    if STOP.wait(seconds):
        raise Interrupted


def _on_signal(signum: int, _frame) -> None:
    if not STOP.is_set():
        print(f"\n{signal.Signals(signum).name}: stopping after cleanup ...", flush=True)
    STOP.set()


# -- sweeping ---------------------------------------------------------------------------------
def ours(uid: int | None = None) -> list[int]:
    """The processes (not zombies) this run started that are still there: they carry its tag
    or are in a session in ``SESSIONS`` (of ``uid`` only when given)."""
    mark = f"{TAG_VAR}={TAG}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):  # exited: only its parent (or init) can reap it
                continue
            if uid is not None and os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            if int(fields[3]) not in SESSIONS and mark not in Path(
                f"/proc/{entry}/environ"
            ).read_bytes().split(b"\0"):
                continue
        except (OSError, IndexError, ValueError):
            continue
        found.append(int(entry))
    return found


def sweep(uid: int | None = None, rounds: int = 50, wait: float = 15.0) -> dict[int, str]:
    """SIGKILL every process of ours until none is left (a build forks while it dies), then
    wait up to ``wait`` s until they are gone from /proc (a SCHED_IDLE process can take a
    while to run its exit); {pid: comm} of those killed."""
    killed: dict[int, str] = {}
    for _ in range(rounds):
        pids = ours(uid)
        if not pids:
            break
        for pid in pids:
            killed.setdefault(pid, _text(Path(f"/proc/{pid}/comm")).strip() or "?")
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    wait_gone(killed, wait)
    return killed


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait until none of ``pids`` is in /proc (zombies included) or ``timeout`` s passed;
    those still there."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if os.path.exists(f"/proc/{p}")]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if os.path.exists(f"/proc/{p}")]
    return left


def other_agents() -> list[int]:
    """Processes running ``hostd run`` now (two agents on one host would fight)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = _text(Path(f"/proc/{entry}/cmdline")).split("\0")
            for i, word in enumerate(argv[:-1]):
                named = word == "hostd" and i > 0 and argv[i - 1] == "-m"
                if (named or os.path.basename(word) == "hostd") and argv[i + 1] == "run":
                    found.append(int(entry))
                    break
    return found


# -- contention kinds -------------------------------------------------------------------------
class Kind:
    """One kind of contention: ``start()``, ``pids()`` (its processes now), ``stop()`` (kills
    all of it, removes its files). ``in_launcher`` kinds start with the job: ``wrap(argv)``
    returns the job's command line and ``attach(launcher)`` is told the launcher's pid."""

    name = ""
    in_launcher = False

    def __init__(self, ncpu: int, python: str, workdir: Path) -> None:
        self.n, self.python, self.workdir = 2 * ncpu, python, workdir
        self.proc: subprocess.Popen | None = None

    def describe(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def attach(self, launcher: int) -> None:
        pass

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid) if self.proc is not None else []

    def stop(self) -> None:
        if self.proc is not None:
            pids = self.pids()
            kill_session(self.proc)
            wait_gone(pids, 15)

    def _popen(self, argv: list[str], **kw) -> None:
        self.proc = subprocess.Popen(
            argv, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw,
        )  # fmt: skip
        SESSIONS.add(self.proc.pid)


class Stress(Kind):
    name = "stress"

    def describe(self) -> str:
        return f"`stress-ng --cpu {self.n} --cpu-method int64` in a session of its own"

    def start(self) -> None:
        self.contention = Contention(self.n)  # hostd.demo's: stress-ng, else Python loops
        self.proc = self.contention.proc
        SESSIONS.add(self.proc.pid)


class LauncherPython(Kind):
    name = "launcher-python"
    in_launcher = True
    WRAPPER = (
        'pidfile=$1; n=$2; py=$3; shift 3; for i in $(seq 1 "$n"); do '
        f'"$py" -c "{BUSY}" & echo $! >> "$pidfile"; done; sleep 1; exec "$@"'
    )

    def describe(self) -> str:
        return (
            f"{self.n} busy `python -c '{BUSY}'` (the ranks' interpreter), children of the "
            "launcher in its session (a wrapper forks them, waits 1 s, execs torchrun)"
        )

    def start(self) -> None:
        self.pidfile = self.workdir / "launcher-busy.pids"
        self.pidfile.unlink(missing_ok=True)
        self.launcher: int | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        return ["bash", "-c", self.WRAPPER, "hostd-matrix-launch", str(self.pidfile),
                str(self.n), self.python, *argv]  # fmt: skip

    def attach(self, launcher: int) -> None:
        self.launcher = launcher

    def pids(self) -> list[int]:
        """The busy processes only (not the launcher, not the ranks)."""
        found = []
        for word in _text(self.pidfile).split():
            with contextlib.suppress(OSError, ValueError):
                if os.getsid(int(word)) == self.launcher:
                    found.append(int(word))
        return found

    def stop(self) -> None:
        for word in _text(self.pidfile).split():
            with contextlib.suppress(OSError, ValueError):
                if os.getsid(int(word)) == self.launcher:
                    os.kill(int(word), signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)


class OtherPython(Kind):
    name = "other-python"
    FORKER = (
        "import os, sys\nfor _ in range(int(sys.argv[1]) - 1):\n    if os.fork() == 0:\n"
        f"        break\n{BUSY}\n"
    )

    def describe(self) -> str:
        return (
            f"{self.n} busy `python -c '{BUSY}'` (the ranks' interpreter), a session of their own"
        )

    def start(self) -> None:
        self._popen([self.python, "-c", self.FORKER, str(self.n)])


class Build(Kind):
    """``nobody``'s parallel C build in a loop; the sources are generated once (``prepare``)."""

    name = "build"
    FILES = 200
    source_dir: Path | None = None

    @classmethod
    def prepare(cls) -> Path:
        if cls.source_dir is None:
            d = Path(tempfile.mkdtemp(prefix="hostd-matrix-build-"))
            for i in range(cls.FILES):
                (d / f"u{i:03d}.c").write_text(c_source(i))
            (d / "main.c").write_text(c_main(cls.FILES))
            (d / "Makefile").write_text(MAKEFILE)
            shutil.chown(d, NOBODY, NOGROUP)
            cls.source_dir = d
        return cls.source_dir

    @classmethod
    def cleanup(cls) -> None:
        if cls.source_dir is not None:
            shutil.rmtree(cls.source_dir, ignore_errors=True)
            cls.source_dir = None

    def describe(self) -> str:
        return (
            f"user {NOBODY}'s `make -s clean; make -s -j {self.n}` of {self.FILES} generated C "
            "files (-O2) in a loop, a session of its own, no terminal"
        )

    def start(self) -> None:
        loop = f"while true; do make -s clean; make -s -j {self.n}; done"
        self._popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOGROUP}", "--clear-groups",
             "bash", "-c", loop],
            cwd=self.prepare(),
        )  # fmt: skip

    def stop(self) -> None:
        super().stop()
        sweep(uid=_uid(NOBODY))  # compilers forked while their make died
        d = self.source_dir
        if d is not None:
            for f in [*d.glob("*.o"), d / "prog"]:
                with contextlib.suppress(OSError):
                    f.unlink()


class Io(Kind):
    name = "io"
    LOOP = (
        'd=$1; n=$2; mib=$3; for i in $(seq 1 "$n"); do (while true; do '
        'dd if=/dev/zero of="$d/io$i" bs=1M count="$mib" conv=fdatasync status=none; '
        "done) & done; wait"
    )

    def describe(self) -> str:
        return (
            f"{IO_WRITERS} `dd if=/dev/zero bs=1M count={IO_MIB} conv=fdatasync` loops to "
            "local files, a session of their own"
        )

    def start(self) -> None:
        self.dir = self.workdir / "io"
        self.dir.mkdir(exist_ok=True)
        self._popen(["bash", "-c", self.LOOP, "hostd-matrix-io", str(self.dir),
                     str(IO_WRITERS), str(IO_MIB)])  # fmt: skip

    def stop(self) -> None:
        super().stop()
        if getattr(self, "dir", None) is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


KINDS: dict[str, type[Kind]] = {k.name: k for k in (Stress, LauncherPython, OtherPython, Build, Io)}


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def c_source(i: int) -> str:
    """A small but not trivial C file: a struct, a table, qsort, libm, snprintf."""
    table = ", ".join(str((i * 7919 + k * 104729) % 1000) for k in range(64))
    return f"""#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rec{i} {{
    int id;
    double w[8];
    char name[32];
}};

static const int table{i}[64] = {{{table}}};

static int cmp{i}(const void *a, const void *b) {{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}}

static void fill{i}(struct rec{i} *r, int n) {{
    for (int k = 0; k < n; k++) {{
        r[k].id = table{i}[k % 64] ^ k;
        for (int j = 0; j < 8; j++)
            r[k].w[j] = sin((double)(k * 8 + j)) * {i + 1};
        snprintf(r[k].name, sizeof r[k].name, "rec{i}-%d", k);
    }}
}}

static double mix{i}(const struct rec{i} *r, int n) {{
    double acc = 0;
    for (int k = 0; k < n; k++) {{
        for (int j = 0; j < 8; j++)
            acc += r[k].w[j] * ((j & 1) ? 1.5 : -0.5);
        acc += (double)strlen(r[k].name) / (r[k].id + 1);
    }}
    return acc;
}}

static int median{i}(int n) {{
    int *v = malloc(sizeof *v * (size_t)n);
    if (!v)
        return -1;
    for (int k = 0; k < n; k++)
        v[k] = table{i}[(k * 13) % 64] * (k + 1);
    qsort(v, (size_t)n, sizeof *v, cmp{i});
    int m = v[n / 2];
    free(v);
    return m;
}}

static double poly{i}(double x) {{
    double c[] = {{1.0, -0.5, 0.25, -0.125, 0.0625, -0.03125, 0.015625}};
    double y = 0;
    for (int k = 6; k >= 0; k--)
        y = y * x + c[k] * ({i % 7} + 1);
    return y;
}}

double unit{i}(int n) {{
    struct rec{i} r[16];
    if (n > 16)
        n = 16;
    if (n < 1)
        n = 1;
    fill{i}(r, n);
    double acc = mix{i}(r, n) + median{i}(n * 4);
    for (int k = 0; k < n; k++) {{
        switch ((r[k].id + k) % 4) {{
        case 0: acc += poly{i}(r[k].w[0]); break;
        case 1: acc -= sqrt(fabs(r[k].w[1])); break;
        case 2: acc *= 1.0 + 1e-9 * r[k].id; break;
        default: acc += (double)table{i}[k]; break;
        }}
    }}
    return acc;
}}
"""


def c_main(files: int) -> str:
    decls = "".join(f"double unit{i}(int);\n" for i in range(files))
    calls = "".join(f"    s += unit{i}({i % 16 + 1});\n" for i in range(files))
    return (
        f"#include <stdio.h>\n{decls}int main(void) {{\n    double s = 0;\n{calls}"
        '    printf("%f\\n", s);\n    return 0;\n}\n'
    )


MAKEFILE = """CC = cc
CFLAGS = -O2 -Wall
SRCS = $(sort $(wildcard u*.c)) main.c
OBJS = $(SRCS:.c=.o)

prog: $(OBJS)
\t$(CC) -o $@ $(OBJS) -lm

%.o: %.c
\t$(CC) $(CFLAGS) -c -o $@ $<

clean:
\trm -f $(OBJS) prog
"""


# -- the hand-tuned arm -----------------------------------------------------------------------
def hand_tune(pids: list[int], launcher: int | None, saved: dict) -> None:
    """One pass of the best hand-tuned recipe (change it here): every thread of the
    contention's processes SCHED_IDLE, and the autogroup of each session they are in nice 19,
    unless its leader is gone or is the job's launcher. ``saved`` remembers what was there
    before (``restore`` puts it back)."""
    sched, groups = saved.setdefault("sched", {}), saved.setdefault("autogroup", {})
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                policy = os.sched_getscheduler(tid)
                if tid not in sched:
                    sched[tid] = (policy, os.sched_getparam(tid).sched_priority)
                if policy != os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        try:
            leader = os.getsid(pid)
        except OSError:
            continue
        if leader == launcher:
            continue
        path = Path(f"/proc/{leader}/autogroup")  # "/autogroup-123 nice 0"; gone: leader dead
        with contextlib.suppress(OSError, ValueError, IndexError):
            nice = int(path.read_text().split()[-1])
            groups.setdefault(leader, nice)
            if nice != 19:
                path.write_text("19")


def restore(saved: dict) -> dict:
    """Put back what ``hand_tune`` changed (processes may be gone); counts."""
    back = {"threads": 0, "threads_gone": 0, "autogroups": 0}
    for tid, (policy, prio) in saved.get("sched", {}).items():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(prio))
            back["threads"] += 1
        except OSError:
            back["threads_gone"] += 1
    for leader, nice in saved.get("autogroup", {}).items():
        with contextlib.suppress(OSError):
            Path(f"/proc/{leader}/autogroup").write_text(str(nice))
            back["autogroups"] += 1
    return back


class Tuner:
    """``recipe`` every ``period`` s on the contention's processes (re-listed each time)."""

    def __init__(self, contention: Kind, recipe=hand_tune, period: float = 0.5) -> None:
        self.contention, self.recipe, self.period = contention, recipe, period
        self.launcher: int | None = None
        self.saved: dict = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.recipe(self.contention.pids(), self.launcher, self.saved)
            except Exception as exc:  # noted in the run, never a crash
                if len(self.errors) < 3:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            if self._stop.wait(self.period):
                return

    def stop(self) -> dict:
        self._stop.set()
        self.thread.join(timeout=10)
        back = restore(self.saved)
        back["changed_threads"] = len(self.saved.get("sched", {}))
        return {**back, "errors": self.errors}


# -- one run ----------------------------------------------------------------------------------
def job_started(host: Host, job: subprocess.Popen, ranks: int, workers: int) -> str:
    """Wait until the job is past its imports: every DataLoader worker exists, or with 0
    workers, every rank has its gloo threads (after init_process_group). What was seen."""
    deadline = time.monotonic() + 120
    seen_ranks = None
    while time.monotonic() < deadline and job.poll() is None and not STOP.is_set():
        data, rank_pids = 0, []
        for pid in descendants(host, [job.pid]):
            comm = _text(Path(f"/proc/{pid}/comm")).strip()
            if comm == "pt_data_worker":
                data += 1
            elif pid != job.pid and "train.py" in _text(Path(f"/proc/{pid}/cmdline")):
                rank_pids.append(pid)
        if workers and data >= ranks * workers:
            return "data workers"
        if not workers and len(rank_pids) >= ranks:
            seen_ranks = seen_ranks or time.monotonic()
            gloo = sum(
                any(
                    _text(Path(f"/proc/{pid}/task/{t}/comm")).startswith(("gloo", "pt_gloo"))
                    for t in _listdir(f"/proc/{pid}/task")
                )
                for pid in rank_pids
            )
            if gloo >= ranks:
                return "ranks' gloo threads"
            if time.monotonic() - seen_ranks > 30:
                return "ranks (no gloo thread seen)"
        time.sleep(0.2)
    return "timeout"


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def sizing_policy() -> str:
    """The default policy with self-sizing layers: ``trainer`` (grouped) gets ``util``, ``data``
    becomes grouped with CPUs of its own (``SIZING_DATA_CPUS``) sized by ``util`` too. Checked by
    the policy parser; everything else is the default, unchanged."""
    text = default_policy_bytes().decode()
    blocks = text.split("[[layer]]\n")
    changed = set()
    for i, block in enumerate(blocks):
        if block.startswith('name = "trainer"\n'):
            blocks[i] = block.replace(
                'kind = "grouped"\n', f'kind = "grouped"\nutil = {SIZING_UTIL}\n', 1
            )
        elif block.startswith('name = "data"\n'):
            blocks[i] = block.replace(
                'kind = "open"\n',
                f'kind = "grouped"\ncpus = {SIZING_DATA_CPUS}\nutil = {SIZING_UTIL}\n',
                1,
            )
        if blocks[i] != block:
            changed.add(block.split('"')[1])
    if changed != {"trainer", "data"}:
        raise SystemExit(f"sizing_policy: the default policy changed shape (edited: {changed})")
    text = "[[layer]]\n".join(blocks)
    policy = parse_policy(text.encode(), "<sizing policy>")
    assert {ly.name for ly in policy.layers if ly.self_sizing} == {"trainer", "data"}
    return text


def job_argv(cell: Cell, args: argparse.Namespace, out: Path, port: int) -> list[str]:
    return [
        args.python, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
        "--master-port", str(port), str(TRAIN), "--model", cell.model,
        "--workers", str(cell.workers), "--seconds", str(args.seconds),
        "--warmup", str(args.warmup), "--out", str(out),
        *(("--spike", str(args.spike[0]), str(args.spike[1])) if args.spike else ()),
    ]  # fmt: skip


def run_arm(
    cell: Cell, arm: str, args: argparse.Namespace, workdir: Path, chunk: int, n: int
) -> dict:
    """One run of ``cell`` in ``arm``; everything it started is stopped before it returns.
    A failure is recorded in ``error``; only an interrupt propagates."""
    host, policy = Host(), load_default()
    ncpu = len(os.sched_getaffinity(0))
    out, log = workdir / f"result-{n}.json", workdir / f"job-{n}.log"
    rec: dict = {"cell": cell.id, "arm": arm, "error": None, "problems": []}
    probe = contention = agent = tuner = job = None
    stats_box: list = []
    marker: list[str] = []
    t0 = time.monotonic()
    try:
        probe = Probe(chunk)
        SESSIONS.add(probe.proc.pid)
        if arm in HOSTD_ARMS:
            if other_agents():
                raise RuntimeError(f"another hostd run is running (pids {other_agents()})")
            policy_file = args.policy
            if arm == "contended+sizing":
                policy_file = str(workdir / "sizing.toml")
                Path(policy_file).write_text(sizing_policy())
            agent = AgentProc(
                workdir / f"agent-{n}", policy=policy_file, env={TAG_VAR: ""}
            )  # never swept
            agent.wait_passes(1)
        if arm.startswith("contended"):
            contention = KINDS[cell.contention](ncpu, args.python, workdir)
            contention.start()
            if arm == "contended+tuned":
                tuner = Tuner(contention)
            if not contention.in_launcher:
                pause(1.0)  # contention first (an in-launcher kind's wrapper waits 1 s itself)
        argv = job_argv(cell, args, out, 29500 + (os.getpid() + n) % 1000)
        if contention is not None:
            argv = contention.wrap(argv)
        env = {**os.environ, "OMP_NUM_THREADS": str(cell.omp), "PYTHONWARNINGS": "ignore"}
        with open(log, "w") as err:
            job = subprocess.Popen(
                argv, start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, env=env,
            )  # fmt: skip
        SESSIONS.add(job.pid)
        if contention is not None:
            contention.attach(job.pid)
        if tuner is not None:
            tuner.launcher = job.pid

        def sample() -> None:
            marker.append(job_started(host, job, args.ranks, cell.workers))
            if STOP.wait(args.warmup + args.seconds / 4) or job.poll() is not None:
                return
            try:
                stats_box.append(measure(host, policy, args.seconds / 2, top=5))
            except Exception as exc:  # noted in the run
                stats_box.append(exc)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        if args.shell_probe:
            run_dir = agent.run if agent is not None else workdir / "no-agent"

            def shell() -> None:
                if STOP.wait(args.warmup + args.seconds / 2 + 8) or job.poll() is not None:
                    return
                rec["shell"] = shell_probe(run_dir)

            threading.Thread(target=shell, daemon=True).start()
        deadline = time.monotonic() + args.seconds + args.warmup + 240
        while job.poll() is None:
            pause(0.2)
            if time.monotonic() > deadline:
                raise TimeoutError("the job did not finish in time")
        sampler.join(timeout=args.seconds / 2 + 10)
    except Interrupted:
        rec["error"] = "interrupted"
        raise
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:1500]
    finally:
        _cleanup(rec, tuner, job, agent, contention, probe)
        rec["wall_s"] = round(time.monotonic() - t0, 1)
    result = {}
    with contextlib.suppress(OSError, ValueError):
        result = json.loads(out.read_text())
    for key in ("steps", "steps_per_s", "step_ms_p50", "step_ms_p99"):
        rec[key] = result.get(key)
    if rec["steps_per_s"] is None and rec["error"] is None:
        rec["error"] = f"no result: {_text(log)[-1500:]}"
    stats = stats_box[0] if stats_box else None
    if isinstance(stats, Exception):
        rec["problems"].append(f"stats: {stats}")
        stats = None
    rec["sampled_after"] = marker[0] if marker else None
    rec["layers"] = layer_summary(stats) if stats else {}
    rec["top"] = [
        {"comm": t.comm, "pid": t.pid, "layer": t.layer, "cpu": round(t.rates.cpu, 2),
         "wait_ms_per_s": round(t.rates.wait * 1000, 1)}
        for t in (stats.top if stats else ())
    ]  # fmt: skip
    return rec


def shell_probe(run_dir: Path) -> dict:
    """What an operator typing in a terminal meets: ``ls /`` and ``hostd status``, each run
    through ``script`` (a pseudo-terminal: a session with a controlling terminal, as a login
    shell's), wall seconds each."""
    took = {}
    for name, cmd in (
        ("ls", "ls /"),
        ("hostd status", f"{' '.join(HOSTD)} status --run-dir {run_dir}"),
    ):
        t0 = time.monotonic()
        subprocess.run(
            ["script", "-qec", cmd, "/dev/null"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=300, check=False,
        )  # fmt: skip
        took[name] = round(time.monotonic() - t0, 2)
    return took


def _cleanup(rec: dict, tuner, job, agent, contention, probe) -> None:
    """Stop what an arm started, each step on its own (one failing does not skip the rest),
    then make sure that every process the arm started is gone."""
    before = set(ours())
    with contextlib.suppress(Exception):
        before.update(contention.pids() if contention is not None else ())
        before.update(descendants(Host(), [job.pid]) if job is not None else ())

    def step(what: str, fn) -> None:
        try:
            fn()
        except Exception as exc:
            rec["problems"].append(f"{what}: {type(exc).__name__}: {exc}")

    if tuner is not None:
        step("tuned restore", lambda: rec.__setitem__("tuned", tuner.stop()))
    if job is not None:
        step("job", lambda: kill_session(job))
    if agent is not None:
        step("agent status", lambda: rec.__setitem__("preempt", agent.status().get("preempt")))
        step("agent", lambda: _stop_agent(agent, rec))
    if contention is not None:
        step("contention", contention.stop)
    if probe is not None:
        step("probe", lambda: rec.__setitem__("probe", probe.stop()))
    rec.setdefault("probe", {"asked": 0, "done": 0, "late": 0, "worst_ms": 0.0, "progress": 0})
    killed: dict[int, str] = {}
    step("sweep", lambda: killed.update(sweep()))
    rec["strays"] = sorted(set(killed.values()))
    if killed:
        rec["problems"].append(f"stray processes killed: {rec['strays']}")
    left = wait_gone(before | set(killed), 15)
    if left:
        comms = sorted({_text(Path(f"/proc/{p}/comm")).strip() for p in left})
        rec["problems"].append(f"still in /proc 15 s after the arm: {len(left)} ({comms})")
    else:
        SESSIONS.clear()


def _stop_agent(agent: AgentProc, rec: dict) -> None:
    log = agent.stop()
    rec["agent_errors"] = [ln for ln in log.splitlines() if " ERROR " in ln][:5]
    rec["resizes"] = [ln.split(" resize ", 1)[1] for ln in log.splitlines() if " resize " in ln]
    rc = agent.proc.returncode
    if rc != 0:
        rec["problems"].append(f"hostd run exited with {rc}: {log[-800:]}")
        out = subprocess.run(
            [*HOSTD, "restore", "--state-dir",
             str(agent.state), "--run-dir", str(agent.run)],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode != 0:
            rec["problems"].append(f"hostd restore failed: {out.stdout[-500:]}{out.stderr[-500:]}")


# -- reporting --------------------------------------------------------------------------------
def _wait(r: dict, layer: str) -> float | None:
    return r["layers"].get(layer, {}).get("wait_share")


def _med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], cells: list[Cell], arms: list[str]) -> list[dict]:
    """One row per cell x arm, judged on the median and on the worst repetition."""
    rows = []
    for cell in cells:
        alone = {r["rep"]: r for r in runs if r["cell"] == cell.id and r["arm"] == "alone"}
        alone_rates = {k: r["steps_per_s"] for k, r in alone.items() if r["steps_per_s"]}
        alone_med = _med(list(alone_rates.values()))
        alone_min = min(alone_rates.values()) if alone_rates else None
        alone_wait = {ly: _med([_wait(r, ly) for r in alone.values()]) for ly in ("data", "comms")}
        for arm in arms:
            mine = [r for r in runs if r["cell"] == cell.id and r["arm"] == arm]
            ok = [r for r in mine if r["steps_per_s"]]
            rates = [r["steps_per_s"] for r in ok]
            same_rep = [
                r["steps_per_s"] / alone_rates[r["rep"]] for r in ok if r["rep"] in alone_rates
            ]
            row = {
                "cell": cell.id,
                "arm": arm,
                "runs": len(mine),
                "failed": len(mine) - len(ok),
                "steps_per_s": _med(rates),
                "min_steps_per_s": min(rates) if rates else None,
                "vs_alone": _med(rates) / alone_med if rates and alone_med else None,
                "worst_vs_alone_worst": min(rates) / alone_min if rates and alone_min else None,
                "worst_rep_vs_its_alone": min(same_rep) if same_rep else None,
                "p50_ms": _med([r["step_ms_p50"] for r in ok]),
                "p99_ms": _med([r["step_ms_p99"] for r in ok]),
                "probe": min((r["probe"]["progress"] for r in mine), default=None),
                "data_wait": _med([_wait(r, "data") for r in ok]),
                "comms_wait": _med([_wait(r, "comms") for r in ok]),
            }
            starved = [
                ly
                for ly in ("data", "comms")
                if row[f"{ly}_wait"] is not None
                and alone_wait[ly] is not None
                and row[f"{ly}_wait"] > alone_wait[ly] + STARVE_MARGIN
            ]
            row["starved"] = starved
            row["goal"] = None
            if arm == "contended+hostd" and mine:
                misses = []
                if row["failed"]:
                    misses.append(f"{row['failed']} failed")
                if row["vs_alone"] is None or row["vs_alone"] < GOAL_SPEED:
                    misses.append("median")
                if row["worst_vs_alone_worst"] is None or row["worst_vs_alone_worst"] < GOAL_SPEED:
                    misses.append("worst")
                if row["probe"] is None or row["probe"] < GOAL_PROBE:
                    misses.append("probe")
                misses += [f"{ly} starved" for ly in starved]
                row["goal"] = "MET" if not misses else "MISSED (" + ", ".join(misses) + ")"
            default = next(
                (r for r in rows if r["cell"] == cell.id and r["arm"] == "contended+hostd"), None
            )
            if arm == "contended+sizing" and mine and default and default["min_steps_per_s"]:
                # item 5 of issue 20: at least as good as the static default on the worst rep
                worse = (row["min_steps_per_s"] or 0) < default["min_steps_per_s"]
                row["goal"] = f"{'below' if worse else 'at least'} the default's worst"
            rows.append(row)
    return rows


def _cell_text(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def preempt_summary(p) -> str:
    """A short line for the agent's status ``preempt`` object, whatever its shape."""
    if p is None:
        return "-"
    if isinstance(p, dict):
        parts = []
        for k, v in p.items():
            if isinstance(v, (list, tuple, dict)):
                parts.append(f"{k}: {len(v)}")
            else:
                parts.append(f"{k}={v}")
        return _cell_text(", ".join(parts))[:160] or "{}"
    return _cell_text(str(p))[:160]


def render(
    rows: list[dict], runs: list[dict], cells: list[Cell], args: argparse.Namespace, info: dict
) -> str:
    ncpu = info["ncpu"]
    hostd_rows = [r for r in rows if r["arm"] == "contended+hostd" and r["goal"]]
    met = sum(1 for r in hostd_rows if r["goal"] == "MET")
    kinds = {c.contention for c in cells}
    lines = [
        SECTION,
        "",
        f"Goal: in every cell, `contended+hostd` (the shipped default policy, unchanged) reaches "
        f"at least {GOAL_SPEED} of `alone` on the median over repetitions AND its worst "
        f"repetition at least {GOAL_SPEED} of alone's worst repetition; the system service probe "
        f"gets at least {GOAL_PROBE} of its slices done; no data worker or comm thread starved "
        f"(the data and comms layers' median run-queue wait share at most "
        f"{STARVE_MARGIN * 100:.0f} points above alone's).",
        "",
        f"Machine: {info['cpu']}, {ncpu} CPUs online, kernel {info['kernel']}, "
        f"autogroups {'on' if info['autogroup'] else 'off'}; Python {info['python']}, torch "
        f"{info['torch']}; hostd at `{info['rev']}`; measured {info['when']}.",
        "",
        f"Method: `python3 bench/trainer/matrix.py --reps {args.reps} --seconds {args.seconds:g} "
        f"--warmup {args.warmup:g}"
        + (f" --spike {args.spike[0]:g} {args.spike[1]:g}" if args.spike else "")
        + "` (see its docstring). The job: `torchrun --nproc-per-node "
        f"{args.ranks}` of bench/trainer/train.py (DDP over gloo), steps counted for "
        f"{args.seconds:g} s after {args.warmup:g} s of warm-up. Cells (model, OMP_NUM_THREADS "
        "per rank, DataLoader workers per rank, contention): "
        + "; ".join(f"`{c.id}` = {c.model}, {c.omp}, {c.workers}, {c.contention}" for c in cells)
        + ". Contention, started 1 s before the job: "
        + "; ".join(
            f"**{k}**: {KINDS[k](ncpu, 'python', Path('.')).describe()}"
            for k in KINDS
            if k in kinds
        )
        + ". Arms: `alone`; `contended` (nothing done); `contended+hostd` (`hostd run`, default "
        "policy, whole host, past its first pass before the job starts; SIGTERM after); "
        "`contended+sizing` (the same with the default's `trainer` self-sizing, `util = "
        f"{SIZING_UTIL}`, and `data` grouped, `cpus = {SIZING_DATA_CPUS}`, self-sizing too); "
        "`contended+tuned` (every 0.5 s every thread of the contention's processes SCHED_IDLE "
        "and the autogroup of their sessions, unless it is the launcher's, nice 19; put back "
        f"after). All arms of a cell interleaved in each of {args.reps} repetitions, order "
        "rotated. `vs alone`: the arm's median steps/s over alone's median; `worst vs alone "
        "worst`: the arm's slowest repetition over alone's slowest; `worst rep vs its alone`: "
        "the least, over repetitions, of the arm over the same repetition's alone. p50/p99: "
        "step time, median over repetitions. `probe`: the least, over repetitions, of the "
        "system service's slices done over those asked (1.00: it kept up). Data/comms wait: "
        "median share of runnable time the DataLoader workers / gloo threads spent waiting on "
        "a run queue (`hostd stats`, middle half of the counted window).",
        "",
        f"Result: the goal is MET in {met} of {len(hostd_rows)} cells."
        if hostd_rows
        else "Result: no `contended+hostd` runs.",
        "",
        "| cell | arm | steps/s | vs alone | worst vs alone worst | worst rep vs its alone | "
        "p50 ms | p99 ms | probe | data wait | comms wait | goal |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        failed = f" ({r['failed']} of {r['runs']} failed)" if r["failed"] else ""
        lines.append(
            f"| {r['cell']} | {r['arm']}{failed} | {_f(r['steps_per_s'])} | {_f(r['vs_alone'])} | "
            f"{_f(r['worst_vs_alone_worst'])} | {_f(r['worst_rep_vs_its_alone'])} | "
            f"{_f(r['p50_ms'], '{:.1f}')} | {_f(r['p99_ms'], '{:.1f}')} | {_f(r['probe'])} | "
            f"{_f(r['data_wait'], '{:.0%}')} | {_f(r['comms_wait'], '{:.0%}')} | "
            f"{r['goal'] or ''} |"
        )
    lines += [
        "",
        "Every run (probe: slices done / asked, worst lateness; most-waiting threads: comm "
        "(layer) run-queue wait ms/s; preempt: the agent's status `preempt` at the end):",
        "",
        "| rep | cell | arm | steps/s | p99 ms | probe | most-waiting threads | preempt |",
        "|---:|---|---|---:|---:|---|---|---|",
    ]
    for r in runs:
        top = ", ".join(
            f"{t['comm']} ({t['layer']}) {t['wait_ms_per_s']:.0f}" for t in r["top"][:3]
        )
        p = r["probe"]
        err = f" ERROR {_cell_text(r['error'])[:200]}" if r["error"] else ""
        lines.append(
            f"| {r['rep']} | {r['cell']} | {r['arm']} | {_f(r['steps_per_s'])} | "
            f"{_f(r['step_ms_p99'], '{:.1f}')} | {p['done']}/{p['asked']}, "
            f"{p['worst_ms']:.0f} ms | {_cell_text(top) or '-'}{err} | "
            f"{preempt_summary(r.get('preempt')) if r['arm'] in HOSTD_ARMS else ''} |"
        )
    resized = [r for r in runs if r.get("resizes")]
    if resized:
        lines += ["", "Resizes of self-sizing layers (the agent's log):", ""]
        lines += [
            f"- rep {r['rep']} {r['cell']}: " + "; ".join(_cell_text(x) for x in r["resizes"][:12])
            for r in resized
        ]
    return "\n".join(lines) + "\n"


# -- main -------------------------------------------------------------------------------------
def list_cells() -> str:
    lines = [f"{'cell':24s} {'model':12s} {'OMP':>3s} {'workers':>7s}  contention"]
    lines += [f"{c.id:24s} {c.model:12s} {c.omp:3d} {c.workers:7d}  {c.contention}" for c in CELLS]
    cover = {
        "model": sorted({c.model for c in CELLS}),
        "OMP": sorted({c.omp for c in CELLS}),
        "workers": sorted({c.workers for c in CELLS}),
        "contention": sorted({c.contention for c in CELLS}),
    }
    lines.append("levels covered: " + "; ".join(f"{k} {v}" for k, v in cover.items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch 2.13.0")
    ap.add_argument("--cells", default=None, help="comma-separated cell ids (default: all)")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    ap.add_argument(
        "--arms",
        default="alone,contended,contended+hostd,contended+tuned",
        help=f"comma-separated arms (+ alone), of {', '.join(ARMS)}",
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--write", type=Path, help="replace (or append) the section in this file")
    ap.add_argument("--json", type=Path, help="also write every run as JSON here")
    ap.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (agent logs, job results)"
    )
    ap.add_argument("--policy", default=None, help="the hostd arm's policy (default: embedded)")
    ap.add_argument(
        "--spike", type=float, nargs=2, metavar=("AT", "SECONDS"), default=None,
        help="a data-loader spike in every arm (train.py --spike: AT s after the job's start)",
    )  # fmt: skip
    ap.add_argument(
        "--render",
        type=Path,
        help="render the runs of a --json file again (with --write: into that file); run nothing",
    )
    ap.add_argument(
        "--shell-probe",
        action="store_true",
        help="in every arm, time `ls /` and `hostd status` typed in a terminal (script(1)) "
        "mid-window",
    )
    args = ap.parse_args()
    if args.list:
        print(list_cells())
        return
    if args.render:
        saved = json.loads(args.render.read_text())
        cells = [Cell(**c) for c in saved["cells"]]
        runs = saved["runs"]
        done = {r["arm"] for r in runs}
        arms = [a for a in ARMS if a in done]
        args.reps = max(r["rep"] for r in runs)
        text = render(summarize(runs, cells, arms), runs, cells, args, saved["meta"])
        print(text)
        if args.write:
            write_section(args.write, text + "\n", SECTION)
        return
    by_id = {c.id: c for c in CELLS}
    ids = [s.strip() for s in args.cells.split(",") if s.strip()] if args.cells else list(by_id)
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        sys.exit(f"unknown cells {unknown}; --list shows them")
    cells = [by_id[i] for i in ids]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = sorted(set(arms) - set(ARMS))
    if bad:
        sys.exit(f"unknown arms {bad}; expected some of {list(ARMS)}")
    arms = ["alone"] + [a for a in ARMS if a in arms and a != "alone"]
    if os.geteuid() != 0:
        sys.exit("bench/trainer/matrix.py needs root (hostd, SCHED_IDLE, autogroups, nobody)")
    need = {
        "stress": ("stress-ng",),
        "launcher-python": ("bash",),
        "build": ("make", "cc", "setpriv"),
        "io": ("dd",),
    }
    for c in cells:
        for tool in need.get(c.contention, ()):
            if shutil.which(tool) is None:
                sys.exit(f"cell {c.id} needs {tool}")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    os.environ[TAG_VAR] = TAG
    if set(HOSTD_ARMS) & set(arms) and other_agents():
        print(
            f"WARNING: hostd run is already running (pids {other_agents()}): the hostd arm "
            "will fail until it is stopped, and every arm is measured under it",
            flush=True,
        )

    runs_n = len(cells) * len(arms) * args.reps
    est = runs_n * (args.seconds + args.warmup + STARTUP_S)
    print(
        f"{len(cells)} cells x {len(arms)} arms x {args.reps} reps x ({args.seconds:g} + "
        f"{args.warmup:g} + ~{STARTUP_S:g} s) = {runs_n} runs, about {est / 60:.0f} min",
        flush=True,
    )
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    info = meta(args)
    chunk = calibrate(2)
    busy(1)
    runs: list[dict] = []
    interrupted = False
    started = time.monotonic()
    try:
        with (
            contextlib.nullcontext(str(args.keep))
            if args.keep
            else tempfile.TemporaryDirectory(prefix="hostd-matrix-")
        ) as tmp:
            if any(c.contention == "build" for c in cells) and arms != ["alone"]:
                Build.prepare()
            n = 0
            for rep in range(args.reps):
                order = arms[rep % len(arms) :] + arms[: rep % len(arms)]
                for cell in cells:
                    for arm in order:
                        pause(2)  # let the last run's processes go
                        n += 1
                        r = run_arm(cell, arm, args, Path(tmp), chunk, n)
                        r["rep"] = rep + 1
                        runs.append(r)
                        p = r["probe"]
                        shell = r.get("shell")
                        print(
                            f"rep {rep + 1} {cell.id:22s} {arm:16s} steps/s "
                            f"{_f(r['steps_per_s']):>6s} p99 {_f(r['step_ms_p99'], '{:.0f}'):>5s}"
                            f" ms probe {_f(p['progress'])} [{r['wall_s']:.0f} s] "
                            f"{'shell ' + json.dumps(shell) + ' ' if shell else ''}"
                            f"{r['error'] or ''} {'; '.join(r['problems'])}"
                            f"{' resizes ' + str(len(r['resizes'])) if r.get('resizes') else ''}",
                            flush=True,
                        )
    except Interrupted:
        interrupted = True
    finally:
        strays = sorted(set(sweep().values()))
        Build.cleanup()
        print(
            f"final sweep: {'stray processes killed: ' + str(strays) if strays else 'none left'}"
            f"; {len(runs)} runs in {(time.monotonic() - started) / 60:.1f} min",
            flush=True,
        )
    rows = summarize(runs, cells, arms)
    text = render(rows, runs, cells, args, info)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"meta": info, "cells": [asdict(c) for c in cells], "runs": runs, "rows": rows},
                indent=1,
            )
        )
    if args.write:
        if interrupted:
            print(f"interrupted: {args.write} left as it was", file=sys.stderr)
        else:
            write_section(args.write, text + "\n", SECTION)
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()

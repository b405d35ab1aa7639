"""Job attempts, for A/B comparisons: which attempt of which job a process belongs to, and the
record the agent keeps of each (``hostd report`` compares them).

A **job** is what attempts are compared under, by its *given* name; an **attempt** is one run
of it. Both come from the environment, cgroup and command line of the job's processes
(docs/operations.md, "A/B rollout"). The attempt, the first that applies deciding:

- ``slurm``: ``slurm ID restart N`` (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``);
- ``torchrun``: ``torchrun ID restart N`` (``TORCHELASTIC_RUN_ID`` unless torchrun's default
  "none", ``TORCHELASTIC_RESTART_COUNT``);
- ``kubernetes``: ``pod UID`` (the pod's cgroup);
- ``command``: the launcher's job (``torchrun PID``) and restart count.

The job's name, the first that applies deciding (a run id is random per launch: as the name it
made every launch a job of one attempt, issue 46):

1. ``HOSTD_JOB`` in the job's environment, whatever the source (source ``hostd``);
2. the Slurm job name, ``SLURM_JOB_NAME``, unless Slurm's default for an interactive
   allocation ("interactive", or a shell's or interpreter's name);
3. the script or command the ranks run (``script_name`` of the rank's command line, which
   the caller passes as ``rank_cmdline``: "train.py", "-m trainer"; through a launcher,
   ``torchrun ... train.py``, its script; none for inline code, ``python -c``);
4. only then the attempt's run id: ``slurm ID``, torchrun's run id, else the program's name.

Only a job's ranks and what runs below them (data workers, compilers, helpers) are counted.
``attempt_of`` is pure; ``hostd.agent.attempts`` keeps the records. A record holds per-sample
per-layer CPU, run-queue wait and timeslices of the attempt's threads, GPU utilisation from NVML
and a throughput the job reports: a file named by ``HOSTD_THROUGHPUT_FILE`` in its environment,
whose first line is ``<number> [unit]`` (for example ``12.5 steps/s``), rewritten as it goes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hostd.model.jobs import Job

SCHEMA = "hostd.attempt/1"
ROLES = ("rank", "data", "compile", "helper")  # a job's roles an attempt counts
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_INTERPRETERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|env|bash|sh|torchrun)$")
_UNIT = re.compile(r"^[\w/%.-]{1,32}$")


@dataclass(frozen=True, slots=True)
class Identity:
    job: str
    attempt: str
    source: str  # "hostd" | "slurm" | "torchrun" | "kubernetes" | "command"


_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_VALUED = ("-W", "-X", "--check-hash-based-pycs")  # the interpreter's options with a value
# Slurm's job name for an interactive allocation (salloc, srun --pty bash) says nothing
_GENERIC_SLURM_NAMES = re.compile(
    r"^(interactive|bash|sh|zsh|ksh|dash|fish|tcsh|csh|python[0-9.]*|srun|salloc)$"
)


def script_name(cmdline: str) -> str | None:
    """The script or module a command line runs ("train.py", "-m trainer"): through
    interpreters and launchers (``python``, ``env``, ``torchrun``, ``python -m
    torch.distributed.run``), the first argument that is not an option (nor an option's value);
    a program that is none of those names itself. None when there is none (``python``,
    ``python -c CODE``)."""
    words = cmdline.split()[:64]
    launcher = False  # torchrun's options take values: "--nproc_per_node 8 train.py"
    while words:
        first = words[0].rsplit("/", 1)[-1]
        if not _INTERPRETERS.match(first):
            return first[:64] or None
        launcher = launcher or first == "torchrun"
        rest, words = words[1:], []
        i = 0
        while i < len(rest):
            word = rest[i]
            if word == "-c":
                return None  # inline code: no script to name the job
            if word in ("-m", "--module") and i + 1 < len(rest):
                module = rest[i + 1]
                if module in _LAUNCHER_MODULES:
                    launcher, i = True, i + 2
                    continue
                return f"-m {module}"[:64]
            if word in _VALUED:
                i += 2
                continue
            if word.startswith("-") or (first == "env" and "=" in word):
                i += 1
                continue
            prev = rest[i - 1] if i else ""
            if launcher and prev.startswith("--") and "=" not in prev and not word.endswith(".py"):
                i += 1  # the value of a launcher's option
                continue
            words = rest[i:]  # the program or script: an interpreter's is looked through
            if _INTERPRETERS.match(word.rsplit("/", 1)[-1]):
                break
            return word.rsplit("/", 1)[-1][:64] or None
    return None


def command_name(cmdline: str) -> str:
    """A short, stable name for a job from its rank's command line: the script or module it
    runs ("train.py", "-m trainer"), else the program's name."""
    words = cmdline.split()
    if not words:
        return "unnamed"
    return script_name(cmdline) or words[0].rsplit("/", 1)[-1][:64]


def attempt_of(
    job: Job | None,
    env: Mapping[str, str],
    cgroup: str,
    cmdline: str,
    rank_cmdline: str | None = None,
) -> Identity | None:
    """The job and attempt of one process (see the module's docstring); None for a process that
    is not a rank or below one. ``rank_cmdline`` is its rank's command line (a rank's own): the
    script there names the job, the same for every process of the attempt (a compiler or a
    helper below the rank runs another program). Without it, the script step is left out
    (a kubernetes or command job is named by ``cmdline``, as ever)."""
    if job is None or job.role not in ROLES:
        return None
    restart = ""
    slurm_id = env.get("SLURM_JOB_ID", "")
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    pod = _POD.search(cgroup)
    own = cmdline if rank_cmdline is None else rank_cmdline  # what names a job without a script
    if slurm_id.isdigit():
        restart = env.get("SLURM_RESTART_COUNT", "0")
        attempt = f"slurm {slurm_id} restart {restart}"
        last, source = f"slurm {slurm_id}", "slurm"
    elif run_id and run_id != "none":
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        attempt = f"torchrun {run_id} restart {restart}"
        last, source = run_id, "torchrun"
    elif pod:
        attempt = f"pod {pod.group(1).replace('_', '-')}"
        last, source = command_name(own), "kubernetes"
    else:
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "")
        attempt = f"{job.id} restart {restart}" if restart else job.id
        last, source = command_name(own), "command"
    slurm_name = env.get("SLURM_JOB_NAME", "").strip()
    if env.get("HOSTD_JOB"):
        name, source = env["HOSTD_JOB"], "hostd"
    elif slurm_name and not _GENERIC_SLURM_NAMES.match(slurm_name):
        name = slurm_name
    else:
        name = (script_name(rank_cmdline) if rank_cmdline is not None else None) or last
    return Identity(name[:64], attempt[:128], source)


def parse_throughput(text: str) -> tuple[float, str] | None:
    """A job's throughput file: its first line, ``<number> [unit]``; None when it says none."""
    words = text.split("\n", 1)[0].split()
    if not words:
        return None
    try:
        value = float(words[0])
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    unit = words[1] if len(words) > 1 and _UNIT.match(words[1]) else ""
    return value, unit


def merge_samples(a: dict, b: dict) -> dict:
    """Two consecutive samples of a record as one (a long attempt's record is halved so)."""
    seconds = a["seconds"] + b["seconds"]
    layers: dict[str, dict] = {}
    for sample in (a, b):
        for name, vals in sample["layers"].items():
            into = layers.setdefault(
                name, {"cpu_seconds": 0.0, "wait_seconds": 0.0, "timeslices": 0, "threads": 0}
            )
            for key in ("cpu_seconds", "wait_seconds", "timeslices"):
                into[key] += vals.get(key, 0)
            into["threads"] = max(into["threads"], vals.get("threads", 0))

    def mean(key: str) -> float | None:
        got = [(s[key], s["seconds"]) for s in (a, b) if s.get(key) is not None]
        if not got:
            return None
        return sum(v * w for v, w in got) / max(1e-9, sum(w for _, w in got))

    return {
        "t": b["t"],
        "seconds": seconds,
        "layers": layers,
        "gpu_utilization": mean("gpu_utilization"),
        "throughput": mean("throughput"),
    }


def halve(samples: list[dict]) -> list[dict]:
    """Every two consecutive samples merged (the last one alone if odd)."""
    out = [merge_samples(samples[i], samples[i + 1]) for i in range(0, len(samples) - 1, 2)]
    if len(samples) % 2:
        out.append(samples[-1])
    return out

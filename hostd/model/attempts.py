"""Job attempts, for A/B comparisons: which attempt of which job a process belongs to, and the
record the agent keeps of each (``hostd report`` compares them).

A **job** is what attempts are compared under; an **attempt** is one run of it. Both come from
the environment and cgroup of the job's processes, the first that applies deciding
(docs/operations.md, "A/B rollout"):

- ``slurm``: attempt ``slurm ID restart N`` (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``), job
  ``SLURM_JOB_NAME`` (else ``slurm ID``);
- ``torchrun``: attempt ``torchrun ID restart N`` (``TORCHELASTIC_RUN_ID`` unless torchrun's
  default "none", ``TORCHELASTIC_RESTART_COUNT``), job the run id;
- ``kubernetes``: attempt ``pod UID`` (the pod's cgroup), job the script the ranks run;
- ``command``: attempt the launcher's job (``torchrun PID``) and restart count, job the script
  the ranks run ("train.py", "-m trainer").

``HOSTD_JOB`` in the job's environment names the job whatever the source (source ``hostd``).
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


def command_name(cmdline: str) -> str:
    """A short, stable name for a job from its rank's command line: the script or module it
    runs ("train.py", "-m trainer"), else the program's name."""
    words = cmdline.split()[:16]
    if not words:
        return "unnamed"
    first = words[0].rsplit("/", 1)[-1]
    if not _INTERPRETERS.match(first):
        return first[:64]
    rest = words[1:]
    for i, word in enumerate(rest):
        if word == "-m" and i + 1 < len(rest):
            return f"-m {rest[i + 1]}"[:64]
        if not word.startswith("-"):
            return word.rsplit("/", 1)[-1][:64]
    return first[:64]


def attempt_of(
    job: Job | None, env: Mapping[str, str], cgroup: str, cmdline: str
) -> Identity | None:
    """The job and attempt of one process (see the module's docstring); None for a process that
    is not a rank or below one."""
    if job is None or job.role not in ROLES:
        return None
    restart = ""
    slurm_id = env.get("SLURM_JOB_ID", "")
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    pod = _POD.search(cgroup)
    if slurm_id.isdigit():
        restart = env.get("SLURM_RESTART_COUNT", "0")
        attempt = f"slurm {slurm_id} restart {restart}"
        name, source = env.get("SLURM_JOB_NAME") or f"slurm {slurm_id}", "slurm"
    elif run_id and run_id != "none":
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        attempt = f"torchrun {run_id} restart {restart}"
        name, source = run_id, "torchrun"
    elif pod:
        attempt = f"pod {pod.group(1).replace('_', '-')}"
        name, source = command_name(cmdline), "kubernetes"
    else:
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "")
        attempt = f"{job.id} restart {restart}" if restart else job.id
        name, source = command_name(cmdline), "command"
    if env.get("HOSTD_JOB"):
        name, source = env["HOSTD_JOB"][:64], "hostd"
    return Identity(name, attempt[:128], source)


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

"""Which training job a process belongs to, and its role in it, from facts that thread names do
not decide: its launcher and parentage, its environment, its cgroup.

``job_of(...)`` is pure: ``hostd.tasks`` calls it once per process as it reads the process
(parents before children), with the parent's ``Job``; the classifier's predicates ``job``,
``job_role`` and ``job_gpu`` and ``hostd explain`` read the result from ``Process.job``.

A job is made by:
- a **launcher**: torchrun / ``python -m torch.distributed.run`` (``pt_elastic`` once renamed),
  ``deepspeed``, ``accelerate launch``, ``mpirun``/``mpiexec``/``orterun``/``prterun`` (and
  their node daemons ``orted``/``prted``), Slurm's ``srun``;
- a **Slurm step**: every process in a step's cgroup (``.../slurmstepd.scope/job_N/step_M/...``
  on v2, ``/slurm/uid_U/job_N/step_M/...`` on v1; ``slurmstepd`` itself, the root daemon, is
  not the job);
- an **environment** that says rank: ``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``,
  ``PMI_RANK``, or ``SLURM_PROCID`` inside a step; where there is no launcher and no step, with
  ``TORCHELASTIC_RUN_ID``, or with ``WORLD_SIZE`` and ``MASTER_ADDR`` (a Kubernetes
  PyTorchJob's pod: a shell that merely exports ``RANK`` is no job). A pod alone is not a job:
  GPU services run in pods too.

Roles: ``launcher``; ``rank`` (a process that carries a rank, started by a launcher, a Slurm
step or a pod); below a rank, whatever the depth and whether workers fork from the rank or
from a forkserver: ``data`` (DataLoader workers, ``pt_data_worker``), ``compile`` (Inductor's
compile workers, the compilers and ``ptxas`` they run) and ``helper`` (forkservers, resource
trackers, loggers such as wandb); ``other``: in the job but not under a rank (a batch script,
a process the launcher's own shell started). Everything here but parentage and the cgroup is
the user's to write (environment, cmdline, comm): a policy gates protection on something
unforgeable as well (``job_gpu``, ``uid``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# The variables read from /proc/PID/environ; nothing else of a process's environment is kept.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
JOB_VARS = (
    *RANK_VARS,
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_RESTART_COUNT",
    "NCCL_SET_THREAD_NAME",
    "SLURM_JOB_NAME",
    "HOSTD_PROTECT",
    "HOSTD_JOB",
    "HOSTD_THROUGHPUT_FILE",
)
# HOSTD_PROTECT in a job's environment: whether it wants hostd's protection (docs/policies.md,
# "Jobs").
PROTECT_YES, PROTECT_NO = ("1", "on", "yes", "true"), ("0", "off", "no", "false")


def protect_choice(env: tuple[tuple[str, str], ...]) -> bool | None:
    """What a process's HOSTD_PROTECT says: True (wants protection), False (refuses it) or None
    (says nothing, or something else)."""
    for key, value in env:
        if key == "HOSTD_PROTECT":
            value = value.strip().lower()
            return True if value in PROTECT_YES else False if value in PROTECT_NO else None
    return None


ROLES = ("launcher", "rank", "data", "compile", "helper", "other")

_LAUNCHER_COMMS = {
    "pt_elastic": "torchrun",
    "torchrun": "torchrun",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "mpirun": "mpirun",
    "mpiexec": "mpirun",
    "orterun": "mpirun",
    "prterun": "mpirun",
    "orted": "mpirun",
    "prted": "mpirun",
    "srun": "srun",
}
_LAUNCHER_CMDLINE = (
    (re.compile(r"(^|[ /])torchrun( |$)|-m torch\.distributed\.(run|launch)\b"), "torchrun"),
    (re.compile(r"(^|[ /])deepspeed( |$)|-m deepspeed\.launcher\.(runner|launch)\b"), "deepspeed"),
    (re.compile(r"(^|[ /])accelerate launch\b|-m accelerate\.commands\.launch\b"), "accelerate"),
)
# A step's cgroup as slurmd makes it: under its slurmstepd.scope (cgroup v2) or under the
# /slurm (or /slurm_NODENAME) root of a v1 hierarchy. Elsewhere a user could name a cgroup of a
# delegated subtree so.
_SLURM_STEP = re.compile(r"(?:/slurmstepd\.scope|^/slurm[^/]*/uid_\d+)/job_(\d+)/step_(\w+)(/|$)")
_DATA_COMMS = ("pt_data_worker", "pt_data_pin")
_COMPILE = re.compile(
    r"^(cc1plus|cc1|g\+\+|c\+\+|gcc|cc|as|ld|ld\.lld|ninja|ptxas|nvcc|cicc|fatbinary|nvlink)$"
)
_COMPILE_CMDLINE = re.compile(r"torch/_inductor/compile_worker")
# Daemons that sit above a job's processes and are not the job.
_NOT_JOB = ("slurmstepd", "containerd-shim", "conmon", "runc")


@dataclass(frozen=True, slots=True)
class Job:
    """A process's training job and its role there."""

    id: str  # "torchrun 3f2a", "slurm 4242.0", "mpirun 311", "of job-0" (its MASTER_ADDR)
    role: str  # one of ROLES
    rank: int | None  # the rank it serves (its own, or its rank ancestor's); None above ranks
    rank_pid: int  # that rank's pid (0 when not under a rank)
    gpu: bool  # that rank (or this process) held a GPU-driver file or was in NVML's list
    why: str  # the facts that decided it, for ``hostd explain``
    thread_names: bool = False  # NCCL_SET_THREAD_NAME=1: NCCL names its threads

    def describe(self) -> str:
        """One line for ``hostd explain``: "data worker of rank 3 of job torchrun abc"."""
        if self.role == "rank":
            return f"rank {self.rank} of job {self.id}"
        if self.rank is not None:
            return f"{self.role} process of rank {self.rank} of job {self.id}"
        return f"{self.role} of job {self.id}"


# One pass over the bytes for every job variable at once (C speed, as re scans for the NUL).
_JOB_VAR = re.compile(
    rb"\0("
    + b"|".join(re.escape(n.encode()) for n in sorted(JOB_VARS, key=len, reverse=True))
    + rb")=([^\0]{0,1024})"
)


def environ_vars(raw: bytes | str) -> tuple[tuple[str, str], ...]:
    """The job variables of a NUL-separated environment (``/proc/PID/environ``): each the first
    of its name, its value cut at 256 characters. One regular-expression pass over the bytes,
    never decoded or split whole: an environment of megabytes (a module system's, a notebook's)
    cost 3.6 ms a process to decode and split, 1 ms to search (BENCHMARKS.md, issue 44.11)."""
    data = b"\0" + (raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw)
    found: dict[str, str] = {}
    for name, value in _JOB_VAR.findall(data):
        key = name.decode()
        if key not in found:
            found[key] = value.decode("utf-8", "replace")[:256]
    return tuple(sorted(found.items()))


def launcher_kind(comm: str, cmdline: str) -> str | None:
    """The launcher a process is, by its name or its command line; None when it is none."""
    kind = _LAUNCHER_COMMS.get(comm)
    if kind:
        return kind
    for pattern, name in _LAUNCHER_CMDLINE:
        if pattern.search(cmdline[:1024]):
            return name
    return None


def slurm_step(cgroup: str) -> tuple[str, str] | None:
    """(job id, step) of a Slurm step's cgroup path, v1 or v2; None elsewhere."""
    m = _SLURM_STEP.search(cgroup)
    return (m.group(1), m.group(2)) if m else None


def _rank_of(env: Mapping[str, str], in_step: bool) -> int | None:
    names = (*RANK_VARS, "SLURM_PROCID") if in_step else RANK_VARS
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def job_of(
    *,
    pid: int,
    comm: str,
    cmdline: str,
    cgroup: str,
    env: Mapping[str, str],
    gpu: bool,
    parent: Job | None,
    parent_comm: str = "",
    rank_gpu: bool = False,
) -> Job | None:
    """The job and role of one process (see the module's docstring), given its parent's.
    ``rank_gpu``: whether the rank this process descends from holds a GPU-driver file now."""
    if comm in _NOT_JOB:
        return None
    names = env.get("NCCL_SET_THREAD_NAME") == "1"
    step = slurm_step(cgroup)
    launcher = launcher_kind(comm, cmdline)
    under_rank = parent is not None and parent.rank_pid > 0
    if under_rank:
        assert parent is not None
        if _COMPILE.match(comm) or _COMPILE_CMDLINE.search(cmdline[:1024]):
            role, why = "compile", "a compiler below the rank"
        elif comm.startswith(_DATA_COMMS):
            role, why = "data", f"{comm} below the rank"
        elif parent.role in ("data", "compile"):
            role, why = parent.role, f"a child of a {parent.role} process"
        else:
            role, why = "helper", f"a process below rank {parent.rank} ({comm})"
        return Job(
            parent.id, role, parent.rank, parent.rank_pid, parent.gpu or rank_gpu,
            f"{why}, pid {parent.rank_pid} being the rank", names or parent.thread_names,
        )  # fmt: skip
    # Which job: the parent's, else the step's, the launcher's or the environment's.
    if parent is not None:
        job_id = parent.id
    elif step is not None:
        job_id = f"slurm {step[0]}.{step[1]}"
    elif launcher is not None:
        job_id = f"{launcher} {env.get('TORCHELASTIC_RUN_ID') or pid}"
    elif env.get("TORCHELASTIC_RUN_ID"):
        job_id = f"torchrun {env['TORCHELASTIC_RUN_ID']}"
    elif _rank_of(env, False) is not None and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        job_id = f"of {env['MASTER_ADDR']}"  # the ranks of one job share their master's address
    else:
        return None
    rank = _rank_of(env, step is not None)
    if launcher is not None:
        where = f"in Slurm step {step[0]}.{step[1]}" if step else ""
        return Job(job_id, "launcher", None, 0, False, f"{launcher} {where}".strip(), names)
    if rank is not None:
        by = (
            f"started by {parent_comm or 'its parent'}"
            if parent is not None
            else (f"in Slurm step {step[0]}.{step[1]}" if step else "with a job environment")
        )
        return Job(job_id, "rank", rank, pid, gpu, f"rank {rank} from its environment, {by}", names)
    why = f"in {job_id} but not below a rank"
    return Job(job_id, "other", None, 0, False, why, names or bool(parent and parent.thread_names))

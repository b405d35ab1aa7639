"""The predicates of a policy's ``match``: one table, read by the policy loader (which names
exist, what argument each takes, which an unprivileged user controls), the classifier (what
each tests) and ``hostd explain`` (which value of the thread it looked at, and its label).

Adding a predicate means adding its row here (and its words in the policy docs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hostd.model.tasks import ACTIVITIES, GPU_DEVICE_PREFIXES, Task

# A user's cmdline can be long: a regex sees its start only, so a match stays bounded.
MATCH_CHARS = 4096


@dataclass(frozen=True, slots=True)
class PredicateSpec:
    name: str
    arg: str  # strings | regex | ids | nice | bool: what the policy gives it
    test: str  # prefix | suffix | contains | regex | in | above | below | is
    fact: Callable[[Task], object]  # the value of the thread it tests
    label: str  # how an explanation names that value
    user_controlled: bool  # any unprivileged user sets it for their own threads
    rule: str = ""  # comm: at most 15 bytes (the kernel's comm); path: absolute
    shown: Callable[[Task], object] | None = None  # what an explanation shows, if not ``fact``


def _gpu_files(t: Task) -> object:
    return [d for d in t.process.gpu_devices if d.startswith(GPU_DEVICE_PREFIXES)] or False


def _role(t: Task) -> str:
    job = t.process.job
    return job.role if job is not None else ""


def _job(t: Task) -> object:
    return t.job_line() or False


_SPECS = (
    # user_controlled: comm through prctl(PR_SET_NAME), the cmdline through argv, the leader's and
    # parent's comm likewise; anyone can run /usr/bin/python3, name cgroups in a delegated
    # subtree, call setsid(2) or raise their nice.
    PredicateSpec("comm_prefix", "strings", "prefix", lambda t: t.comm, "comm", True, "comm"),
    PredicateSpec(
        "pcomm_prefix", "strings", "prefix", lambda t: t.process.comm, "leader comm", True, "comm"
    ),
    PredicateSpec(
        "parent_comm_prefix",
        "strings",
        "prefix",
        lambda t: t.process.parent_comm,
        "parent comm",
        True,
        "comm",
    ),
    PredicateSpec(
        "cgroup_prefix", "strings", "prefix", lambda t: t.process.cgroup, "cgroup", False, "path"
    ),
    PredicateSpec("cgroup_suffix", "strings", "suffix", lambda t: t.process.cgroup, "cgroup", True),
    PredicateSpec(
        "cgroup_contains", "strings", "contains", lambda t: t.process.cgroup, "cgroup", True
    ),
    PredicateSpec("exe", "strings", "in", lambda t: t.process.exe, "exe", True, "path"),
    PredicateSpec("comm_regex", "regex", "regex", lambda t: t.comm, "comm", True),
    PredicateSpec("cgroup_regex", "regex", "regex", lambda t: t.process.cgroup, "cgroup", False),
    PredicateSpec(
        "cmdline_regex",
        "regex",
        "regex",
        lambda t: t.process.cmdline[:MATCH_CHARS],
        "cmdline",
        True,
        shown=lambda t: t.process.cmdline,
    ),
    PredicateSpec("uid", "ids", "in", lambda t: t.uid, "uid", False),
    PredicateSpec("gid", "ids", "in", lambda t: t.gid, "gid", False),
    PredicateSpec("nice_above", "nice", "above", lambda t: t.nice, "nice", True),
    PredicateSpec("nice_below", "nice", "below", lambda t: t.nice, "nice", True),
    PredicateSpec("is_group_leader", "bool", "is", lambda t: t.is_leader, "is group leader", True),
    PredicateSpec("is_kthread", "bool", "is", lambda t: t.is_kthread, "is kernel thread", False),
    PredicateSpec(
        "gpu", "bool", "is", lambda t: t.process.gpu, "GPU devices open", False, shown=_gpu_files
    ),
    PredicateSpec(
        "nvml_gpu_process",
        "bool",
        "is",
        lambda t: t.process.nvml,
        "in NVML's GPU process list",
        False,
    ),
    # A job and its roles come from the launcher, the Slurm step and the environment
    # (hostd.model.jobs): the environment and the command line are the user's to write.
    PredicateSpec(
        "job",
        "bool",
        "is",
        lambda t: t.process.job is not None,
        "in a training job",
        True,
        shown=_job,
    ),
    PredicateSpec(
        "job_role",
        "strings",
        "in",
        _role,
        "role in its job",
        True,
        "role",
        shown=_job,
    ),
    # Unforgeable as gpu is: the rank's GPU-driver fds, and parentage (the kernel's ppid).
    PredicateSpec(
        "job_gpu",
        "bool",
        "is",
        lambda t: t.process.job_gpu,
        "in a job whose rank holds a GPU",
        False,
        shown=_job,
    ),
    # What an unnamed thread of a job was seen doing (the system call it waits in; Task.activity):
    # a thread does what its program says, so the user controls it.
    PredicateSpec(
        "activity",
        "strings",
        "in",
        lambda t: t.activity,
        "activity (unnamed thread of a job)",
        True,
        "activity",
        shown=lambda t: f"{t.activity}: {ACTIVITIES[t.activity]}" if t.activity else False,
    ),
    # The node model (hostd.model.node): from the cgroup path, which only root and the node's
    # managers make, read from the root down, and the managers' own records (a container
    # runtime's OCI spec, logind's sessions).
    PredicateSpec(
        "node",
        "strings",
        "in",
        lambda t: t.process.node.kind,
        "on the node",
        False,
        "node",
        shown=lambda t: t.process.node.line(),
    ),
    PredicateSpec("unit", "strings", "in", lambda t: t.process.node.unit, "systemd unit", False),
    PredicateSpec(
        "pod_namespace",
        "strings",
        "in",
        lambda t: t.process.node.namespace,
        "pod namespace",
        False,
    ),
    PredicateSpec(
        "pod_qos", "strings", "in", lambda t: t.process.node.qos, "pod QoS class", False, "qos"
    ),
    PredicateSpec("static_pod", "bool", "is", lambda t: t.process.node.static, "static pod", False),
    PredicateSpec(
        "login_service",
        "strings",
        "in",
        lambda t: t.process.node.login,
        "login's PAM service",
        False,
    ),
    PredicateSpec(
        "login_tty",
        "bool",
        "is",
        lambda t: t.process.node.login_tty,
        "login with a terminal (logind)",
        False,
    ),
    PredicateSpec(
        "session_leader",
        "bool",
        "is",
        lambda t: t.process.session_leader,
        "its process leads its session",
        True,
    ),
)
PREDICATES: dict[str, PredicateSpec] = {p.name: p for p in _SPECS}

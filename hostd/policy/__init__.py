"""Policy files: TOML in, a validated, frozen ``Policy`` out (pure: no I/O beyond reading it).

A policy is an ordered list of layers; each layer's ``match`` is an OR of AND-groups of
predicates; the first layer that matches a thread wins and the last layer must match every
thread. ``load_policy(path)`` and ``load_default()`` are the entry points; a policy that does not
validate raises ``PolicyError`` with every error of the file, one line each: the file, the
line and column of the key (``hostd.policy.positions``), the key path, the bad value, what was
expected and, for a misspelled key, predicate, role or choice, what was probably meant. Unknown
keys are errors (they are usually typos). Rules that look dangerous (an RT layer an unprivileged
user could enter by renaming a thread) are kept as warnings on the Policy.

Called by the CLI (``hostd policy check``, and every command that takes ``--policy``) and by the
classifier (``hostd.classify``), which compiles the predicates kept here.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from hostd.model.jobs import ROLES
from hostd.model.node import KINDS as NODE_KINDS
from hostd.model.node import QOS
from hostd.model.predicates import PREDICATES as PREDICATE_SPECS
from hostd.model.tasks import ACTIVITIES
from hostd.policy.positions import position

try:  # the regular expression parser, for the limits (Python 3.11+; sre_parse before)
    from re import _parser as _sre_parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parser  # type: ignore[no-redef]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_POLICY = "training.toml"
KINDS = ("confined", "grouped", "open")

SOURCES = ("auto", "events", "poll")
SCHED_POLICIES = ("other", "batch", "idle", "fifo", "rr")
RT_POLICIES = ("fifo", "rr")
NUMA_MODES = ("none", "gpu-local")
IRQ_MODES = ("allow", "avoid")
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
EPP_VALUES = ("default", "performance", "balance_performance", "balance_power", "power")
MODES = ("enforce", "observe")
# How a self-sizing layer's CPUs grow and shrink (hostd.plan.sizing): keep its CPUs and grow
# from its own LLC, then node ("sticky"); fill whole LLCs ("llc"); spread over NUMA nodes ("node").
GROWTH_ORDERS = ("sticky", "llc", "node")


# The predicates (hostd.model.predicates), grouped by the argument they take.
def _taking(arg: str) -> tuple[str, ...]:
    return tuple(name for name, spec in PREDICATE_SPECS.items() if spec.arg == arg)


STRING_PREDICATES = _taking("strings")
REGEX_PREDICATES = _taking("regex")
ID_PREDICATES = _taking("ids")
NICE_PREDICATES = _taking("nice")
BOOL_PREDICATES = _taking("bool")
PREDICATES = tuple(PREDICATE_SPECS)
# Predicates any unprivileged user controls for their own threads (see the table).
USER_CONTROLLED = frozenset(name for name, s in PREDICATE_SPECS.items() if s.user_controlled)
# A predicate's ``rule`` that admits only some words: (what they are, the words).
_CHOICES = {
    "role": ("a job role", ROLES),
    "activity": ("an activity", tuple(ACTIVITIES)),
    "node": ("a node kind", tuple(NODE_KINDS)),
    "qos": ("a pod QoS class", QOS),
}

_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class PolicyError(ValueError):
    """A policy that cannot be used. ``str()`` is the line shown to the user (one per error:
    ``errors`` lists them all, this one first): ``file:line:column: key.path: value: expected
    ... (did you mean ...?)``, the position where the key path is found in the file."""

    def __init__(
        self,
        source: str,
        key: str,
        value: object,
        expected: str,
        problem: str = "",
        *,
        position: tuple[int, int] | None = None,
        hint: str = "",
    ) -> None:
        self.source, self.key, self.value, self.expected = source, key, value, expected
        self.position = position
        self.errors: list[PolicyError] = [self]
        at = f"{source}:{position[0]}:{position[1]}" if position else source
        where = f"{at}: {key}" if key else at
        shown = "" if value is _NOTHING else f": {_show(value)}"
        problem = f": {problem};" if problem else ":"
        hint = f" (did you mean {hint}?)" if hint else ""
        super().__init__(f"{where}{shown}{problem} expected {expected}{hint}")

    @classmethod
    def about_file(cls, source: str, expected: str) -> PolicyError:
        """An error about the file as a whole (unreadable, untrusted), not one of its keys."""
        return cls(source, "", _NOTHING, expected)

    @classmethod
    def all_of(cls, errors: list[PolicyError]) -> PolicyError:
        """Every error of a file at once: the first one, with ``errors`` and one line each."""
        first = errors[0]
        first.errors = list(errors)
        first.args = ("\n".join(str(e.args[0]) for e in errors),)
        return first


def did_you_mean(word: object, choices: tuple[str, ...] | list[str]) -> str:
    """The choices closest to a misspelled ``word`` ("" when none is close)."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    return " or ".join(f'"{c}"' for c in close)


class _Nothing:
    def __repr__(self) -> str:
        return "<nothing>"


_NOTHING: object = _Nothing()


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, slots=True)
class Predicate:
    """One test on a thread, e.g. ``comm_prefix = ["pt_nccl"]``; ``negate`` for ``not = {...}``."""

    name: str
    value: object  # tuple[str, ...] | str (regex) | tuple[int, ...] | int | bool
    negate: bool = False

    def describe(self) -> str:
        value = self.value
        if isinstance(value, tuple) and len(value) == 1:
            value = value[0]
        if isinstance(value, bool):
            text = f"{self.name} = {str(value).lower()}"
        elif isinstance(value, tuple):
            text = f"{self.name} = [{', '.join(repr(v) for v in value)}]"
        else:
            text = f"{self.name} = {value!r}"
        return f"not ({text})" if self.negate else text


@dataclass(frozen=True, slots=True)
class CpuAmount:
    """A CPU count ("count") or a fraction of the online CPUs ("fraction")."""

    count: int | None = None
    fraction: float | None = None

    def resolve(self, total: int) -> int:
        if self.count is not None:
            return self.count
        assert self.fraction is not None
        return max(0, int(self.fraction * total + 1e-9))

    def describe(self) -> str:
        if self.count is not None:
            return str(self.count)
        return f"{round((self.fraction or 0) * 100, 2):g}%"


@dataclass(frozen=True, slots=True)
class Sched:
    policy: str | None = None  # None: leave the thread's policy as it is
    priority: int | None = None  # 1..99 for fifo/rr
    nice: int | None = None
    reset_on_fork: bool = True  # RT only: children start as SCHED_OTHER
    max_rt_threads: int | None = None  # RT only: the per-layer cap (default: 16 per CPU)
    # The nice of the autogroup of a session this layer's process leads (sched(7) "The
    # autogroup feature"): what CFS weighs a whole session by, against other sessions.
    group_nice: int | None = None

    @property
    def realtime(self) -> bool:
        return self.policy in RT_POLICIES


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    comment: str
    match: tuple[tuple[Predicate, ...], ...]  # OR of AND-groups; ((),) matches everything
    kind: str = "open"
    cpus_min: CpuAmount = field(default_factory=lambda: CpuAmount(count=0))
    cpus_max: CpuAmount = field(default_factory=lambda: CpuAmount(fraction=1.0))
    sched: Sched = field(default_factory=Sched)
    numa: str = "none"
    governor: str | None = None
    min_freq: str | None = None  # "max", "NN%" of the hardware maximum, or kHz as digits
    epp: str | None = None
    irqs: str = "allow"
    numa_migrate: str = "move_pages"  # how memory follows: batched move_pages, or migrate_pages
    # While a layer with ``preempt`` has threads, CPU-busy sessions of ``preemptible`` layers'
    # threads yield to it at once: SCHED_IDLE per thread, their session weighed down
    # (``hostd.preempt``).
    preempt: bool = False
    preemptible: bool = False
    # ``util = { low, high }``: the band of per-CPU utilisation of the layer's own CPUs it is
    # sized to (hostd.plan.sizing): above ``high`` it grows, below ``low`` long enough it
    # shrinks. None: a static layer (``cpus`` and its thread count decide).
    util_low: float | None = None
    util_high: float | None = None
    growth: str = "sticky"  # which CPUs it takes and drops first (GROWTH_ORDERS)

    @property
    def self_sizing(self) -> bool:
        """Whether its CPU count follows its measured utilisation (``util``)."""
        return self.util_low is not None and self.util_high is not None

    @property
    def catch_all(self) -> bool:
        return any(len(group) == 0 for group in self.match)

    @property
    def latency(self) -> bool:
        """Layers whose threads are latency-critical get whole cores (see hostd.plan)."""
        return self.sched.realtime or self.irqs == "avoid"


# Kubernetes namespaces whose pods are the node's own infrastructure: the control plane, the
# CNI (Calico, Flannel, Cilium), kube-proxy, CoreDNS, the GPU and network operators' daemons.
INFRA_NAMESPACES = (
    "kube-system", "kube-flannel", "calico-system", "tigera-operator", "gpu-operator",
    "nvidia-gpu-operator", "nvidia-network-operator",
)  # fmt: skip
WEIGH_JOB = ("always", "while-needed")  # [preempt] weigh_job


@dataclass(frozen=True, slots=True)
class Preempt:
    """``[preempt]``: when and how preemptible work yields to protected layers."""

    enabled: bool = True
    busy: float = 0.5  # CPUs a session's preemptible threads want (run + run-queue wait)
    interval: float = 1.0  # seconds between measurements (stretched to 20x their cost)
    release_after: float = 30.0  # seconds a demoted session must want less than busy/4
    session_nice: int | None = 19  # a demoted session's autogroup nice (None: "keep")
    # the floor: a demoted session that stays runnable this long without running is lifted
    floor: float = 10.0
    # CPUs a user's interactive sessions (a login with a terminal) keep while a job runs
    interactive_cpus: float = 1.0
    # CPUs a demoted cgroup that hostd weighs down ([cgroups] write) may run at most (cpu.max)
    cap_cpus: float = 0.1
    # When a layer's negative group_nice (the job's session weight) is given: "always", or
    # "while-needed" (only while demoted work sits outside /hostd.demoted and capped cgroups)
    weigh_job: str = "always"
    # What is never demoted, by what it is on the node (hostd.model.node): its kind, a pod's
    # namespace, a static pod, a systemd unit (shell-style patterns), a login of these users.
    keep_kinds: tuple[str, ...] = ("kernel", "init", "service")
    keep_namespaces: tuple[str, ...] = INFRA_NAMESPACES
    keep_static_pods: bool = True
    keep_units: tuple[str, ...] = ()
    keep_logins_of: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class Guard:
    """``[guard]``: the starvation guard and the real-time runaway check."""

    enabled: bool = True
    starve_after: float = 5.0  # seconds runnable without running before a boost
    boost_ms: float = 10.0  # how long a boost (SCHED_RR 1) lasts
    rt_runaway_after: float = 5.0  # seconds a hostd real-time thread may keep a CPU busy
    rt_runaway_share: float = 0.9  # ... at this share of a CPU or more


@dataclass(frozen=True, slots=True)
class Metrics:
    """``[metrics]``: the agent's Prometheus exporter (hostd/agent/metrics.py)."""

    enabled: bool = True
    address: str = "127.0.0.1"  # localhost by default: a DaemonSet sets HOSTD_METRICS_ADDRESS
    port: int = 9464  # 0: any free port (the status file says which)
    # seconds between samples of every thread's schedstat (per-layer and per-attempt series;
    # stretched to 100 times a sample's cost where that is longer: hostd.agent.layerstats)
    sample_interval: float = 5.0


@dataclass(frozen=True, slots=True)
class Sizing:
    """``[sizing]``: how often self-sizing layers (``util``) are decided (hostd.plan.sizing)."""

    interval: float = 1.0  # seconds between decisions (one utilisation sample each)
    shrink_after: float = 10.0  # seconds a layer must stay below util.low before it shrinks


@dataclass(frozen=True, slots=True)
class Policy:
    source: str  # the file path, or "<embedded training.toml>"
    sha256: str
    version: int
    name: str
    description: str
    mode: str
    layers: tuple[Layer, ...]
    warnings: tuple[str, ...] = ()
    restore_on_exit: bool = True  # [agent] restore_on_exit: a clean stop puts everything back
    interval: float = 5.0  # [agent] interval: seconds between passes when polling /proc
    event_source: str = "auto"  # [agent] source: "auto" (events where possible), "events", "poll"
    rescan_interval: float = 60.0  # [agent] rescan_interval: the drift check, event mode
    agent_nice: int | None = -10  # [agent] nice: hostd's own nice value (None: leave it)
    cpu_dma_latency_us: int | None = None  # [agent] a C-state limit held while hostd runs
    pool_min: CpuAmount | None = None  # CPUs always left to the shared pool (None: 25%, >= 2)
    preempt: Preempt = field(default_factory=Preempt)  # [preempt]
    guard: Guard = field(default_factory=Guard)  # [guard]
    metrics: Metrics = field(default_factory=Metrics)  # [metrics]
    sizing: Sizing = field(default_factory=Sizing)  # [sizing]
    # [jobs] protect: whether a job that does not say (HOSTD_PROTECT) gets protected layers
    jobs_protect: bool = True
    # [jobs] record: whether the agent records job attempts for ``hostd report``
    jobs_record: bool = True
    # [cgroups] write: the node kinds (hostd.model.node) whose cgroups, another manager's, hostd
    # may write into: a demoted session's own cgroup weighed down, a layer's v2 cpuset inside
    # a job's cgroup. Elsewhere it changes threads only (hostd's own cgroups are always its own).
    cgroups_write: tuple[str, ...] = ()

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @property
    def predicates_used(self) -> frozenset[str]:
        return frozenset(p.name for layer in self.layers for g in layer.match for p in g)

    @property
    def protected(self) -> frozenset[str]:
        """Layers that preemptible work yields to (``preempt = true``)."""
        return frozenset(ly.name for ly in self.layers if ly.preempt)

    @property
    def preemptible(self) -> frozenset[str]:
        """Layers whose busy sessions are demoted while a protected layer has threads."""
        if not self.preempt.enabled:
            return frozenset()
        return frozenset(ly.name for ly in self.layers if ly.preemptible)

    @property
    def self_sizing(self) -> tuple[Layer, ...]:
        """The layers whose CPU count follows their utilisation (``util``), in policy order."""
        return tuple(ly for ly in self.layers if ly.self_sizing)

    @property
    def needs_fds(self) -> bool:
        """Whether classification or planning needs the per-process GPU fd walk."""
        return bool({"gpu", "job_gpu"} & self.predicates_used) or any(
            ly.numa == "gpu-local" for ly in self.layers
        )


# -- validation --------------------------------------------------------------------------------
def _is_gate(pred: Predicate) -> bool:
    """Whether a predicate holds back an unprivileged user who renames a thread.

    uid/gid, an anchored cgroup path, and the GPU signals when they must be true. (The GPU
    device files are often open to every local user: on a GPU host, GPU users are trusted.)
    """
    if pred.negate or pred.name in USER_CONTROLLED:
        return False
    if pred.name in BOOL_PREDICATES:
        return pred.value is True
    if pred.name == "cgroup_regex":
        return str(pred.value).startswith("^/")
    return True


def gated(layer: Layer) -> bool:
    """Whether every AND-group of the layer holds a gate (``_is_gate``): no user lands in it
    by what they set (a name, an argument, an environment)."""
    return all(any(_is_gate(pred) for pred in group) for group in layer.match)


def elevation(layer: Layer) -> str | None:
    """What a layer gives its threads beyond what any user may take for themselves, in words
    (None: nothing): real-time, a negative nice, a heavier session, precedence over other
    work. (A catch-all group gives it to everything, which is the policy's choice, not a
    user's: it is not warned about.)"""
    sched = layer.sched
    if sched.realtime:
        return f"is real-time ({sched.policy})"
    if sched.nice is not None and sched.nice < 0:
        return f"gives nice {sched.nice}"
    if sched.group_nice is not None and sched.group_nice < 0:
        return f"gives its sessions nice {sched.group_nice}"
    if layer.preempt:
        return "preempts other work (preempt = true)"
    return None


def _key_name(name: str) -> str:
    """A key as TOML would write it: bare when it can be, else quoted (keeps errors one line)."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


class _Skip(Exception):
    """A part of the policy had errors (already in ``_Checker.errors``): left out."""


class _Checker:
    """Walks the parsed TOML and collects every problem (``errors``), each with its key path and
    its position in ``text``; one part's error does not hide another part's."""

    def __init__(self, source: str, text: str = "") -> None:
        self.source, self.text = source, text
        self.warnings: list[str] = []
        self.errors: list[PolicyError] = []

    def fail(
        self, key: str, value: object, expected: str, problem: str = "", hint: str = ""
    ) -> PolicyError:
        where = position(self.text, key) if self.text and key else None
        return PolicyError(
            self.source, key, value, expected, problem, position=where, hint=hint
        )  # fmt: skip

    def attempt(self, fn, *args, default=None):  # type: ignore[no-untyped-def]
        """``fn(*args)``, or ``default`` when it raised a PolicyError (kept in ``errors``)."""
        try:
            return fn(*args)
        except PolicyError as exc:
            self.errors.append(exc)
        except _Skip:
            pass
        return default

    def table(self, value: object, key: str, allowed: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, value, f"a table with keys {', '.join(allowed)}")
        for name in value:
            if name not in allowed:
                self.errors.append(
                    self.fail(
                        f"{key}.{_key_name(name)}" if key else _key_name(name),
                        _NOTHING,
                        f"one of {', '.join(allowed)}",
                        problem="unknown key (a typo?)",
                        hint=did_you_mean(name, allowed),
                    )
                )
        return value

    def choice(self, value: object, key: str, choices: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            expected = "one of " + ", ".join(f'"{c}"' for c in choices)
            raise self.fail(key, value, expected, hint=did_you_mean(value, choices))
        return value

    def string(self, value: object, key: str, *, empty_ok: bool = False) -> str:
        if not isinstance(value, str) or (not empty_ok and not value.strip()):
            raise self.fail(key, value, "a non-empty string")
        return value

    def integer(self, value: object, key: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(key, value, f"an integer from {lo} to {hi}")
        return value

    def number(self, value: object, key: str, lo: float, hi: float, what: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not lo <= value <= hi
        ):
            raise self.fail(key, value, f"{what}, {lo:g} to {hi:g}")
        return float(value)

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "true or false")
        return value

    # -- pieces --
    def cpu_amount(self, value: object, key: str) -> CpuAmount:
        expected = 'a CPU count (integer >= 0), a fraction in (0, 1] or a percentage like "50%"'
        if isinstance(value, bool):
            raise self.fail(key, value, expected)
        if isinstance(value, int):
            if value < 0:
                raise self.fail(key, value, expected)
            return CpuAmount(count=value)
        if isinstance(value, float):
            if not 0 < value <= 1:
                raise self.fail(key, value, expected)
            return CpuAmount(fraction=value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", value)
            if match and 0 < float(match.group(1)) <= 100:
                return CpuAmount(fraction=float(match.group(1)) / 100)
        raise self.fail(key, value, expected)

    def predicate(self, value: object, key: str) -> Predicate:
        if not isinstance(value, dict) or len(value) != 1:
            raise self.fail(
                key, value, 'a table with exactly one predicate, e.g. { comm_prefix = "pt_" }'
            )
        ((name, arg),) = value.items()
        sub = f"{key}.{_key_name(name)}"
        if name == "not":
            inner = self.predicate(arg, sub)
            if inner.negate:
                raise self.fail(sub, arg, "a predicate (not inside not is not allowed)")
            return Predicate(inner.name, inner.value, negate=True)
        if name in STRING_PREDICATES:
            items = [arg] if isinstance(arg, str) else arg
            if (
                not isinstance(items, list)
                or not items
                or not all(isinstance(s, str) and s for s in items)
            ):
                raise self.fail(sub, arg, "a non-empty string or a list of non-empty strings")
            rule = PREDICATE_SPECS[name].rule
            if rule == "comm":
                for s in items:
                    if len(s.encode()) > 15:
                        raise self.fail(
                            sub, s, "at most 15 bytes of UTF-8 (the kernel keeps 15 of a comm)"
                        )
            if rule in _CHOICES:
                what, choices = _CHOICES[rule]
                for s in items:
                    if s not in choices:
                        expected = f"{what}: " + ", ".join(choices)
                        raise self.fail(sub, s, expected, hint=did_you_mean(s, choices))
            if rule == "path":
                for s in items:
                    if not s.startswith("/"):
                        raise self.fail(
                            sub, s, "an absolute path starting with '/' (the kernel shows no other)"
                        )
            return Predicate(name, tuple(items))
        if name in REGEX_PREDICATES:
            if not isinstance(arg, str) or not arg:
                raise self.fail(sub, arg, "a regular expression as a non-empty string")
            why = regex_problem(arg)
            if why:
                raise self.fail(sub, arg, f"a regular expression that {why}")
            return Predicate(name, arg)
        if name in ID_PREDICATES:
            items = [arg] if isinstance(arg, int) and not isinstance(arg, bool) else arg
            if (
                not isinstance(items, list)
                or not items
                or not all(
                    isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in items
                )
            ):
                raise self.fail(sub, arg, "an id (integer >= 0) or a list of ids")
            return Predicate(name, tuple(items))
        if name in NICE_PREDICATES:
            return Predicate(name, self.integer(arg, sub, -20, 19))
        if name in BOOL_PREDICATES:
            if not isinstance(arg, bool):
                raise self.fail(sub, arg, "true or false")
            return Predicate(name, arg)
        raise self.fail(
            sub,
            _NOTHING,
            "one of " + ", ".join((*PREDICATES, "not")),
            problem="unknown predicate",
            hint=did_you_mean(name, (*PREDICATES, "not")),
        )

    def match(self, value: object, key: str) -> tuple[tuple[Predicate, ...], ...]:
        expected = "a list of AND-groups, each a list of predicate tables ([[]] matches all)"
        if not isinstance(value, list) or not value:
            raise self.fail(key, value, expected)
        groups = []
        before = len(self.errors)
        for i, group in enumerate(value):
            if not isinstance(group, list):
                self.errors.append(self.fail(f"{key}[{i}]", group, expected))
                continue
            preds = [
                self.attempt(self.predicate, p, f"{key}[{i}][{j}]") for j, p in enumerate(group)
            ]
            groups.append(tuple(p for p in preds if p is not None))
        if len(self.errors) > before:
            raise _Skip
        return tuple(groups)

    def sched(self, value: object, key: str) -> Sched:
        data = self.table(
            value,
            key,
            ("policy", "priority", "nice", "reset_on_fork", "max_rt_threads", "group_nice"),
        )
        policy = None
        if "policy" in data:
            policy = self.choice(data["policy"], f"{key}.policy", SCHED_POLICIES)
        priority = None
        if policy in RT_POLICIES:
            if "priority" not in data:
                raise self.fail(f"{key}.priority", _NOTHING, f"a priority 1-99 for {policy}")
            priority = self.integer(data["priority"], f"{key}.priority", 1, 99)
        elif "priority" in data:
            raise self.fail(
                f"{key}.priority", data["priority"], 'no priority unless policy is "fifo" or "rr"'
            )
        nice = None
        if "nice" in data:
            if policy in (*RT_POLICIES, "idle"):
                raise self.fail(
                    f"{key}.nice",
                    data["nice"],
                    f"no nice with policy {policy!r} (it has no effect)",
                )
            nice = self.integer(data["nice"], f"{key}.nice", -20, 19)
        reset = True
        if "reset_on_fork" in data:
            reset = data["reset_on_fork"]
            if not isinstance(reset, bool):
                raise self.fail(f"{key}.reset_on_fork", reset, "true or false")
        cap = None
        if "max_rt_threads" in data:
            if policy not in RT_POLICIES:
                raise self.fail(
                    f"{key}.max_rt_threads", data["max_rt_threads"], 'only with "fifo" or "rr"'
                )
            cap = self.integer(data["max_rt_threads"], f"{key}.max_rt_threads", 1, 1_000_000)
        group_nice = None
        if "group_nice" in data:
            group_nice = self.integer(data["group_nice"], f"{key}.group_nice", -20, 19)
        return Sched(policy, priority, nice, reset, cap, group_nice)

    def min_freq(self, value: object, key: str) -> str:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return str(value)
        if isinstance(value, str):
            if value == "max":
                return value
            match = re.fullmatch(r"(\d+)%", value)
            if match and 0 < int(match.group(1)) <= 100:
                return value
        raise self.fail(key, value, 'a frequency in kHz (integer > 0), "max" or a percentage')

    def cpus(self, value: object, kind: str, key: str) -> tuple[CpuAmount, CpuAmount]:
        if kind == "open":
            raise self.fail(key, value, 'no cpus on an "open" layer (it uses what is left)')
        cpus = self.table(value, key, ("min", "max"))
        cpus_min, cpus_max = CpuAmount(count=0), CpuAmount(fraction=1.0)
        if "min" in cpus:
            cpus_min = self.cpu_amount(cpus["min"], f"{key}.min")
        if "max" in cpus:
            cpus_max = self.cpu_amount(cpus["max"], f"{key}.max")
        if cpus_max.count == 0:
            raise self.fail(f"{key}.max", 0, "at least 1 CPU")
        same_unit = (cpus_min.count is None) == (cpus_max.count is None)
        if same_unit and cpus_min.resolve(1000) > cpus_max.resolve(1000):
            raise self.fail(key, value, "min no larger than max")
        return cpus_min, cpus_max

    def util(self, value: object, kind: str, key: str) -> tuple[float, float]:
        """``util = { low, high }``: 0 < low < high <= 1 (fractions of the layer's CPUs' time)."""
        if kind == "open":
            raise self.fail(
                key, value, 'no util on an "open" layer (it has no CPUs of its own to size)'
            )
        data = self.table(value, key, ("low", "high"))
        low = self.attempt(
            self.fraction, data.get("low", 0.5), f"{key}.low", False,
            "the busy share of its CPUs below which it shrinks",
        )  # fmt: skip
        high = self.attempt(
            self.fraction, data.get("high", 0.8), f"{key}.high", True,
            "the busy share of its CPUs above which it grows",
        )  # fmt: skip
        if low is None or high is None:
            raise _Skip
        if low >= high:
            raise self.fail(key, value, "low below high (a band to stay in, not a point)")
        return low, high

    def fraction(self, value: object, key: str, one_ok: bool, what: str) -> float:
        """A fraction above 0 and below 1 (up to 1 with ``one_ok``)."""
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not (0 < value < 1 or (one_ok and value == 1))
        ):
            raise self.fail(key, value, f"a fraction in (0, {'1]' if one_ok else '1)'}: {what}")
        return float(value)

    def layer(self, value: object, key: str) -> Layer:
        allowed = (
            "name", "comment", "match", "kind", "cpus", "sched", "numa", "governor",
            "min_freq", "epp", "irqs", "numa_migrate", "preempt", "preemptible", "util",
            "growth",
        )  # fmt: skip
        before = len(self.errors)
        data = self.table(value, key, allowed)
        for required in ("name", "comment", "match"):
            if required not in data:
                self.errors.append(
                    self.fail(f"{key}.{required}", _NOTHING, "this key (it is required)")
                )
        name = data.get("name", "")
        if "name" in data and (not isinstance(name, str) or not _NAME_RE.fullmatch(name)):
            self.errors.append(
                self.fail(
                    f"{key}.name", name, "a name of 1-32 lowercase letters, digits, '-' or '_'"
                )
            )
        comment = match = None
        if "comment" in data:
            comment = self.attempt(self.string, data["comment"], f"{key}.comment")
        if "match" in data:
            match = self.attempt(self.match, data["match"], f"{key}.match")
        kind = self.attempt(self.choice, data.get("kind", "open"), f"{key}.kind", KINDS)
        cpus_min, cpus_max = CpuAmount(count=0), CpuAmount(fraction=1.0)
        if "cpus" in data and kind is not None:
            got = self.attempt(self.cpus, data["cpus"], kind, f"{key}.cpus")
            if got is not None:
                cpus_min, cpus_max = got
        sched = Sched()
        if "sched" in data:
            sched = self.attempt(self.sched, data["sched"], f"{key}.sched", default=Sched())
        numa = self.attempt(self.choice, data.get("numa", "none"), f"{key}.numa", NUMA_MODES)
        governor = None
        if "governor" in data:
            governor = self.attempt(self.choice, data["governor"], f"{key}.governor", GOVERNORS)
        min_freq = None
        if "min_freq" in data:
            min_freq = self.attempt(self.min_freq, data["min_freq"], f"{key}.min_freq")
        epp = None
        if "epp" in data:
            epp = self.attempt(self.choice, data["epp"], f"{key}.epp", EPP_VALUES)
        irqs = self.attempt(self.choice, data.get("irqs", "allow"), f"{key}.irqs", IRQ_MODES)
        migrate = self.attempt(
            self.choice,
            data.get("numa_migrate", "move_pages"),
            f"{key}.numa_migrate",
            ("move_pages", "migrate_pages"),
        )
        util = None
        if "util" in data and kind is not None:
            util = self.attempt(self.util, data["util"], kind, f"{key}.util")
        growth = self.attempt(
            self.choice, data.get("growth", "sticky"), f"{key}.growth", GROWTH_ORDERS
        )
        preempt = self.attempt(self.boolean, data.get("preempt", False), f"{key}.preempt")
        preemptible = self.attempt(
            self.boolean, data.get("preemptible", False), f"{key}.preemptible"
        )
        if preempt and preemptible:
            self.errors.append(
                self.fail(
                    f"{key}.preemptible",
                    True,
                    "not both: a layer that preempts others (preempt = true) cannot yield to them",
                )
            )
        if preemptible and sched.realtime:
            self.errors.append(
                self.fail(
                    f"{key}.preemptible",
                    True,
                    f"no preemptible real-time layer (sched.policy = {sched.policy!r})",
                )
            )
        if kind == "open" and (governor or min_freq or epp or irqs == "avoid"):
            self.errors.append(
                self.fail(
                    key,
                    _NOTHING,
                    'governor, min_freq, epp and irqs = "avoid" only on a "confined" or '
                    '"grouped" layer (they act on the layer\'s own CPUs)',
                )
            )
        if len(self.errors) > before:
            raise _Skip
        assert isinstance(name, str) and comment is not None and match is not None
        low, high = util if util is not None else (None, None)
        layer = Layer(
            name, comment, match, kind, cpus_min, cpus_max, sched, numa, governor, min_freq,
            epp, irqs, migrate, preempt, preemptible, low, high, growth or "sticky",
        )  # fmt: skip
        gives = elevation(layer)
        if gives:
            for i, group in enumerate(match):
                if group and not any(_is_gate(p) for p in group):
                    self.warnings.append(
                        f"{self.source}: {key}.match[{i}]: layer {name!r} {gives} "
                        "but this group tests only what any user controls "
                        "(comm, cmdline, ...); any user could enter it by renaming a thread: "
                        "add a uid, cgroup or gpu condition"
                    )
        return layer

    def agent_table(self, value: object) -> tuple:
        agent = self.table(
            value,
            "agent",
            (
                "mode", "restore_on_exit", "interval", "source", "rescan_interval", "nice",
                "cpu_dma_latency_us",
            ),
        )  # fmt: skip
        mode = self.attempt(self.choice, agent.get("mode", "enforce"), "agent.mode", MODES)
        restore_on_exit = self.attempt(
            self.boolean, agent.get("restore_on_exit", True), "agent.restore_on_exit"
        )
        interval = self.attempt(
            self.number, agent.get("interval", 5.0), "agent.interval", 0.1, 3600,
            "seconds between passes",
        )  # fmt: skip
        source = self.attempt(self.choice, agent.get("source", "auto"), "agent.source", SOURCES)
        rescan = self.attempt(
            self.number, agent.get("rescan_interval", 60.0), "agent.rescan_interval", 1, 86400,
            "seconds between drift rescans",
        )  # fmt: skip
        agent_nice = agent.get("nice", -10)
        if agent_nice != "keep" and (
            isinstance(agent_nice, bool)
            or not isinstance(agent_nice, int)
            or not -20 <= agent_nice <= 19
        ):
            self.errors.append(
                self.fail("agent.nice", agent_nice, 'an integer from -20 to 19, or "keep"')
            )
        latency = agent.get("cpu_dma_latency_us")
        if latency is not None:
            latency = self.attempt(
                self.integer, latency, "agent.cpu_dma_latency_us", 0, 2_000_000_000
            )
        return mode, restore_on_exit, interval, source, rescan, agent_nice, latency

    def policy(self, data: dict, raw: bytes) -> Policy:
        self.table(
            data,
            "",
            (
                "version", "name", "description", "pool_min", "agent", "preempt", "guard",
                "cgroups", "metrics", "sizing", "jobs", "layer",
            ),
        )  # fmt: skip
        if "version" not in data:
            self.errors.append(self.fail("version", _NOTHING, "version = 1"))
        elif type(data["version"]) is not int or data["version"] != 1:
            self.errors.append(self.fail("version", data["version"], "1 (the only policy version)"))
        agent = self.attempt(self.agent_table, data.get("agent", {}))
        layers_raw = data.get("layer")
        layers: list[Layer | None] = []
        if not isinstance(layers_raw, list) or not layers_raw:
            self.errors.append(
                self.fail(
                    "layer",
                    layers_raw if layers_raw is not None else _NOTHING,
                    "at least one [[layer]], the last one a catch-all",
                )
            )
        else:
            layers = [
                self.attempt(self.layer, ly, f"layer[{i}]") for i, ly in enumerate(layers_raw)
            ]
        names: set[str] = set()
        for i, layer in enumerate(layers):
            if layer is None:
                continue
            if layer.name in names:
                self.errors.append(
                    self.fail(f"layer[{i}].name", layer.name, "a name no other layer has")
                )
            names.add(layer.name)
            if layer.catch_all and i != len(layers) - 1:
                self.errors.append(
                    self.fail(
                        f"layer[{i}].match",
                        _NOTHING,
                        "no empty AND-group before the last layer (it would match every thread "
                        "and leave the layers after it unreachable)",
                    )
                )
        last = layers[-1] if layers else None
        if last is not None and not last.catch_all:
            self.errors.append(
                self.fail(
                    f"layer[{len(layers) - 1}].match",
                    _NOTHING,
                    f"the last layer ({last.name!r}) to be a catch-all: match = [[]]",
                )
            )
        name = data.get("name", Path(self.source).stem if self.source else "policy")
        description = data.get("description", "")
        self.attempt(self.string, name, "name")
        if not isinstance(description, str):
            self.errors.append(self.fail("description", description, "a string"))
        valid = [ly for ly in layers if ly is not None]
        if any(ly.preemptible for ly in valid) and not any(ly.preempt for ly in valid):
            first = next(i for i, ly in enumerate(layers) if ly is not None and ly.preemptible)
            self.errors.append(
                self.fail(
                    f"layer[{first}].preemptible",
                    True,
                    "a layer with preempt = true for it to yield to (none has it)",
                )
            )
        preempt = self.attempt(self.preempt_table, data.get("preempt", {}))
        guard = self.attempt(self.guard_table, data.get("guard", {}))
        metrics = self.attempt(self.metrics_table, data.get("metrics", {}))
        sizing = self.attempt(self.sizing_table, data.get("sizing", {}))
        jobs = self.attempt(self.table, data.get("jobs", {}), "jobs", ("protect", "record")) or {}
        jobs_protect = self.attempt(self.boolean, jobs.get("protect", True), "jobs.protect")
        jobs_record = self.attempt(self.boolean, jobs.get("record", True), "jobs.record")
        cgroups = self.attempt(self.table, data.get("cgroups", {}), "cgroups", ("write",)) or {}
        cgroups_write = self.attempt(
            self.words, cgroups.get("write", []), "cgroups.write",
            ("a node kind", tuple(k for k in NODE_KINDS if k not in ("kernel", "root"))),
        )  # fmt: skip
        pool_min = None
        if "pool_min" in data:
            pool_min = self.attempt(self.cpu_amount, data["pool_min"], "pool_min")
            if pool_min is not None and pool_min.count == 0:
                self.errors.append(
                    self.fail("pool_min", 0, "at least 1: the catch-all layer needs a CPU")
                )
        if self.errors:
            raise PolicyError.all_of(self.errors)
        assert agent is not None and preempt is not None and guard is not None
        assert metrics is not None and sizing is not None
        mode, restore_on_exit, interval, source, rescan, agent_nice, latency = agent
        return Policy(
            source=self.source,
            sha256=hashlib.sha256(raw).hexdigest(),
            version=1,
            name=name,
            description=description,
            mode=mode,
            layers=tuple(valid),
            restore_on_exit=restore_on_exit,
            interval=float(interval),
            event_source=source,
            rescan_interval=float(rescan),
            agent_nice=None if agent_nice == "keep" else agent_nice,
            cpu_dma_latency_us=latency,
            pool_min=pool_min,
            preempt=preempt,
            guard=guard,
            metrics=metrics,
            sizing=sizing,
            jobs_protect=bool(jobs_protect),
            jobs_record=bool(jobs_record),
            cgroups_write=cgroups_write or (),
            warnings=tuple(self.warnings),
        )

    def metrics_table(self, value: object) -> Metrics:
        data = self.table(value, "metrics", ("enabled", "address", "port", "sample_interval"))
        d = Metrics()
        address = data.get("address", d.address)
        try:
            ipaddress.ip_address(address)
        except (TypeError, ValueError):
            self.errors.append(
                self.fail(
                    "metrics.address", address, 'an IP address to listen on, e.g. "127.0.0.1"'
                )
            )
        enabled = self.attempt(self.boolean, data.get("enabled", d.enabled), "metrics.enabled")
        port = self.attempt(self.integer, data.get("port", d.port), "metrics.port", 0, 65535)
        every = self.attempt(
            self.number, data.get("sample_interval", d.sample_interval),
            "metrics.sample_interval", 0.5, 600, "seconds",
        )  # fmt: skip
        return Metrics(
            enabled=bool(enabled), address=str(address), port=port or 0,
            sample_interval=every or d.sample_interval,
        )  # fmt: skip

    def sizing_table(self, value: object) -> Sizing:
        data = self.table(value, "sizing", ("interval", "shrink_after"))
        d = Sizing()
        interval = self.number(
            data.get("interval", d.interval), "sizing.interval", 0.1, 60,
            "seconds between sizing decisions",
        )  # fmt: skip
        shrink_after = self.number(
            data.get("shrink_after", d.shrink_after), "sizing.shrink_after", interval, 86400,
            "seconds (at least sizing.interval)",
        )  # fmt: skip
        return Sizing(interval=interval, shrink_after=shrink_after)

    def preempt_table(self, value: object) -> Preempt:
        data = self.table(
            value, "preempt", ("enabled", "busy", "interval", "release_after", "session_nice",
                               "floor", "interactive_cpus", "cap_cpus", "weigh_job",
                               "keep_kinds", "keep_namespaces",
                               "keep_static_pods",
                               "keep_units", "keep_logins_of"),
        )  # fmt: skip
        d = Preempt()
        nice = data.get("session_nice", d.session_nice)
        if nice != "keep" and (
            isinstance(nice, bool) or not isinstance(nice, int) or not -20 <= nice <= 19
        ):
            raise self.fail("preempt.session_nice", nice, 'an integer from -20 to 19, or "keep"')
        interval = self.number(
            data.get("interval", d.interval), "preempt.interval", 0.1, 60, "seconds"
        )
        release = self.number(
            data.get("release_after", d.release_after),
            "preempt.release_after",
            interval,
            86400,
            "seconds (at least preempt.interval)",
        )
        return Preempt(
            enabled=self.boolean(data.get("enabled", d.enabled), "preempt.enabled"),
            busy=self.number(
                data.get("busy", d.busy), "preempt.busy", 0.01, 4096, "CPUs a session wants"
            ),
            interval=interval,
            release_after=release,
            session_nice=None if nice == "keep" else nice,  # type: ignore[arg-type]
            floor=self.number(
                data.get("floor", d.floor),
                "preempt.floor",
                2 * interval,
                3600,
                "seconds (at least twice preempt.interval)",
            ),
            interactive_cpus=self.number(
                data.get("interactive_cpus", d.interactive_cpus),
                "preempt.interactive_cpus",
                0,
                4096,
                "CPUs",
            ),
            cap_cpus=self.number(
                data.get("cap_cpus", d.cap_cpus), "preempt.cap_cpus", 0, 4096, "CPUs (0: no cap)"
            ),
            weigh_job=self.choice(
                data.get("weigh_job", d.weigh_job), "preempt.weigh_job", WEIGH_JOB
            ),
            keep_kinds=self.words(
                data.get("keep_kinds", d.keep_kinds),
                "preempt.keep_kinds",
                ("a node kind", tuple(NODE_KINDS)),
            ),
            keep_namespaces=self.words(
                data.get("keep_namespaces", d.keep_namespaces), "preempt.keep_namespaces"
            ),
            keep_static_pods=self.boolean(
                data.get("keep_static_pods", d.keep_static_pods), "preempt.keep_static_pods"
            ),
            keep_units=self.words(data.get("keep_units", d.keep_units), "preempt.keep_units"),
            keep_logins_of=self.ids(
                data.get("keep_logins_of", d.keep_logins_of), "preempt.keep_logins_of"
            ),
        )

    def words(
        self, value: object, key: str, choices: tuple[str, tuple[str, ...]] | None = None
    ) -> tuple[str, ...]:
        """A list of non-empty strings (possibly empty), each one of ``choices`` if given."""
        if isinstance(value, tuple):
            value = list(value)  # a default
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise self.fail(key, value, "a list of non-empty strings")
        if choices is not None:
            what, words = choices
            for i, s in enumerate(value):
                if s not in words:
                    raise self.fail(
                        f"{key}[{i}]", s, f"{what}: " + ", ".join(words),
                        hint=did_you_mean(s, words),
                    )  # fmt: skip
        return tuple(value)

    def ids(self, value: object, key: str) -> tuple[int, ...]:
        """A list of user or group ids (possibly empty)."""
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in value
        ):
            raise self.fail(key, value, "a list of ids (integers >= 0)")
        return tuple(value)

    def guard_table(self, value: object) -> Guard:
        data = self.table(
            value,
            "guard",
            ("enabled", "starve_after", "boost_ms", "rt_runaway_after", "rt_runaway_share"),
        )
        d = Guard()
        return Guard(
            enabled=self.boolean(data.get("enabled", d.enabled), "guard.enabled"),
            starve_after=self.number(
                data.get("starve_after", d.starve_after), "guard.starve_after", 0.5, 3600,
                "seconds",
            ),
            boost_ms=self.number(
                data.get("boost_ms", d.boost_ms), "guard.boost_ms", 1, 1000, "milliseconds"
            ),
            rt_runaway_after=self.number(
                data.get("rt_runaway_after", d.rt_runaway_after), "guard.rt_runaway_after",
                0.5, 3600, "seconds",
            ),
            rt_runaway_share=self.number(
                data.get("rt_runaway_share", d.rt_runaway_share), "guard.rt_runaway_share",
                0.1, 1.0, "a share of one CPU",
            ),
        )  # fmt: skip


def parse_policy(raw: bytes, source: str) -> Policy:
    """Validate policy bytes; ``source`` names them in errors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            source, "", _NOTHING, f"UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(source, "", _NOTHING, f"valid TOML ({exc})") from None
    except RecursionError:
        raise PolicyError(source, "", _NOTHING, "TOML nested less deep") from None
    return _Checker(source, text).policy(data, raw)


MAX_POLICY_BYTES = 1 << 20


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file: a regular file of at most 1 MiB (a FIFO or a device
    would hang or flood the reader). Raises PolicyError (also for a missing file)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(str(path), "", _NOTHING, f"a readable file ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise PolicyError(str(path), "", _NOTHING, "a policy file, not a folder")
        if not stat.S_ISREG(mode):
            raise PolicyError(str(path), "", _NOTHING, "a regular file (not a FIFO or a device)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise PolicyError(str(path), "", _NOTHING, f"a readable file ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(str(path), "", _NOTHING, "a policy file of at most 1 MiB")
    return parse_policy(raw, str(path))


# Regular expressions in a policy run against what any user controls (comm, cmdline): they
# must compile under limits and match in bounded time. Python's engine backtracks, so a
# quantifier over something that can itself repeat or branch, "(a+)+$", "(a|aa)*", can take
# exponential time on a crafted cmdline: such patterns are refused, and what they see is cut
# to MATCH_CHARS (hostd.model.predicates).
MAX_REGEX_CHARS, MAX_REGEX_DEPTH, MAX_REPEAT_COUNT = 512, 16, 1000
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be a policy's regular expression (None: it may)."""
    if len(pattern) > MAX_REGEX_CHARS:
        return f"is at most {MAX_REGEX_CHARS} characters long"
    depth = deepest = 0
    escaped = False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    if deepest > MAX_REGEX_DEPTH:
        return f"nests at most {MAX_REGEX_DEPTH} groups"
    try:
        tree = _sre_parser.parse(pattern)
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        return f"compiles ({exc})"
    return _repeat_problem(tree.data if hasattr(tree, "data") else tree, inside=False)


def _repeat_problem(items: object, inside: bool) -> str | None:
    for op, av in items:  # type: ignore[attr-defined]
        name = str(op)
        if name in _REPEATS:
            low, high, body = av
            if low > MAX_REPEAT_COUNT or (
                high != _sre_parser.MAXREPEAT and high > MAX_REPEAT_COUNT
            ):
                return f"repeats at most {MAX_REPEAT_COUNT} times"
            if high > 1:
                if inside:
                    return (
                        "has no quantifier over a repeating group such as (a+)+ "
                        "(it can take exponential time)"
                    )
                why = _repeat_problem(body.data, inside=True)
                if why:
                    return why
                continue
        if name == "BRANCH" and inside:
            return (
                "has no quantifier over alternatives such as (a|ab)* (it can take exponential time)"
            )
        for part in av if isinstance(av, (tuple, list)) else ():
            subs = part if isinstance(part, list) else [part]
            for sp in subs:
                if hasattr(sp, "data"):
                    why = _repeat_problem(sp.data, inside)
                    if why:
                        return why
    return None


def load_checked(path: str | None, allow_insecure: bool) -> Policy:
    """The policy an agent runs (``None``: the embedded default), refusing one that a non-root
    user could have written while hostd runs as root (raises PolicyError)."""
    if path is None:
        return load_default()
    policy = load_policy(path)  # a missing, looping or non-regular file is said as such first
    if os.geteuid() == 0 and not allow_insecure:
        why = insecure_reason(path)
        if why:
            raise PolicyError.about_file(
                str(path),
                f"a policy only root can change ({why}); "
                "pass --allow-insecure-policy to use it anyway",
            )
    return policy


def insecure_reason(path: str | Path) -> str | None:
    """Why a policy file may not be trusted by a root agent, or None.

    A file or folder that a non-root user can write lets that user choose which threads become
    real-time: hostd refuses it unless told otherwise (``--allow-insecure-policy``).
    """
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        return f"{path}: cannot be resolved ({exc})"
    for target in (path, path.parent):
        try:
            st = target.stat()
        except OSError as exc:
            return f"{target}: cannot stat ({exc.strerror})"
        if st.st_uid != 0:
            return f"{target} is owned by uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not (target.is_dir() and st.st_mode & 0o1000):
            return f"{target} is writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def default_policy_bytes() -> bytes:
    return resources.files(__package__).joinpath(DEFAULT_POLICY).read_bytes()


def load_default() -> Policy:
    """The embedded default policy (the same file as policies/training.toml)."""
    return parse_policy(default_policy_bytes(), f"<embedded {DEFAULT_POLICY}>")

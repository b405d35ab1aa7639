"""The frozen values of a policy's tables (``[agent]``, ``[preempt]``, ``[guard]``,
``[metrics]``, ``[sizing]``, ``[jobs]``, ``[cgroups]``) and of the policy itself, with their keys:
each field that a policy file sets is declared here once with ``key(...)``
(``hostd.policy.schema``), as in ``hostd.policy.values`` for the layers.

Pure. Read by the preemption decisions, the planner and the agent (the attribute names here
are theirs: ``policy.preempt.busy``, ``policy.guard.starve_after``, ``policy.cgroups_write``).
"""

# ruff: noqa: RUF009  (a key(...) default is a dataclasses.field with its declaration)

from __future__ import annotations

from dataclasses import dataclass

from hostd.policy.schema import (
    MODES,
    NODE_KIND_WORDS,
    SOURCES,
    WEIGH_JOB,
    WRITABLE_KINDS,
    key,
)
from hostd.policy.values import CPU_AMOUNT_SCHEMA, CPUS, CpuAmount, Layer


@dataclass(frozen=True, slots=True)
class Agent:
    """``[agent]``: how the agent runs."""

    mode: str = key(
        "enforce", type="choice", choices=MODES, doc="enforce: write; observe: plan and report"
    )
    restore_on_exit: bool = key(
        True, type="bool", doc="a clean stop puts back everything hostd changed"
    )
    interval: float = key(
        5.0, type="number", lo=0.1, hi=3600, what="seconds between passes", unit="s",
        doc="seconds between passes when polling /proc",
    )  # fmt: skip
    source: str = key(
        "auto", type="choice", choices=SOURCES,
        doc="auto: the proc connector's events where it works, else polling",
    )  # fmt: skip
    rescan_interval: float = key(
        60.0, type="number", lo=1, hi=86400, what="seconds between drift rescans", unit="s",
        doc="seconds between drift rescans when events drive passes",
    )  # fmt: skip
    nice: int | None = key(
        -10, type="int", lo=-20, hi=19, keep=True,
        doc="hostd's own nice while a storm of new threads waits to be placed, so that the "
        "storm cannot starve it (at rest: the nice it started with, so that its wake-ups do "
        'not preempt the job) ("keep": leave it)',
    )  # fmt: skip
    cpu_dma_latency_us: int | None = key(
        type="int", lo=0, hi=2_000_000_000, unit="us",
        doc="a C-state exit latency limit held while hostd runs (unset: none)",
    )  # fmt: skip


# Kubernetes namespaces whose pods are the node's own infrastructure: the control plane, the
# CNI (Calico, Flannel, Cilium), kube-proxy, CoreDNS, the GPU and network operators' daemons.
INFRA_NAMESPACES = (
    "kube-system", "kube-flannel", "calico-system", "tigera-operator", "gpu-operator",
    "nvidia-gpu-operator", "nvidia-network-operator",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Preempt:
    """``[preempt]``: when and how preemptible work yields to protected layers."""

    enabled: bool = key(True, type="bool", doc="whether busy preemptible sessions are demoted")
    busy: float = key(
        0.5, type="number", lo=0.01, hi=4096, what="CPUs a session wants", unit="CPUs",
        doc="the CPUs a session's preemptible threads must want (running or waiting) to be "
        "demoted",
    )  # fmt: skip
    interval: float = key(
        1.0, type="number", lo=0.1, hi=60, what="seconds", unit="s",
        doc="seconds between measurements (stretched to 20 times their cost)",
    )  # fmt: skip
    release_after: float = key(
        30.0, type="number", lo_key="interval", hi=86400, unit="s",
        what="seconds (at least preempt.interval)",
        doc="seconds a demoted session must want less than busy/4 before it is put back",
    )  # fmt: skip
    session_nice: int | None = key(
        19, type="int", lo=-20, hi=19, keep=True,
        doc='a demoted session\'s autogroup nice ("keep": leave session weights alone)',
    )  # fmt: skip
    floor: float = key(
        10.0, type="number", lo_key="interval", lo_factor=2, hi=3600, unit="s",
        what="seconds (at least twice preempt.interval)",
        doc="seconds a demoted session may stay runnable without running before it is lifted",
    )  # fmt: skip
    interactive_cpus: float = key(
        1.0, type="number", lo=0, hi=4096, what="CPUs", unit="CPUs",
        doc="CPUs a user's interactive sessions (a login with a terminal) keep while a job runs",
    )  # fmt: skip
    cap_cpus: float = key(
        0.02, type="number", lo=0, hi=4096, what="CPUs (0: no cap)", unit="CPUs",
        doc="CPUs a demoted cgroup that [cgroups] write lets hostd weigh down may run at most "
        "(its CFS quota; 0: no cap)",
    )  # fmt: skip
    weigh_job: str = key(
        "always", type="choice", choices=WEIGH_JOB,
        doc="when the job's session weight (a negative group_nice) is given: always, or only "
        "while demoted work sits outside /hostd.demoted and capped cgroups",
    )  # fmt: skip
    # What is never demoted, by what it is on the node (hostd.model.node).
    keep_kinds: tuple[str, ...] = key(
        ("kernel", "init", "service"), type="words", choices=NODE_KIND_WORDS,
        choices_what="a node kind", doc="node kinds never demoted",
    )  # fmt: skip
    keep_namespaces: tuple[str, ...] = key(
        INFRA_NAMESPACES, type="words", doc="Kubernetes namespaces whose pods are never demoted"
    )
    keep_static_pods: bool = key(True, type="bool", doc="static pods are never demoted")
    keep_node_agents: bool = key(
        True, type="bool",
        doc="pods whose processes run in the host's network namespace or may hold CAP_SYS_ADMIN "
        "(hostNetwork, privileged: the node's agents, in any namespace) are never demoted",
    )  # fmt: skip
    keep_units: tuple[str, ...] = key(
        (), type="words", doc='systemd units never demoted (shell-style patterns: "run-ansible-*")'
    )
    keep_logins_of: tuple[int, ...] = key(
        (0,), type="ids", doc="user ids whose logins are never demoted"
    )


@dataclass(frozen=True, slots=True)
class Guard:
    """``[guard]``: the starvation guard and the real-time runaway check."""

    enabled: bool = key(True, type="bool", doc="whether starving threads are boosted")
    starve_after: float = key(
        5.0, type="number", lo=0.5, hi=3600, what="seconds", unit="s",
        doc="seconds a thread stays runnable, running under 10% of the time, before a boost",
    )  # fmt: skip
    boost_ms: float = key(
        10.0, type="number", lo=1, hi=1000, what="milliseconds", unit="ms",
        doc="how long a boost (SCHED_RR 1) lasts",
    )  # fmt: skip
    rt_runaway_after: float = key(
        5.0, type="number", lo=0.5, hi=3600, what="seconds", unit="s",
        doc="seconds a thread hostd made real-time may keep a CPU busy before it is returned",
    )  # fmt: skip
    rt_runaway_share: float = key(
        0.9, type="number", lo=0.1, hi=1.0, what="a share of one CPU",
        doc="... at this share of a CPU or more (back to SCHED_OTHER at nice -20)",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Metrics:
    """``[metrics]``: the agent's Prometheus exporter (hostd/agent/metrics.py)."""

    enabled: bool = key(True, type="bool", doc="whether the exporter listens")
    address: str = key(
        "127.0.0.1", type="custom", parse="address", shown_type="string",
        doc="the IP address it listens on (a DaemonSet sets HOSTD_METRICS_ADDRESS)",
        schema={"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]},
    )  # fmt: skip
    port: int = key(
        9464, type="int", lo=0, hi=65535, doc="its TCP port (0: any free port, in the status)"
    )
    # stretched to 100 times a sample's cost where that is longer: hostd.agent.layerstats
    sample_interval: float = key(
        5.0, type="number", lo=0.5, hi=600, what="seconds", unit="s",
        doc="seconds between samples of every thread's schedstat (per-layer series)",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sizing:
    """``[sizing]``: how often self-sizing layers (``util``) are decided (hostd.plan.sizing)."""

    interval: float = key(
        1.0, type="number", lo=0.1, hi=60, what="seconds between sizing decisions", unit="s",
        doc="seconds between sizing decisions (one utilisation sample each)",
    )  # fmt: skip
    shrink_after: float = key(
        10.0, type="number", lo_key="interval", hi=86400, unit="s",
        what="seconds (at least sizing.interval)",
        doc="seconds a layer stays below util.low (or its thread count lower) before it shrinks",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Jobs:
    """``[jobs]``: training jobs as a whole (hostd.model.jobs)."""

    protect: bool = key(
        True, type="bool",
        doc="a job that does not say (HOSTD_PROTECT) gets protected layers",
    )  # fmt: skip
    record: bool = key(True, type="bool", doc="the agent records job attempts for hostd report")


@dataclass(frozen=True, slots=True)
class Cgroups:
    """``[cgroups]``: which other managers' cgroups hostd may write into."""

    # A demoted session's own cgroup weighed down, a layer's v2 cpuset inside a job's cgroup.
    # Elsewhere it changes threads only (hostd's own cgroups are always its own).
    write: tuple[str, ...] = key(
        (), type="words", choices=WRITABLE_KINDS, choices_what="a node kind",
        doc="the node kinds whose cgroups, another manager's, hostd may write into",
    )  # fmt: skip
    # Only the first: a demoted session's cgroup idle and capped while the job runs (never a
    # cpuset made inside a job's cgroup).
    weigh: tuple[str, ...] = key(
        (), type="words", choices=WRITABLE_KINDS, choices_what="a node kind",
        doc="the node kinds whose cgroups, another manager's, hostd may weigh down (idle, "
        "capped at [preempt] cap_cpus) while they hold only demoted work; write implies it",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated policy: its top-level keys, its tables and its layers."""

    source: str  # the file path, or "<embedded training.toml>"
    sha256: str
    version: int = key(
        1, type="custom", parse="version", required=True, shown_type="integer",
        doc="the policy format: 1",
        schema={"const": 1},
    )  # fmt: skip
    name: str = key(type="string", shown_default="(the file's name)", doc="the policy's name")
    description: str = key("", type="text", doc="what the policy is for")
    pool_min: CpuAmount | None = key(
        type="custom", parse="pool_min", shown_type="integer, number or string",
        shown_default="25%, at least 2",
        doc="CPUs always left to the shared pool: " + CPUS + ", at least 1",
        schema=CPU_AMOUNT_SCHEMA,
    )  # fmt: skip
    agent: Agent = key(type="table", value=Agent, factory=Agent, doc=Agent.__doc__)
    preempt: Preempt = key(type="table", value=Preempt, factory=Preempt, doc=Preempt.__doc__)
    guard: Guard = key(type="table", value=Guard, factory=Guard, doc=Guard.__doc__)
    cgroups: Cgroups = key(type="table", value=Cgroups, factory=Cgroups, doc=Cgroups.__doc__)
    metrics: Metrics = key(type="table", value=Metrics, factory=Metrics, doc=Metrics.__doc__)
    sizing: Sizing = key(type="table", value=Sizing, factory=Sizing, doc=Sizing.__doc__)
    jobs: Jobs = key(type="table", value=Jobs, factory=Jobs, doc=Jobs.__doc__)
    layers: tuple[Layer, ...] = key(
        (), type="table", toml="layer", value=Layer, many=True, parse="layers", required=True,
        doc="the layers, in order: the first that matches a thread wins; the last is a catch-all.",
    )  # fmt: skip
    warnings: tuple[str, ...] = ()

    # The flat names the rest of hostd reads ([agent], [jobs], [cgroups]).
    mode = property(lambda self: self.agent.mode)
    restore_on_exit = property(lambda self: self.agent.restore_on_exit)
    interval = property(lambda self: self.agent.interval)
    event_source = property(lambda self: self.agent.source)
    rescan_interval = property(lambda self: self.agent.rescan_interval)
    agent_nice = property(lambda self: self.agent.nice)
    cpu_dma_latency_us = property(lambda self: self.agent.cpu_dma_latency_us)
    jobs_protect = property(lambda self: self.jobs.protect)
    jobs_record = property(lambda self: self.jobs.record)
    cgroups_write = property(lambda self: self.cgroups.write)
    cgroups_weigh = property(lambda self: (*self.cgroups.write, *self.cgroups.weigh))

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

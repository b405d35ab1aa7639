"""One observe + classify + plan pass over a host, as a value: what every read-only command needs.

``take(host, policy)`` reads the topology and every thread through ``Host``, classifies them and
keeps the classifier for explanations; ``Snapshot.plan()`` runs the pure planner on it. Called by
the CLI, ``tools/golden_plans.py`` and the benchmarks.

``hostd plan`` and ``hostd run`` (``Agent.pass_once``, observe and enforce; ``hostd demo`` runs
the agent) build a pass's plan with the one pure ``plan()``, from the same inputs, so what
``hostd plan`` prints is what ``hostd run`` applies: whether real-time is allowed comes from the
doctor's probe on a live host, as the agent has it (a fixture tree stands for a host where it
is), a thread hostd already placed is planned from its original affinity, which the journal
holds, and a running agent's demoted sessions and runaways are planned as it plans them
(``hostd plan`` reads the journal and the agent's status where it can).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from hostd.classify import Classified, Classifier
from hostd.doctor import probe
from hostd.host import Host
from hostd.model.tasks import Task
from hostd.model.topology import Topology
from hostd.plan import Plan, plan
from hostd.policy import Policy
from hostd.tasks import descendants, scan
from hostd.topology import read_topology


@dataclass
class Snapshot:
    host: Host
    policy: Policy
    topology: Topology
    tasks: list[Task]
    classifier: Classifier
    classified: list[Classified]
    allow_rt: bool | None = None  # None: the doctor's probe on a live host, True on a fixture
    # Each thread's affinity before hostd changed it (the journal's originals; base_affinities)
    base_affinity: Mapping[tuple[int, int], frozenset[int]] = field(default_factory=dict)
    # What a running agent's watch decided (its status file): sessions it demoted, real-time
    # threads it returned to normal scheduling.
    demoted_sessions: frozenset[int] = frozenset()
    runaways: frozenset[tuple[int, int]] = frozenset()

    def plan(self) -> Plan:
        """The plan for this snapshot, as the agent would make it on this host; on a live host
        hostd's own process is left out."""
        if self.allow_rt is None:
            self.allow_rt = probe(self.host).rt if self.host.live else True
        exclude = frozenset({os.getpid()}) if self.host.live else frozenset()
        return plan(
            self.topology, self.classified, self.policy, allow_rt=self.allow_rt,
            exclude_pids=exclude, base_affinity=self.base_affinity,
            demoted_sessions=self.demoted_sessions, runaways=self.runaways,
        )  # fmt: skip


def take(
    host: Host, policy: Policy, scope: list[int] | None = None, *, allow_rt: bool | None = None
) -> Snapshot:
    """``scope``: only these processes and their descendants (None: every thread).
    ``allow_rt``: None asks the doctor's probe on a live host when a plan is made (True on a
    fixture tree)."""
    topo = read_topology(host)
    pids = descendants(host, scope) if scope is not None else None
    tasks = scan(host, read_fds=policy.needs_fds, pids=pids)
    if host.live:  # hostd's own process: every command counts the host's threads but these
        tasks = [t for t in tasks if t.pid != os.getpid()]
    classifier = Classifier(policy)
    classified = classifier.classify_all(tasks)
    return Snapshot(host, policy, topo, tasks, classifier, classified, allow_rt)

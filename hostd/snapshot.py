"""One observe + classify + plan pass over a host, as a value: what every read-only command needs.

``take(host, policy)`` reads the topology and every thread through ``Host``, classifies them and
keeps the classifier for explanations; ``Snapshot.plan()`` runs the pure planner on it. Called by
the CLI, ``tools/golden_plans.py`` and the benchmarks; the agent (issue 3) builds on the same steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hostd.classify import Classified, Classifier
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

    def plan(self) -> Plan:
        """The plan for this snapshot; on a live host hostd's own process is left out."""
        exclude = frozenset({os.getpid()}) if self.host.live else frozenset()
        return plan(self.topology, self.classified, self.policy, exclude_pids=exclude)


def take(host: Host, policy: Policy, scope: list[int] | None = None) -> Snapshot:
    """``scope``: only these processes and their descendants (None: every thread)."""
    topo = read_topology(host)
    pids = descendants(host, scope) if scope is not None else None
    tasks = scan(host, read_fds=policy.needs_fds, pids=pids)
    classifier = Classifier(policy)
    return Snapshot(host, policy, topo, tasks, classifier, classifier.classify_all(tasks))

"""Shared CLI plumbing: options, loading the policy and the host, error exits, JSON output.

Commands call the library through these helpers and only render. Exit codes (DESIGN.md):
0 ok, 1 runtime failure, 2 bad input (a bad policy, an unknown thread, a missing --root).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import typer
from rich.console import Console

from hostd.classify import Classified, Classifier
from hostd.host import Host
from hostd.plan import Plan, plan
from hostd.policy import Policy, PolicyError, load_default, load_policy
from hostd.tasks import Task, scan
from hostd.topology import Topology, read_topology

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2

PolicyOpt = typer.Option(
    None, "--policy", "-p", help="Policy file (default: the embedded training policy)."
)
RootOpt = typer.Option(
    "/", "--root", help="Read /proc and /sys below this folder (a captured fixture tree)."
)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """One line on stderr, then exit with ``code``; never a traceback for user errors."""
    sys.stderr.write(f"hostd: {message}\n")
    raise typer.Exit(code)


def print_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")


def get_policy(path: str | None) -> Policy:
    try:
        policy = load_default() if path is None else load_policy(path)
    except PolicyError as exc:
        fail(str(exc))
    for warning in policy.warnings:
        sys.stderr.write(f"hostd: warning: {warning}\n")
    return policy


def get_host(root: str) -> Host:
    if not os.path.isdir(root):
        fail(f"--root {root!r}: expected an existing folder")
    return Host(root)


@dataclass
class Snapshot:
    """Everything one observe + classify + plan pass produces, for rendering."""

    host: Host
    policy: Policy
    topology: Topology
    tasks: list[Task]
    classifier: Classifier
    classified: list[Classified]

    def plan(self) -> Plan:
        exclude = frozenset({os.getpid()}) if self.host.live else frozenset()
        return plan(self.topology, self.classified, self.policy, exclude_pids=exclude)


def snapshot(policy_path: str | None, root: str, *, with_tasks: bool = True) -> Snapshot:
    policy = get_policy(policy_path)
    host = get_host(root)
    topo = read_topology(host)
    tasks = scan(host, read_fds=policy.needs_fds) if with_tasks else []
    classifier = Classifier(policy)
    return Snapshot(host, policy, topo, tasks, classifier, classifier.classify_all(tasks))

"""Shared CLI plumbing: options, loading the policy and the host, error exits, JSON output.

Commands call the library through these helpers and only render. Exit codes (DESIGN.md):
0 ok, 1 runtime failure, 2 bad input (a bad policy, an unknown thread, a missing --root),
3 partial (``hostd restore`` put back every record it could read, and the journal had lines it
could not read: each is listed).
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import typer
from rich.console import Console

from hostd.host import Host
from hostd.policy import Policy, PolicyError, load_default, load_policy
from hostd.snapshot import Snapshot, take

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_PARTIAL = 0, 1, 2, 3

PolicyOpt = typer.Option(
    None, "--policy", "-p", help="Policy file (default: the embedded training policy)."
)
RootOpt = typer.Option(
    "/", "--root", help="Read /proc and /sys below this folder (a captured fixture tree)."
)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")

# Piped output (scripts, tests, less) gets wide tables instead of ones cut to 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
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


def snapshot(policy_path: str | None, root: str, scope: list[int] | None = None) -> Snapshot:
    """Load the policy and the host (exiting 2 on bad input), then take one snapshot."""
    policy = get_policy(policy_path)
    return take(get_host(root), policy, scope or None)

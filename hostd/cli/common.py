"""Shared CLI plumbing: options, loading the policy and the host, error exits, JSON output.

Commands call the library through these helpers and only render. Exit codes (DESIGN.md):
0 ok, 1 runtime failure, 2 bad input (a bad policy, an unknown thread, a missing --root),
3 partial (``hostd restore`` put back every record it could read, and the journal had lines it
could not read: each is listed).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hostd.host import Host, paths
from hostd.policy import (
    Policy,
    PolicyError,
    did_you_mean,
    installed_policies,
    load_default,
    load_policy,
)
from hostd.snapshot import Snapshot, take
from hostd.tasks import descendants

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_PARTIAL = 0, 1, 2, 3

PolicyOpt = typer.Option(
    None, "--policy", "-p",
    help="A policy file or an installed policy's name, hostd policy list (default: training).",
)  # fmt: skip
RootOpt = typer.Option(
    "/", "--root", help="Read /proc and /sys below this folder (a captured fixture tree)."
)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")
# Which threads a command shows, the same on every command that shows threads (classify, stats,
# plan): every thread on the host but hostd's own, or those these options choose.
PidOpt = typer.Option(
    [], "--pid", help="Only this process and its descendants' threads (repeatable)."
)
TidOpt = typer.Option([], "--tid", help="Only this thread (repeatable).")
LayerOpt = typer.Option([], "--layer", "-l", help="Only this layer's threads (repeatable).")

# Thread names, command lines, cgroup paths and job names are the host's, and a user's to
# choose: what hostd prints of them is text, never markup (a name "[/]" broke rich's parser),
# and control characters show as escapes (an ESC in a name would clear the operator's screen,
# retitle the terminal or rewrite the lines above).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with each control character (newline and tab aside) as its escape, ``\x1b``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class _Console(Console):
    """rich's console without markup, every string made ``visible`` (printed or in a table)."""

    def render_str(self, text: str, **kwargs: object) -> Text:
        return super().render_str(visible(text), **kwargs)  # type: ignore[arg-type]


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text in parts, each a string or (string, rich style): hostd's own emphasis, without
    markup, the strings ``visible``."""
    return Text.assemble(
        *((visible(p), "") if isinstance(p, str) else (visible(p[0]), p[1]) for p in parts)
    )


# A terminal gets tables sized to it; piped output (scripts, grep, less) gets each table as
# tab-separated lines, like ps(1) or `kubectl -o wide` (``show``), and long lines unwrapped.
out = _Console(highlight=False, markup=False, soft_wrap=not sys.stdout.isatty())
err = _Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def show(table: Table) -> None:
    """A table: drawn on a terminal; piped, its title as "# title", then a tab-separated header
    line and one line per row (markup removed, tabs and newlines in cells as spaces)."""
    if out.is_terminal:
        out.print(table)
        return

    def plain(cell: object) -> str:
        text = cell.plain if isinstance(cell, Text) else str(cell)
        return " ".join(visible(text).split())

    lines = [f"# {plain(table.title)}"] if table.title else []
    lines.append("\t".join(plain(c.header) for c in table.columns))
    cells = [list(c.cells) for c in table.columns]
    for row in zip(*cells, strict=True):
        lines.append("\t".join(plain(c) for c in row))
    sys.stdout.write("\n".join(lines) + "\n")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """One line on stderr (one per error of a policy), then exit with ``code``; never a
    traceback for user errors."""
    sys.stderr.writelines(f"hostd: {line}\n" for line in message.splitlines() or [""])
    raise typer.Exit(code)


# Every command's --json is one object whose "schema" says its shape's version; the shapes are
# JSON Schemas in docs/json/ (tests/cli/test_json.py validates each command against its own).
# CPU sets are lists of CPU numbers, everywhere.
SCHEMA = 1


def print_json(value: dict, schema: int = SCHEMA) -> None:
    """One JSON object: ``{"schema": N, ...value}``."""
    doc = {"schema": schema, **{k: v for k, v in value.items() if k != "schema"}}
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def cpu_list(cpus: object) -> list[int]:
    """A CPU set as JSON has it: its CPU numbers, ascending."""
    return sorted(cpus)  # type: ignore[call-overload]


def policy_file(policy: str | None) -> str | None:
    """The file of ``--policy``: an installed policy's name (``hostd policy list``) or a file,
    an existing file winning; None: the embedded default. A name that is neither exits 2,
    naming the installed ones."""
    if policy is None:
        return None
    installed = installed_policies()
    if policy in installed and not os.path.isfile(policy):
        return str(installed[policy])
    if not os.path.exists(policy) and os.sep not in policy and not policy.endswith(".toml"):
        hint = did_you_mean(policy, list(installed))
        fail(
            f"{policy}: expected a policy file or an installed policy's name "
            f"({', '.join(installed)})" + (f" (did you mean {hint}?)" if hint else "")
        )
    return policy


def get_policy(path: str | None) -> Policy:
    """``--policy`` loaded (``policy_file``); a bad one exits 2 saying why, its warnings on
    stderr."""
    try:
        file = policy_file(path)
        policy = load_default() if file is None else load_policy(file)
    except PolicyError as exc:
        fail(str(exc))
    for warning in policy.warnings:
        sys.stderr.write(f"hostd: warning: {warning}\n")
    return policy


def get_host(root: str) -> Host:
    if not os.path.isdir(root):
        fail(f"--root {root!r}: expected an existing folder")
    return Host(root)


def say_unprivileged(host: Host) -> None:
    """Once, on stderr: what an ordinary user's view of the live host lacks."""
    if host.live and os.geteuid() != 0:
        sys.stderr.write(
            f"hostd: as uid {os.geteuid()}, other users' processes show no environment, GPU "
            "files or system calls: their jobs and GPU use may be missed (root sees them all)\n"
        )


def snapshot(policy_path: str | None, root: str, scope: list[int] | None = None) -> Snapshot:
    """Load the policy and the host (exiting 2 on bad input), then take one snapshot."""
    policy = get_policy(policy_path)
    host = get_host(root)
    say_unprivileged(host)
    return take(host, policy, scope or None)


class Selection:
    """The threads ``--pid``, ``--tid`` and ``--layer`` choose (all of them, when none is
    given); a layer the policy does not have, or a process that does not exist, is bad input."""

    def __init__(
        self, host: Host, policy: Policy, pid: list[int], tid: list[int], layer: list[str]
    ):
        known = [ly.name for ly in policy.layers]
        for name in layer:
            if name not in known:
                hint = did_you_mean(name, known)
                hint = f" (did you mean {hint}?)" if hint else ""
                fail(f"--layer {name!r}: expected one of {', '.join(known)}{hint}")
        for p in pid:
            if p <= 0 or not host.exists(paths.proc(p, "task")):
                fail(f"--pid {p}: no such process")
        self.pids = set(descendants(host, pid)) if pid else None
        self.tids, self.layers = set(tid), set(layer)

    def __call__(self, pid: int, tid: int, layer: str) -> bool:
        return (
            (self.pids is None or pid in self.pids)
            and (not self.tids or tid in self.tids)
            and (not self.layers or layer in self.layers)
        )

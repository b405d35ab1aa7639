"""``hostd policy check FILE...`` and ``hostd policy show``: validate and print policies."""

from __future__ import annotations

import sys

import typer

from hostd.cli.common import EXIT_BAD_INPUT, PolicyOpt, get_policy, out, styled
from hostd.policy import PolicyError, default_policy_bytes, load_policy

app = typer.Typer(help="Validate and show policy files.", no_args_is_help=True)


@app.command()
def check(
    files: list[str] = typer.Argument(..., help="Policy files to validate."),
) -> None:
    """Validate policy files: "ok" per good file, one line per error of a bad one
    (file:line:column: key.path: value: expected ...); exit 2 if any is bad."""
    bad = 0
    for path in files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            sys.stderr.writelines(f"hostd: {line}\n" for line in str(exc).splitlines())
            bad += 1
            continue
        for warning in policy.warnings:
            sys.stderr.write(f"hostd: warning: {warning}\n")
        out.print(f"{path}: ok ({policy.name}: {len(policy.layers)} layers)")
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def show(policy: str = PolicyOpt) -> None:
    """Print a policy's layers (the embedded default when no --policy is given)."""
    if policy is None:
        sys.stdout.write(default_policy_bytes().decode())
        return
    p = get_policy(policy)
    for layer in p.layers:
        groups = " OR ".join(
            "(" + (" and ".join(pr.describe() for pr in g) or "everything") + ")"
            for g in layer.match
        )
        role = ""
        if layer.preempt:
            role = ", preempts"
        elif layer.name in p.preemptible:
            role = ", preemptible"
        out.print(styled((layer.name, "bold"), f" ({layer.kind}{role}): {groups}"))
        out.print(f"    {layer.comment}")
    if p.preemptible:
        pre = p.preempt
        nice = "keep" if pre.session_nice is None else pre.session_nice
        out.print(
            f"\\[preempt] busy = {pre.busy:g} CPUs, interval = {pre.interval:g} s, release_after = "
            f"{pre.release_after:g} s, session_nice = {nice}"
        )
    if p.guard.enabled:
        g = p.guard
        out.print(
            f"\\[guard] starve_after = {g.starve_after:g} s, boost_ms = {g.boost_ms:g}, "
            f"rt_runaway_after = {g.rt_runaway_after:g} s, rt_runaway_share = "
            f"{g.rt_runaway_share:g}"
        )

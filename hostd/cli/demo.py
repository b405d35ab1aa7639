"""``hostd demo``: run the one-minute comparison of ``hostd.demo`` and print its table."""

from __future__ import annotations

import os

import typer
from rich.table import Table

from hostd.cli.common import JsonOpt, fail, out, print_json, show, styled
from hostd.demo import JOB_LAYERS
from hostd.demo import demo as run_demo


def demo(
    seconds: float = typer.Option(
        15.0,
        "--seconds",
        "-s",
        help="Measured seconds per arm (each arm adds its set-up and 2 s of warm-up).",
    ),
    ranks: int = typer.Option(2, "--ranks", help="Ranks of the stand-in job."),
    as_json: bool = JsonOpt,
) -> None:
    """Show the effect: a stand-in training job alone, under CPU contention, and under the same
    contention with hostd's default policy, without and with preemption (about a minute and a
    half; everything is restored after)."""
    if os.geteuid() != 0:
        fail("hostd demo needs root: the hostd arm changes scheduling of the demo's own job")
    if not (1 <= seconds <= 600) or not (1 <= ranks <= 64):
        fail(f"--seconds {seconds:g} --ranks {ranks}: expected 1-600 seconds and 1-64 ranks")
    say = (lambda _text: None) if as_json else (lambda text: out.print(styled((text, "dim"))))
    try:
        rows = run_demo(seconds, ranks, say)
    except KeyboardInterrupt:
        out.print(
            "interrupted: the demo's processes are stopped and the agent restored its changes"
        )
        raise typer.Exit(130) from None
    if as_json:
        print_json({"arms": rows})
        return
    alone = rows[0]["steps_per_s"] or 0.0
    table = Table(title="stand-in training job: steps/s, and which of its threads waited for a CPU")
    for col in ("arm", "steps/s", "vs alone", *(f"{ly} wait" for ly in JOB_LAYERS)):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for row in rows:
        rate = row["steps_per_s"]
        waits = [row["layers"].get(ly, {}).get("wait_share") for ly in JOB_LAYERS]
        table.add_row(
            row["arm"],
            "-" if rate is None else f"{rate:.1f}",
            "-" if not (rate and alone) else f"{rate / alone:.2f}",
            *("-" if w is None else f"{w:.0%}" for w in waits),
        )
    show(table)
    out.print(
        f"contention: {rows[1]['contention']} in a session of their own; 'wait' is the share of"
        " its runnable time a layer spent waiting on a run queue (hostd stats)."
    )
    if alone and all(row["steps_per_s"] for row in rows[1:]):
        share, full = rows[2]["steps_per_s"] / alone, rows[3]["steps_per_s"] / alone
        out.print(
            f"hostd's default policy took the job from {rows[1]['steps_per_s'] / alone:.2f} to "
            f"{full:.2f} of its speed alone ({share:.2f} with a bigger share only; preemption "
            f"demoted {rows[3]['demoted_sessions']} busy session(s): SCHED_IDLE, session nice "
            "19). Everything is restored."
        )
    for row in rows:
        if row["error"]:
            out.print(styled((f"{row['arm']}: {row['error']}", "red")))
        if row["sample_error"]:
            out.print(styled((f"{row['arm']}: no wait columns, {row['sample_error']}", "yellow")))

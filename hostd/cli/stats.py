"""``hostd stats``: which threads waited, per layer, over an interval (read-only).

Calls ``hostd.stats.measure`` and renders its ``Stats``: a table by layer (CPU, run-queue wait,
context switches), then the threads that waited most; ``--json`` prints the exact values.
"""

from __future__ import annotations

import dataclasses
import math

import typer
from rich.table import Table

from hostd.cli.common import (
    EXIT_FAILURE,
    JsonOpt,
    LayerOpt,
    PidOpt,
    PolicyOpt,
    RootOpt,
    Selection,
    TidOpt,
    fail,
    get_host,
    get_policy,
    out,
    print_json,
    say_unprivileged,
    show,
)
from hostd.stats import StatsError, Unavailable, measure


def stats(
    interval: float = typer.Option(
        5.0, "--interval", "-i", help="Seconds between the two samples."
    ),
    pid: list[int] = PidOpt,
    tid: list[int] = TidOpt,
    layer: list[str] = LayerOpt,
    top: int = typer.Option(10, "--top", "-n", help="How many of the most-waiting threads."),
    as_json: bool = JsonOpt,
    policy: str = PolicyOpt,
    root: str = RootOpt,
) -> None:
    """Per layer: CPU, run-queue wait (schedstat) and context switches over an interval."""
    if not (interval > 0 and math.isfinite(interval)):
        fail(f"--interval {interval:g}: expected a positive number of seconds")
    if top < 0:
        fail(f"--top {top}: expected 0 or more")
    pol = get_policy(policy)
    host = get_host(root)
    say_unprivileged(host)
    chosen = Selection(host, pol, pid, tid, layer)
    try:
        result = measure(
            host, pol, interval, scope=pid or None, top=top,
            keep=lambda c: chosen(c.task.pid, c.task.tid, c.layer),
        )  # fmt: skip
    except StatsError as exc:
        fail(str(exc))
    except Unavailable as exc:
        fail(str(exc), EXIT_FAILURE)
    if as_json:
        print_json({"policy": pol.name, "scope": pid or None, **dataclasses.asdict(result)})
        return
    title = f"policy {pol.name}: {result.threads} threads over {result.interval:.2f} s"
    if result.vanished:
        title += f" ({result.vanished} more exited meanwhile, not counted)"
    table = Table(title=title, title_justify="left")
    for col in ("layer", "threads", "CPU/s", "wait/s", "wait share", "wait/slice ms"):
        table.add_column(col, justify="left" if col == "layer" else "right")
    table.add_column("invol/s", justify="right")
    table.add_column("vol/s", justify="right")
    for ly in result.layers:
        r = ly.rates
        table.add_row(
            ly.layer,
            str(ly.threads),
            f"{r.cpu:.3f}",
            f"{r.wait:.3f}",
            f"{r.wait_share:.1%}",
            f"{r.wait_per_slice_ms:.3f}",
            f"{r.involuntary_per_s:.1f}",
            f"{r.voluntary_per_s:.1f}",
        )
    show(table)
    if top == 0:
        return
    if not result.top:
        out.print("no thread waited on a run queue")
        return
    tt = Table(title="threads that waited most", title_justify="left")
    for col in ("tid", "pid", "comm", "layer", "wait ms/s", "CPU/s", "invol/s"):
        tt.add_column(col, justify="left" if col in ("comm", "layer") else "right")
    for t in result.top:
        tt.add_row(
            str(t.tid),
            str(t.pid),
            t.comm,
            t.layer,
            f"{t.rates.wait * 1000:.2f}",
            f"{t.rates.cpu:.3f}",
            f"{t.rates.involuntary_per_s:.1f}",
        )
    show(tt)

"""``hostd stats`` and ``hostd top``: which threads waited, per layer (read-only).

Calls ``hostd.stats.measure`` and renders its ``Stats``: a table by layer (CPU, run-queue wait,
context switches), then the threads that waited most; ``--json`` prints the exact values.
``hostd top`` shows the same tables live, measured again every second, until q.
"""

from __future__ import annotations

import dataclasses
import math
import os
import select
import sys
import termios
import time
import tty

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hostd.agent.status import read_status
from hostd.cli.agent import RunOpt
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
from hostd.cli.status import sizing_lines
from hostd.cli.topview import View, marks, render
from hostd.snapshot import take
from hostd.stats import Stats, StatsError, Unavailable, compare, measure, sample


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
    show(layer_table(pol.name, result))
    if top == 0:
        return
    if not result.top:
        out.print("no thread waited on a run queue")
        return
    show(top_table(result))


def layer_table(policy: str, result: Stats) -> Table:
    """Per layer: threads, CPU, run-queue wait and switches per second."""
    title = f"policy {policy}: {result.threads} threads over {result.interval:.2f} s"
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
    return table


def top_table(result: Stats) -> Table:
    """The threads that waited most on a run queue."""
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
    return tt


def top(
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between refreshes."),
    pid: list[int] = PidOpt,
    tid: list[int] = TidOpt,
    layer: list[str] = LayerOpt,
    count: int = typer.Option(
        0, "--top", "-n", help="At most this many threads (0: as many as the terminal holds)."
    ),
    policy: str = PolicyOpt,
    run_dir: str = RunOpt,
) -> None:
    """A live view of the layers and the threads that wait most, refreshed every second (like
    top), fitting the terminal (80x24 too), with the running agent's marks (D demoted, B
    boosted) and last resizes of self-sizing layers. Keys: h help, s sort, l one layer, m only
    marked, q quit. Read-only: any user may run it."""
    if not (interval >= 0.1 and math.isfinite(interval)):
        fail(f"--interval {interval:g}: expected at least 0.1 seconds")
    if count < 0:
        fail(f"--top {count}: expected 0 or more")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail("hostd top needs a terminal; `hostd stats` prints the same once")
    pol = get_policy(policy)
    host = get_host("/")
    chosen = Selection(host, pol, pid, tid, layer)
    names = [ly.name for ly in pol.layers]
    view = View(names)
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    frame: dict = {}  # the last measurement: drawn again as keys change the view
    try:
        with Live(console=out, screen=True, auto_refresh=False) as live:
            live.update(Text("hostd top: measuring... (h help, q quit)"), refresh=True)

            def draw() -> None:
                if frame:
                    live.update(_screen(view, frame, count, run_dir), refresh=True)

            while True:
                snap = take(host, pol, pid or None)
                items = [c for c in snap.classified if chosen(c.task.pid, c.task.tid, c.layer)]
                before, start = sample(host, [c.task for c in items]), time.monotonic()
                if not _keys(fd, interval, view, draw):
                    return
                after = sample(host, [c.task for c in items])
                result = compare(before, after, items, time.monotonic() - start, layers=names,
                                 top=None)  # fmt: skip
                title = (f"hostd top on {snap.topology.hostname or 'this host'}, policy "
                         f"{pol.name}: every {interval:g} s")  # fmt: skip
                frame.update(result=result, items=items, title=title)
                draw()
    except KeyboardInterrupt:
        return
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _screen(view: View, frame: dict, count: int, run_dir: str):
    """The screen for the last measurement, with the running agent's marks and resizes now."""
    agent = read_status(run_dir) or {}
    sessions = {c.task.tid: c.task.process.session for c in frame["items"]}
    threads = list(frame["result"].top)[: count or None]
    return render(view, frame["result"], threads, marks(agent, sessions), title=frame["title"],
                  size=(out.size.width, out.size.height),
                  resized=sizing_lines(agent.get("sizing"), last=3))  # fmt: skip


def _keys(fd: int, wait: float, view: View, draw) -> bool:
    """Take keys for up to ``wait`` seconds, redrawing after each; False when one quits."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            if not view.key(os.read(fd, 1).decode(errors="replace")):
                return False
            draw()
    return True

"""What ``hostd top`` draws, and the keys it takes: a pure view of one measurement (``Stats``),
the running agent's status and the viewer's choices (``View``), sized to the terminal (80x24
fits: borderless tables, as many threads as the rows left), so that a test can draw it without
a terminal.

Keys: ``q`` quits; ``h`` or ``?`` shows (and hides) the help; ``s`` sorts the threads by the
next measure (run-queue wait, CPU, involuntary switches); ``l`` shows one layer's threads, the
next layer at each press, then all again; ``m`` shows only the marked ones. A mark says what the
agent does to the thread now: ``D`` its session is demoted, ``B`` it was boosted in the last 10
s (the starvation guard).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from hostd.stats import Stats, ThreadStats

SORTS = (
    ("wait", "run-queue wait", lambda t: t.rates.wait),
    ("cpu", "CPU", lambda t: t.rates.cpu),
    ("invol", "involuntary switches", lambda t: t.rates.involuntary_per_s),
)
BOOST_SHOWN_S = 10.0  # a boost is marked this long after it was made
HELP = """hostd top: the layers, and the threads that wait most on a run queue

  q      quit
  h, ?   this help (again: back)
  s      sort by the next measure: run-queue wait, CPU, involuntary switches
  l      one layer's threads (the next layer at each press, then all again)
  m      only the marked threads

Marks: D  its session is demoted (SCHED_IDLE, weighs nice 19) while the job runs
       B  the starvation guard boosted it in the last 10 s
wait/s: seconds a second spent runnable but not running (schedstat); CPU/s: CPUs' worth used."""


@dataclass
class View:
    """The viewer's choices, changed by keys (``key``)."""

    layers: list[str]
    sort: int = 0  # an index of SORTS
    layer: str | None = None  # only this layer's threads
    marked_only: bool = False
    help: bool = False
    said: str = field(default="")  # the last key's effect, for the footer

    def key(self, ch: str) -> bool:
        """Apply a key; False when it quits."""
        if ch in ("q", "Q"):
            return False
        if ch in ("h", "?"):
            self.help = not self.help
        elif ch == "s":
            self.sort = (self.sort + 1) % len(SORTS)
            self.said = f"sorted by {SORTS[self.sort][1]}"
        elif ch == "l":
            order = [None, *self.layers]
            self.layer = order[(order.index(self.layer) + 1) % len(order)]
            self.said = f"layer {self.layer}" if self.layer else "every layer"
        elif ch == "m":
            self.marked_only = not self.marked_only
            self.said = "only marked threads" if self.marked_only else "every thread"
        return True


def marks(agent: dict, sessions: dict[int, int], now: float | None = None) -> dict[int, str]:
    """Per thread id, its marks from the agent's status (``sessions``: tid -> its session)."""
    pre = agent.get("preempt") or {}
    demoted = {d.get("session") for d in pre.get("demoted") or []}
    now = time.time() if now is None else now
    boosted = {
        ev.get("tid")
        for ev in pre.get("recent") or []
        if ev.get("what") == "boost" and now - float(ev.get("time", 0)) <= BOOST_SHOWN_S
    }
    found: dict[int, str] = {}
    for tid, sid in sessions.items():
        mark = ("D" if sid in demoted else "") + ("B" if tid in boosted else "")
        if mark:
            found[tid] = mark
    return found


def render(
    view: View,
    result: Stats,
    threads: list[ThreadStats],
    marked: dict[int, str],
    *,
    title: str,
    size: tuple[int, int],
    resized: list[str] = (),  # type: ignore[assignment]
) -> RenderableType:
    """The screen: a title line, the layers, the threads (as many as fit), a footer."""
    width, height = size
    footer = Text(f"{view.said + ' · ' if view.said else ''}h help · q quit", style="dim")
    if view.help:
        return Group(Text(title, style="bold"), Text(HELP), footer)
    layers = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False)
    for col in ("layer", "threads", "CPU/s", "wait/s", "wait %", "invol/s"):
        layers.add_column(col, justify="left" if col == "layer" else "right", no_wrap=True)
    for ly in result.layers:
        r = ly.rates
        layers.add_row(ly.layer, str(ly.threads), f"{r.cpu:.2f}", f"{r.wait:.3f}",
                       f"{r.wait_share:.0%}", f"{r.involuntary_per_s:.0f}")  # fmt: skip
    _, said, measure = SORTS[view.sort]
    shown = [t for t in threads if view.layer is None or t.layer == view.layer]
    if view.marked_only:
        shown = [t for t in shown if t.tid in marked]
    shown.sort(key=lambda t: (-measure(t), t.tid))
    # rows: title 1, layers (header 2 + rows), threads' caption and header 2, footer 1, the
    # agent's resizes; what is left is the threads'
    room = height - 1 - (len(result.layers) + 2) - 3 - 1 - len(resized)
    comm = max(8, min(15, width - 52))
    tt = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False,
               title=f"threads by {said}" + (f", layer {view.layer}" if view.layer else "")
               + (", marked only" if view.marked_only else ""), title_justify="left")  # fmt: skip
    for col in ("", "tid", "comm", "layer", "wait ms/s", "CPU/s", "invol/s"):
        tt.add_column(col, justify="left" if col in ("", "comm", "layer") else "right",
                      no_wrap=True, max_width=comm if col == "comm" else None)  # fmt: skip
    for t in shown[: max(0, room)]:
        tt.add_row(marked.get(t.tid, ""), str(t.tid), t.comm[:comm], t.layer,
                   f"{t.rates.wait * 1000:.1f}", f"{t.rates.cpu:.2f}",
                   f"{t.rates.involuntary_per_s:.0f}")  # fmt: skip
    parts: list[RenderableType] = [Text(title, style="bold"), layers, tt]
    if resized:
        parts.append(Text("\n".join(resized)))
    parts.append(footer)
    return Group(*parts)

"""The plots of ``hostd report``, with matplotlib (imported only when a plot is drawn, on the
Agg backend: ``ReportError`` with ``NEEDS_MATPLOTLIB`` when it is missing): one job's measure
per attempt, its throughput over time, its threads' run-queue wait per layer, its GPUs'
utilisation. Every y-axis starts at zero (a 0.5 % difference does not fill it; issue 46).
``save_figure`` writes one as a PNG file (``bench/ab.py``); ``hostd.report.html``
inlines them in the page.
"""

from __future__ import annotations

import io
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from hostd.report.errors import ReportError
from hostd.report.verdict import ARM

COLOURS = {True: "#0072B2", False: "#D55E00"}  # protected, unprotected (colour-blind safe)
NEEDS_MATPLOTLIB = "hostd report needs matplotlib: pip install 'hostd[report]'"


def _figure_class() -> Any:
    """matplotlib's Figure, on the Agg backend (no display, no pyplot state)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(NEEDS_MATPLOTLIB) from None
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    # Job names and units are the jobs' own (their environment, their throughput file): text,
    # never TeX ("$\\foo$" in a title made mathtext raise, and no report was written at all).
    matplotlib.rcParams["text.parse_math"] = False
    from matplotlib.figure import Figure

    return Figure


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _measure_label(measure: dict) -> str:
    if measure["name"] == "throughput":
        unit = f" ({measure['unit']})" if measure["unit"] else ""
        return f"throughput{unit}, higher is better"
    return "duration (s), lower is better"


def _from_zero(ax: Any, values: list[float]) -> None:
    """The y-axis from zero to a little above the largest value: a throughput or a
    duration compared from zero, so that a 0.5 % difference looks like one and does not fill
    the axis (matplotlib's autoscaling spans only the data's range)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    high = max(finite, default=0.0)
    ax.set_ylim(0.0, high * 1.15 if high > 0 else 1.0)


def _plot_measure(Figure: Any, c: dict) -> Any:
    """(a) The measure of each attempt, in time order, by arm, with each arm's mean."""
    fig = Figure(figsize=(7.5, 3.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    points = sorted(
        (
            (
                a["start"] if a["start"] is not None else math.inf,
                a["attempt"],
                arm["protected"],
                a["value"],
            )
            for arm in c["arms"]
            for a in arm["attempts"]
            if a["value"] is not None
        ),
        key=lambda p: (p[0], p[1]),
    )
    for flag in (True, False):
        xs = [i + 1 for i, p in enumerate(points) if p[2] is flag]
        ys = [p[3] for p in points if p[2] is flag]
        if not xs:
            continue
        ax.plot(xs, ys, "o", color=COLOURS[flag], label=f"{ARM[flag]} ({len(xs)})", ms=7)
        mean = statistics.fmean(ys)
        ax.axhline(mean, color=COLOURS[flag], ls="--", lw=1, label=f"{ARM[flag]} mean")
    _from_zero(ax, [p[3] for p in points])
    ax.set_xlabel("attempt, in time order")
    ax.set_ylabel(_measure_label(c["measure"]))
    ax.set_xticks(range(1, len(points) + 1))
    ax.set_title(f"{c['job']}: {c['measure']['name']} per attempt", loc="left")
    if points:
        ax.legend(loc="best", fontsize="small")
    return fig


def _plot_over_time(Figure: Any, summaries: list[dict]) -> Any:
    """(b) Each attempt's throughput over its run, coloured by arm."""
    fig = Figure(figsize=(7.5, 3.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    longest = max(p[0] for s in summaries for p in s["throughput_over_time"])
    scale, unit = (60.0, "min") if longest > 600 else (1.0, "s")
    seen = set()
    for s in summaries:
        if not s["throughput_over_time"] or s["protected"] is None:
            continue
        flag = s["protected"]
        ax.plot(
            [p[0] / scale for p in s["throughput_over_time"]],
            [p[1] for p in s["throughput_over_time"]],
            color=COLOURS[flag],
            lw=1,
            alpha=0.8,
            label=None if flag in seen else ARM[flag],
        )
        seen.add(flag)
    _from_zero(ax, [p[1] for s in summaries for p in s["throughput_over_time"]])
    units = {s["throughput_unit"] for s in summaries} - {None}
    ax.set_xlabel(f"time since the attempt started ({unit})")
    ax.set_ylabel("throughput" + (f" ({', '.join(sorted(units))})" if units else ""))
    ax.set_title("throughput over time, one line per attempt", loc="left")
    if seen:
        ax.legend(loc="best", fontsize="small")
    return fig


def _plot_wait(Figure: Any, c: dict) -> Any:
    """(c) The job's threads' run-queue wait per layer, each arm's mean: as a share of the
    time they wanted a CPU, and per timeslice."""
    fig = Figure(figsize=(7.5, 3.2), dpi=100, layout="constrained")
    share_ax, slice_ax = fig.subplots(1, 2)
    names = sorted({ly["layer"] for arm in c["arms"] for ly in arm["layers"]})
    width = 0.8 / max(len(c["arms"]), 1)
    for i, arm in enumerate(c["arms"]):
        by_name = {ly["layer"]: ly for ly in arm["layers"]}
        xs = [j + (i - (len(c["arms"]) - 1) / 2) * width for j in range(len(names))]

        def get(name: str, key: str, scale: float, by_name: dict = by_name) -> float:
            v = by_name.get(name, {}).get(key)
            return math.nan if v is None else v * scale

        colour, label = COLOURS[arm["protected"]], ARM[arm["protected"]]
        share_ax.bar(
            xs, [get(n, "wait_share", 100) for n in names], width, color=colour, label=label
        )
        slice_ax.bar(
            xs,
            [get(n, "wait_per_timeslice_s", 1000) for n in names],
            width,
            color=colour,
            label=label,
        )
    for ax, title in ((share_ax, "wait share (%)"), (slice_ax, "wait per timeslice (ms)")):
        ax.set_ylim(bottom=0.0)
        ax.set_xticks(range(len(names)), names, rotation=30 if len(names) > 4 else 0)
        ax.set_title(title, loc="left", fontsize="medium")
    if c["arms"] and names:
        share_ax.legend(loc="best", fontsize="small")
    return fig


def _plot_gpu(Figure: Any, c: dict) -> Any:
    """(d) GPU utilisation of each attempt, by arm, with each arm's mean."""
    fig = Figure(figsize=(7.5, 2.8), dpi=100, layout="constrained")
    ax = fig.subplots()
    for i, arm in enumerate(c["arms"]):
        ys = [
            a["gpu_utilization"] * 100 for a in arm["attempts"] if a["gpu_utilization"] is not None
        ]
        if not ys:
            continue
        xs = [
            i + (k - (len(ys) - 1) / 2) * min(0.5 / max(len(ys), 1), 0.08) for k in range(len(ys))
        ]
        ax.plot(xs, ys, "o", color=COLOURS[arm["protected"]], ms=7)
        ax.hlines(statistics.fmean(ys), i - 0.3, i + 0.3, color=COLOURS[arm["protected"]])
    ax.set_xticks(range(len(c["arms"])), [ARM[arm["protected"]] for arm in c["arms"]])
    ax.set_xlim(-0.6, len(c["arms"]) - 0.4)
    ax.set_ylim(0.0, 105.0)  # a share: its whole range
    ax.set_ylabel("GPU utilisation (%)")
    ax.set_title("GPU utilisation per attempt (line: the arm's mean)", loc="left")
    return fig


FIGURES = ("measure", "wait", "gpu", "throughput")


def save_figure(
    comparison: dict, path: str | Path, which: str = "measure", summaries: list[dict] | None = None
) -> None:
    """Write one plot of ``comparison`` as a PNG file: ``measure`` (per attempt, by arm),
    ``wait`` (run-queue wait per layer), ``gpu``, or ``throughput`` (over time: needs the
    job's ``summaries``)."""
    if which not in FIGURES:
        raise ReportError(f"no figure {which!r}: expected one of {', '.join(FIGURES)}")
    Figure = _figure_class()
    if which == "throughput":
        mine = [s for s in summaries or [] if s["job"] == comparison["job"]]
        if not any(s["throughput_over_time"] for s in mine):
            raise ReportError("no throughput over time: no attempt of the job reported one")
        fig = _plot_over_time(Figure, mine)
    else:
        fig = {"measure": _plot_measure, "wait": _plot_wait, "gpu": _plot_gpu}[which](
            Figure, comparison
        )
    Path(path).write_bytes(_png(fig))

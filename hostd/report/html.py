"""The page of ``hostd report``: one self-contained HTML file (the verdict first, a table of
attempts, the plots inline as PNG images; no script, nothing to fetch), from one template
(``_PAGE``) and one table builder (``_table``, which escapes every cell); where attempts ran on
several hosts, a section of them (``hostd.report.fleet``), and what a source such as Prometheus
does not say. ``render_html`` is called by ``hostd.cli.report`` and ``bench/ab.py`` through
``hostd.report``.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from string import Template
from typing import Any

from hostd.report.plots import (
    _figure_class,
    _plot_gpu,
    _plot_measure,
    _plot_over_time,
    _plot_wait,
    _png,
)
from hostd.report.stats import _value

_PAGE = Template("""\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>$title</title>
<style>
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.25rem; margin-top: 2.5rem; }
h3 { font-size: 1.05rem; margin-top: 1.8rem; }
.verdict { font-size: 1.1rem; background: #f3f6fa; border-left: 4px solid #0072B2;
           padding: 0.8rem 1rem; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f6f6f6; } td.l, th.l { text-align: left; }
.yes { color: #0072B2; font-weight: 600; } .no { color: #D55E00; font-weight: 600; }
img { max-width: 100%; } .note { color: #555; font-size: 0.9rem; }
</style>
</head>
<body>
<h1>$title</h1>
$sections
<h2>How to read this</h2>
<ul class="note"><li><b>A/B</b>: attempts hostd protected against attempts it did not (a job
opts out with HOSTD_PROTECT=0 in its environment). The speed ratio is above 1 when the protected
ones were faster.</li><li><b>95 % confidence</b>: the range the true ratio most likely lies in,
found by resampling the attempts (bootstrap). A range that includes 1x means no difference can be
told apart from chance: run more attempts.</li><li><b>Worst attempt</b>: an effect is judged on
its worst repetition: the slowest protected attempt against the median unprotected
one.</li><li><b>A/A</b>: how much attempts of the same arm differ among themselves; an effect
smaller than that is not worth much.</li><li><b>Hosts</b>: where a job ran on several hosts, each
host's own A/B, and how much the hosts of one arm differ among themselves (A/A between
hosts).</li><li><b>Wait share</b>: of the time the job's threads
wanted a CPU, the share they spent waiting on a run queue (what hostd tries to remove).</li></ul>
</body>
</html>
""")

Cell = tuple[str, str]  # (text, class: "" for none); the text is escaped by _table


def _table(head: Sequence[Cell], rows: Iterable[Sequence[Cell]]) -> str:
    """The one table builder of the page: a row of headings, then one row per item."""

    def cell(tag: str, text: str, cls: str) -> str:
        opened = f'<{tag} class="{cls}">' if cls else f"<{tag}>"
        return f"{opened}{html.escape(text)}</{tag}>"

    def row(tag: str, cells: Sequence[Cell]) -> str:
        return "<tr>" + "".join(cell(tag, text, cls) for text, cls in cells) + "</tr>"

    return "<table>\n" + "\n".join([row("th", head), *(row("td", r) for r in rows)]) + "\n</table>"


def _img(fig: Any, alt: str) -> str:
    data = base64.b64encode(_png(fig)).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _when(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(summary: dict) -> str:
    seconds = summary["duration_s"]
    if seconds is None:
        return "running" if summary["end"] is None else "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _number(value: float | None, scale: float, fmt: str) -> Cell:
    return ("-" if value is None else fmt.format(value * scale), "")


def _attempts_table(c: dict, summaries: list[dict]) -> str:
    """One row per attempt, in time order. "ran for" is each attempt's time from start to end
    (or "running"); the measure's column is the value compared, blank where it has none."""
    measure = c["measure"]
    unit = f" {measure['unit']}" if measure["unit"] else ""
    head = [("attempt", "l"), ("host", "l"), ("start", ""), ("protected", ""), ("why", "l"),
            ("ran for", ""), (measure["name"] or "measure", ""), ("wait share", ""),
            ("wait/slice", ""), ("GPU util", "")]  # fmt: skip
    rows = (
        [
            (s["attempt"], "l"),
            (s["host"] or "?", "l"),
            (_when(s["start"]), ""),
            {True: ("yes", "yes"), False: ("no", "no")}.get(s["protected"], ("?", "")),
            (s["why"] or "", "l"),
            (_span(s), ""),
            _number(_value(s, measure), 1, "{:.4g}" + unit),
            _number(s["wait_share"], 100, "{:.1f} %"),
            _number(s["wait_per_timeslice_s"], 1000, "{:.3f} ms"),
            _number(s["gpu_utilization"], 100, "{:.0f} %"),
        ]
        for s in summaries
    )
    return _table(head, rows)


def _section(Figure: Any, c: dict, summaries: list[dict], heading: str | None) -> str:
    mine = [s for s in summaries if s["job"] == c["job"]]
    parts = [f"<h2>{html.escape(heading)}</h2>"] if heading else []
    parts.append(f'<p class="verdict">{html.escape(c["verdict"])}</p>')
    parts.append(f'<p class="note">Measure: {html.escape(c["measure"]["how"])}.</p>')
    parts.append("<h3>Attempts</h3>")
    parts.append(_attempts_table(c, mine))
    if c["measure"]["name"]:
        parts.append(f"<h3>{html.escape(c['measure']['name'].capitalize())} per attempt</h3>")
        parts.append(_img(_plot_measure(Figure, c), f"{c['measure']['name']} per attempt"))
        parts.append(
            '<p class="note">Each dot is one attempt, left to right in the order they started; '
            "a dashed line is the mean of an arm. Dots of one colour that scatter widely are "
            "noise; two colours apart, with little overlap, are an effect.</p>"
        )
    if any(s["throughput_over_time"] and s["protected"] is not None for s in mine):
        parts.append("<h3>Throughput over time</h3>")
        parts.append(_img(_plot_over_time(Figure, mine), "throughput over time"))
        parts.append(
            '<p class="note">One line per attempt. A slow start is warm-up (the median leaves '
            "out the first sample); dips in the middle are stalls, which protection should make "
            "rarer or shallower.</p>"
        )
    if any(arm["layers"] for arm in c["arms"]):
        parts.append("<h3>Run-queue wait of the job's threads, per layer</h3>")
        parts.append(_img(_plot_wait(Figure, c), "run-queue wait per layer"))
        parts.append(
            '<p class="note">How long the job\'s threads were ready to run but waited for a '
            "CPU: left, as a share of the time they wanted one; right, per timeslice they "
            "ran. Lower is better. An unprotected job's threads are in other layers (such as "
            "rest), so its bars may stand where the protected ones have none.</p>"
        )
    if any(a["gpu_utilization"] is not None for arm in c["arms"] for a in arm["attempts"]):
        parts.append("<h3>GPU utilisation</h3>")
        parts.append(_img(_plot_gpu(Figure, c), "GPU utilisation per attempt"))
        parts.append(
            '<p class="note">The share of time a kernel ran on the attempt\'s GPUs (NVML), '
            "averaged over the attempt. Higher means the GPUs waited less for the CPU side.</p>"
        )
    return "\n".join(parts)


def _ratio_cell(e: dict) -> Cell:
    return ("-", "") if e["ratio"] is None else (f"{e['ratio']:.2f}x", "")


def _interval_cell(e: dict) -> Cell:
    if e["low"] is None:
        return ("-", "")
    return (f"{e['low']:.2f}x to {e['high']:.2f}x", "")


def _median_cell(arm: dict | None, unit: str | None) -> Cell:
    if arm is None:
        return ("-", "")
    return (f"{arm['median']:.4g}{' ' + unit if unit else ''} ({arm['n']})", "")


def _fleet_section(fleet: dict, comparisons: Sequence[dict]) -> str:
    """The hosts (``hostd.report.fleet``): its words, each job's arms and A/B per host, and
    how much hosts of the same arm differ."""
    units = {c["job"]: c["measure"]["unit"] for c in comparisons}
    finding = {"faster": ("faster", "yes"), "slower": ("slower", "no")}
    parts = ["<h2>Hosts</h2>", f'<p class="verdict">{html.escape(fleet["verdict"])}</p>']
    head = [("job", "l"), ("host", "l"), ("protected: median (n)", ""),
            ("unprotected: median (n)", ""), ("speed ratio", ""), ("95 % confidence", ""),
            ("finding", "l")]  # fmt: skip
    rows = [
        [
            (e["job"], "l"),
            (e["host"], "l"),
            _median_cell(e["protected"], units.get(e["job"])),
            _median_cell(e["unprotected"], units.get(e["job"])),
            _ratio_cell(e),
            _interval_cell(e),
            finding.get(e["finding"] or "", (e["finding"] or "one arm only", "l")),
        ]
        for e in fleet["per_host"]
    ]
    parts.append(_table(head, rows))
    if fleet["between_hosts"]:
        parts.append("<h3>Between hosts (A/A)</h3>")
        head = [("job", "l"), ("arm", "l"), ("hosts", ""), ("differed by up to", ""),
                ("fastest", "l"), ("slowest", "l")]  # fmt: skip
        rows = [
            [
                (b["job"], "l"),
                ("protected" if b["protected"] else "unprotected", "l"),
                (str(b["hosts"]), ""),
                (f"{(b['spread'] - 1) * 100:.1f} %", ""),
                (b["fastest"], "l"),
                (b["slowest"], "l"),
            ]
            for b in fleet["between_hosts"]
        ]
        parts.append(_table(head, rows))
    return "\n".join(parts)


def render_html(
    comparisons: Sequence[dict],
    summaries: Sequence[dict],
    fleet: dict | None = None,
    origin: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """A self-contained HTML page of ``comparisons`` (from ``compare_all``) and the attempts'
    ``summaries``: the verdict first, a table of attempts, plots as inline PNG images; with
    ``fleet`` (``hostd.report.fleet``), the hosts' section; ``origin`` says where the attempts
    came from and ``notes`` what that source does not say. No script and no link to fetch: it
    opens offline and can be mailed as one file."""
    Figure = _figure_class()
    summaries = list(summaries)
    jobs = [c["job"] for c in comparisons]
    hosts = sorted({h for c in comparisons for h in c["hosts"]})
    title = "hostd report: " + (f"job {jobs[0]}" if len(jobs) == 1 else f"jobs {', '.join(jobs)}")
    if hosts:
        title += (
            " on "
            + ", ".join(hosts[:8])
            + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")
        )
    sections = [f'<p class="note">{html.escape(origin)}</p>'] if origin else []
    sections += [
        _section(Figure, c, summaries, None if len(comparisons) == 1 else f"Job {c['job']}")
        for c in comparisons
    ]
    if fleet is not None:
        sections.append(_fleet_section(fleet, comparisons))
    if notes:
        sections.append("<h2>What this source does not say</h2>")
        sections.append(
            '<ul class="note">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
        )
    return _PAGE.substitute(title=html.escape(title), sections="\n".join(sections))

"""Did protection help? A job's attempts with and without hostd, compared (``hostd report``).

The agent records each attempt of a job it sees as one JSON file, ``STATE_DIR/attempts/NAME.json``
(schema ``hostd.attempt/1``: the job, whether hostd protected it and why not, its start and end,
and samples of its threads' CPU time and run-queue wait per layer, of its GPUs' utilisation and
of the throughput the job itself reported). This module reads them and says, in plain words,
whether the protected attempts ran faster than the unprotected ones (A/B), and how much attempts
differ among themselves when nothing changed (A/A: the noise an effect must exceed).

The measure is the job's own throughput (the median of its samples, the first left out as
warm-up) when every attempt has one, else the duration of the attempts that ended (assuming each
did the same work). The A/B ratio is a speed ratio (above 1: protection helped) with a 95 %
bootstrap confidence interval over attempts (seeded: the same files always give the same
numbers), and the worst attempt of each arm is set against the other arm's median: an effect is
judged on its worst repetition.

Pure functions: ``load_attempts`` (files -> records and warnings), ``summarise`` (one attempt),
``compare`` (one job) and ``compare_all`` (every job, or the one named), ``render_html`` and
``save_figure`` (matplotlib, imported only there: ``ReportError`` when it is missing). Called by
``hostd.cli.report``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import random
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hostd.model.attempts import SCHEMA
from hostd.policy import did_you_mean

ATTEMPTS = "attempts"  # the folder below the state dir where the agent records attempts
CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 20251126  # any fixed value: the same attempts always give the same intervals
MAX_POINTS = 500  # of an attempt's throughput over time (more are averaged in buckets)
COLOURS = {True: "#0072B2", False: "#D55E00"}  # protected, unprotected (colour-blind safe)
ARM = {True: "protected", False: "unprotected"}
NEEDS_MATPLOTLIB = "hostd report needs matplotlib: pip install 'hostd[report]'"


class ReportError(Exception):
    """A report that cannot be made: no attempts, an unknown job, matplotlib missing."""


# --- reading ---------------------------------------------------------------------------------


def _num(value: object) -> float | None:
    """A finite number, or None (null, missing, a string, a bool, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _amount(value: object) -> float | None:
    """A finite number that is not negative, or None."""
    value = _num(value)
    return value if value is not None and value >= 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _time_order(attempt: dict) -> tuple[float, str]:
    start = _num(attempt.get("start"))
    return (math.inf if start is None else start, str(attempt.get("attempt")))


def load_attempts(folder: str | Path) -> tuple[list[dict], list[str]]:
    """The attempt records in ``folder`` (``*.json``), in time order, and one warning per file
    skipped (not JSON, not a ``hostd.attempt/1`` record, no job). A folder that does not exist
    holds none; one that cannot be read is a ``ReportError``. Records of one job name but of
    several users (``uid``) are set apart per user."""
    folder = Path(folder)
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        raise ReportError(f"{folder}: cannot read it ({exc.strerror or exc})") from None
    attempts, warnings = [], []
    for path in paths:
        if path.name.startswith("."):
            continue  # a temporary file of an atomic write
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            warnings.append(f"{path}: skipped: cannot read it ({exc.strerror or exc})")
            continue
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            warnings.append(f"{path}: skipped: not valid JSON ({str(exc)[:80]})")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            warnings.append(f"{path}: skipped: not an attempt record (no schema {SCHEMA!r})")
            continue
        if _text(doc.get("job")) is None:
            warnings.append(f"{path}: skipped: the record names no job")
            continue
        if _text(doc.get("attempt")) is None:
            doc = {**doc, "attempt": path.stem}
        attempts.append(doc)
    # A job's name is its user's to write: where users share one, each user's attempts are a
    # job of their own ("llama (uid 1000)"), so that nobody's runs count in another's A/B.
    users: dict[str, set] = {}
    for doc in attempts:
        users.setdefault(doc["job"], set()).add(doc.get("uid"))
    for i, doc in enumerate(attempts):
        if len(users[doc["job"]]) > 1:
            attempts[i] = {**doc, "job": f"{doc['job']} (uid {doc.get('uid')})"}
    attempts.sort(key=_time_order)
    return attempts, warnings


# --- one attempt ------------------------------------------------------------------------------


@dataclass
class _Wait:
    """Sums of CPU time, run-queue wait and timeslices; a ratio only counts the entries that
    have both of its terms."""

    cpu: float = 0.0
    wait: float = 0.0
    share_cpu: float = 0.0
    share_wait: float = 0.0
    slice_wait: float = 0.0
    slices: float = 0.0

    def add(self, entry: dict) -> None:
        cpu, wait = _amount(entry.get("cpu_seconds")), _amount(entry.get("wait_seconds"))
        slices = _amount(entry.get("timeslices"))
        self.cpu += cpu or 0.0
        self.wait += wait or 0.0
        if cpu is not None and wait is not None:
            self.share_cpu, self.share_wait = self.share_cpu + cpu, self.share_wait + wait
        if wait is not None and slices is not None:
            self.slice_wait, self.slices = self.slice_wait + wait, self.slices + slices

    def share(self) -> float | None:
        total = self.share_cpu + self.share_wait
        return self.share_wait / total if total > 0 else None

    def per_slice(self) -> float | None:
        return self.slice_wait / self.slices if self.slices > 0 else None


def _series(samples: list[dict], start: float | None) -> list[list[float]]:
    """[seconds since the attempt began, throughput] per sample that has both, at most
    ``MAX_POINTS`` (consecutive points averaged)."""
    points = [
        (t, v)
        for s in samples
        if (t := _num(s.get("t"))) is not None and (v := _num(s.get("throughput"))) is not None
    ]
    if not points:
        return []
    if start is None:
        first = samples[0]
        start = (_num(first.get("t")) or points[0][0]) - (_amount(first.get("seconds")) or 0.0)
    size = math.ceil(len(points) / MAX_POINTS)
    out = []
    for i in range(0, len(points), size):
        chunk = points[i : i + size]
        out.append(
            [
                sum(t for t, _ in chunk) / len(chunk) - start,
                sum(v for _, v in chunk) / len(chunk),
            ]
        )
    return out


def summarise(attempt: dict) -> dict:
    """One attempt in numbers: when and how long it ran, its throughput (the median of its
    samples', the first left out as warm-up when three or more have one), its GPUs' mean
    utilisation, and its threads' run-queue wait: their share of the time the threads wanted a
    CPU (wait / (CPU + wait)) and the mean wait per timeslice, in all and per layer."""
    raw = attempt.get("samples")
    samples = [s for s in raw if isinstance(s, dict)] if isinstance(raw, list) else []
    start, end = _num(attempt.get("start")), _num(attempt.get("end"))
    duration = end - start if start is not None and end is not None and end >= start else None
    rates = [v for s in samples if (v := _num(s.get("throughput"))) is not None]
    kept = rates[1:] if len(rates) >= 3 else rates
    gpu = [v for s in samples if (v := _amount(s.get("gpu_utilization"))) is not None]
    total, layers = _Wait(), {}
    for s in samples:
        per_layer = s.get("layers")
        if not isinstance(per_layer, dict):
            continue
        for name, entry in per_layer.items():
            if isinstance(entry, dict):
                layers.setdefault(str(name), _Wait()).add(entry)
                total.add(entry)
    policy = attempt.get("policy")
    protected = attempt.get("protected")
    return {
        "job": _text(attempt.get("job")),
        "attempt": str(attempt.get("attempt")),
        "host": _text(attempt.get("host")),
        "source": _text(attempt.get("source")),
        "protected": protected if isinstance(protected, bool) else None,
        "why": _text(attempt.get("why")),
        "mode": _text(attempt.get("mode")),
        "policy": _text(policy.get("name")) if isinstance(policy, dict) else None,
        "start": start,
        "end": end,
        "duration_s": duration,
        "samples": len(samples),
        "throughput": statistics.median(kept) if kept else None,
        "throughput_unit": _text(attempt.get("throughput_unit")),
        "gpu_utilization": statistics.fmean(gpu) if gpu else None,
        "wait_share": total.share(),
        "wait_per_timeslice_s": total.per_slice(),
        "layers": [
            {
                "layer": name,
                "cpu_seconds": w.cpu,
                "wait_seconds": w.wait,
                "wait_share": w.share(),
                "wait_per_timeslice_s": w.per_slice(),
            }
            for name, w in sorted(layers.items())
        ],
        "throughput_over_time": _series(samples, start),
    }


# --- comparing --------------------------------------------------------------------------------


def _ratio(a: Sequence[float], b: Sequence[float], better: str) -> float | None:
    """How much faster ``a`` ran than ``b`` (means): a/b for a throughput, b/a for a duration."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    top, bottom = (ma, mb) if better == "higher" else (mb, ma)
    return top / bottom if bottom > 0 else None


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated between neighbours."""
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _bootstrap(
    a: Sequence[float], b: Sequence[float], better: str, resamples: int, seed: int
) -> tuple[float | None, float | None]:
    """The ``CONFIDENCE`` interval of ``_ratio(a, b)``: attempts resampled within each arm."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        r = _ratio(rng.choices(a, k=len(a)), rng.choices(b, k=len(b)), better)
        if r is not None:
            ratios.append(r)
    if not ratios:
        return None, None
    ratios.sort()
    tail = (1 - CONFIDENCE) / 2
    return _quantile(ratios, tail), _quantile(ratios, 1 - tail)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _choose_measure(summaries: list[dict]) -> dict:
    """Throughput when every attempt has one (an attempt still running that has reported
    nothing yet is not counted), in one unit; else the duration of the attempts that ended."""
    considered = [s for s in summaries if s["end"] is not None or s["throughput"] is not None]
    units = {s["throughput_unit"] for s in considered} - {None}
    if (
        considered
        and all(s["throughput"] is not None and s["throughput"] > 0 for s in considered)
        and len(units) <= 1
    ):
        return {
            "name": "throughput",
            "unit": next(iter(units), None),
            "better": "higher",
            "how": "the throughput the job reported: the median of its samples, the first "
            "left out as warm-up",
        }
    if any(s["duration_s"] for s in summaries):
        why = "not every attempt reported a throughput"
        if len(units) > 1:
            why = (
                f"the attempts reported throughput in different units ({', '.join(sorted(units))})"
            )
        return {
            "name": "duration",
            "unit": "s",
            "better": "lower",
            "how": f"how long each attempt that ended ran, assuming each attempt did the same "
            f"work ({why})",
        }
    return {
        "name": None,
        "unit": None,
        "better": None,
        "how": "no attempt reported a throughput and none has ended",
    }


def _value(summary: dict, measure: dict) -> float | None:
    if measure["name"] == "throughput":
        return summary["throughput"]
    if measure["name"] == "duration" and summary["duration_s"]:
        return summary["duration_s"]
    return None


def _arm(flag: bool, members: list[dict], measure: dict, resamples: int, seed: int) -> dict:
    values = [v for s in members if (v := _value(s, measure)) is not None]
    better = measure["better"]
    halves = None
    if len(values) >= 4:
        first, second = values[: len(values) // 2], values[len(values) // 2 :]
        low, high = _bootstrap(second, first, better, resamples, seed)
        halves = {
            "ratio": _ratio(second, first, better),
            "low": low,
            "high": high,
            "n_first": len(first),
            "n_second": len(second),
        }
    names = sorted({ly["layer"] for s in members for ly in s["layers"]})
    layers = []
    for name in names:
        mine = [ly for s in members for ly in s["layers"] if ly["layer"] == name]
        layers.append(
            {
                "layer": name,
                "attempts": len(mine),
                "wait_share": _mean(ly["wait_share"] for ly in mine),
                "wait_per_timeslice_s": _mean(ly["wait_per_timeslice_s"] for ly in mine),
            }
        )
    return {
        "protected": flag,
        "recorded": len(members),
        "n": len(values),
        "attempts": [
            {
                "attempt": s["attempt"],
                "start": s["start"],
                "value": _value(s, measure),
                "gpu_utilization": s["gpu_utilization"],
                "wait_share": s["wait_share"],
                "wait_per_timeslice_s": s["wait_per_timeslice_s"],
            }
            for s in members
        ],
        "mean": statistics.fmean(values) if values else None,
        "median": statistics.median(values) if values else None,
        "spread": max(values) / min(values) if len(values) >= 2 else None,
        "halves": halves,
        "wait_share": _mean(s["wait_share"] for s in members),
        "wait_per_timeslice_s": _mean(s["wait_per_timeslice_s"] for s in members),
        "gpu_utilization": _mean(s["gpu_utilization"] for s in members),
        "layers": layers,
    }


def _ab(p: list[float], u: list[float], better: str, resamples: int, seed: int) -> dict:
    low, high = (
        _bootstrap(p, u, better, resamples, seed) if min(len(p), len(u)) >= 2 else (None, None)
    )
    if better == "higher":
        worst_p, worst_u = min(p) / statistics.median(u), min(u) / statistics.median(p)
    else:
        worst_p, worst_u = statistics.median(u) / max(p), statistics.median(p) / max(u)
    ratio = _ratio(p, u, better)
    if low is None or high is None:
        finding = "too few attempts"
    elif low > 1:
        finding = "faster"
    elif high < 1:
        finding = "slower"
    else:
        finding = "no difference"
    return {
        "ratio": ratio,
        "low": low,
        "high": high,
        "confidence": CONFIDENCE,
        "resamples": resamples,
        "seed": seed,
        "n_protected": len(p),
        "n_unprotected": len(u),
        "worst_protected_vs_unprotected_median": worst_p,
        "worst_unprotected_vs_protected_median": worst_u,
        "finding": finding,
    }


def _jobs(attempts: Iterable[dict]) -> list[str]:
    return sorted({j for a in attempts if (j := _text(a.get("job"))) is not None})


def compare_all(
    attempts: Sequence[dict],
    job: str | None = None,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[dict]:
    """One comparison per job of ``attempts`` (see ``compare``), by job name; only ``job``'s
    when it is given (``ReportError`` when no attempt is of that job)."""
    jobs = _jobs(attempts)
    if not jobs:
        raise ReportError("no attempts recorded")
    if job is not None:
        if job not in jobs:
            hint = did_you_mean(job, jobs)
            shown = ", ".join(jobs[:10]) + (f" and {len(jobs) - 10} more" if len(jobs) > 10 else "")
            raise ReportError(
                f"no attempts of job {job!r}: the jobs recorded are {shown}"
                + (f" (did you mean {hint}?)" if hint else "")
            )
        jobs = [job]
    return [_compare_job(j, attempts, resamples, seed) for j in jobs]


def compare(
    attempts: Sequence[dict],
    job: str | None = None,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict:
    """Job ``job``'s attempts (or the only job's), protected against unprotected (A/B) and
    among themselves (A/A), with a verdict in plain words. ``compare_all`` compares every job
    of a folder that holds several."""
    jobs = _jobs(attempts)
    if job is None and len(jobs) > 1:
        raise ReportError(f"attempts of {len(jobs)} jobs: name one of {', '.join(jobs)}")
    return compare_all(attempts, job, resamples=resamples, seed=seed)[0]


def _compare_job(job: str, attempts: Sequence[dict], resamples: int, seed: int) -> dict:
    mine = sorted((a for a in attempts if a.get("job") == job), key=_time_order)
    summaries = [summarise(a) for a in mine]
    armed = [s for s in summaries if s["protected"] is not None]
    measure = _choose_measure(armed)
    arms = [
        _arm(flag, members, measure, resamples, seed)
        for flag in (True, False)
        if (members := [s for s in armed if s["protected"] is flag])
    ]
    by_flag = {arm["protected"]: arm for arm in arms}
    ab = None
    if measure["name"] and all(by_flag.get(f) and by_flag[f]["n"] for f in (True, False)):
        p, u = (
            [a["value"] for a in by_flag[f]["attempts"] if a["value"] is not None]
            for f in (True, False)
        )
        ab = _ab(p, u, measure["better"], resamples, seed)
    comparison = {
        "job": job,
        "hosts": sorted({s["host"] for s in summaries if s["host"]}),
        "attempts": [s["attempt"] for s in summaries],
        "unassigned": [s["attempt"] for s in summaries if s["protected"] is None],
        "measure": measure,
        "arms": arms,
        "ab": ab,
    }
    comparison["verdict"] = _verdict(comparison, summaries)
    return comparison


# --- the verdict ------------------------------------------------------------------------------


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f} %" if fraction < 0.01 else f"{fraction * 100:.0f} %"


def _attempts(n: int) -> str:
    return f"{n} attempt" + ("" if n == 1 else "s")


def _verdict(c: dict, summaries: list[dict]) -> str:
    """One paragraph, in plain words, for someone who is not a statistician."""
    measure, ab = c["measure"], c["ab"]
    by_flag = {arm["protected"]: arm for arm in c["arms"]}
    p, u = by_flag.get(True), by_flag.get(False)
    duration = measure["name"] == "duration"
    what = "; measured by how long they ran, assuming each attempt did the same work"
    what = what if duration else ""
    said = []
    if not c["arms"]:
        said.append(
            f"Nothing to compare: none of the {_attempts(len(summaries))} says whether hostd "
            "protected it."
        )
    elif measure["name"] is None:
        said.append(
            f"Nothing to compare yet: none of the {_attempts(len(summaries))} reported a "
            "throughput and none has ended, so neither speed nor duration is known."
        )
    elif not p or not u:
        said.append(
            "No A/B: every attempt was protected; run some with HOSTD_PROTECT=0 in their "
            "environment to compare."
            if p
            else "No A/B: no attempt was protected; run some with hostd protecting them "
            "(without HOSTD_PROTECT=0) to compare."
        )
    elif ab is None:
        missing = "protected" if not p["n"] else "unprotected"
        said.append(
            f"No A/B yet: no {missing} attempt has a {measure['name']} yet (they are still "
            "running)."
        )
    else:
        r, n_p, n_u = ab["ratio"], ab["n_protected"], ab["n_unprotected"]
        counts = (
            f"{_attempts(n_p)} each"
            if n_p == n_u
            else f"{n_p} protected and {n_u} unprotected attempt{'' if n_u == 1 else 's'}"
        )
        speed = f"ran at {_x(r)} the speed of unprotected ones"
        worst = (
            f"the worst protected attempt was {_x(ab['worst_protected_vs_unprotected_median'])} "
            "the unprotected median"
        )
        if ab["low"] is None:
            said.append(
                f"Protected attempts {speed} ({counts}{what}), but with a single attempt in an arm "
                "there is no confidence interval and this may be noise: run at least 3 of "
                "each before trusting it."
            )
        else:
            ci = f"95 % confidence {_x(ab['low'])} to {_x(ab['high'])}, {counts}{what}"
            if ab["finding"] == "faster":
                said.append(f"Protected attempts were faster: they {speed} ({ci}); {worst}.")
            elif ab["finding"] == "slower":
                said.append(f"Protected attempts were slower: they {speed} ({ci}); {worst}.")
            else:
                said.append(
                    f"No difference we can tell: protected attempts {speed} ({ci}), and "
                    "that interval includes 1x (no change)."
                )
    spreads = [arm["spread"] for arm in c["arms"] if arm["spread"] is not None]
    if spreads:
        noise = max(spreads) - 1
        if ab is not None and ab["ratio"]:
            effect = max(ab["ratio"], 1 / ab["ratio"]) - 1
            said.append(
                f"Attempts without a change differed by up to {_pct(noise)} among themselves, "
                + (
                    "so the difference is larger than the noise."
                    if effect > noise
                    else "so the difference is within the noise: run more attempts of each."
                )
            )
        else:
            said.append(
                f"Attempts without a change differed by up to {_pct(noise)} among themselves "
                "(the noise any effect must exceed)."
            )
    for arm in c["arms"]:
        h = arm["halves"]
        if h and h["low"] is not None and (h["low"] > 1 or h["high"] < 1):
            said.append(
                f"The later {ARM[arm['protected']]} attempts ran at {_x(h['ratio'])} the speed "
                f"of the earlier ones (95 % confidence {_x(h['low'])} to {_x(h['high'])}): "
                "something besides protection changed over time."
            )
    if c["unassigned"]:
        said.append(
            f"{_attempts(len(c['unassigned']))} did not say whether hostd protected them and "
            "are left out."
        )
    waiting = sum(arm["recorded"] - arm["n"] for arm in c["arms"])
    if measure["name"] and waiting and (ab is not None or not (p and u)):
        said.append(
            f"Left out: {_attempts(waiting)} with no {measure['name']} yet (still running)."
        )
    return " ".join(said)


# --- the page ---------------------------------------------------------------------------------


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


_CSS = """
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
"""


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


def _cell(value: float | None, scale: float, fmt: str) -> str:
    return f"<td>{html.escape('-' if value is None else fmt.format(value * scale))}</td>"


def _table(c: dict, summaries: list[dict]) -> str:
    """One row per attempt, in time order."""
    unit = f" {c['measure']['unit']}" if c["measure"]["unit"] else ""
    head = ("attempt", "host", "start", "protected", "why", "duration",
            c["measure"]["name"] or "measure", "wait share", "wait/slice", "GPU util")  # fmt: skip
    rows = ["<tr>" + "".join(
        f'<th class="l">{html.escape(h)}</th>' if h in ("attempt", "host", "why")
        else f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]  # fmt: skip
    for s in summaries:
        cells = [
            f'<td class="l">{html.escape(s["attempt"])}</td>',
            f'<td class="l">{html.escape(s["host"] or "?")}</td>',
            f"<td>{_when(s['start'])}</td>",
            {True: '<td class="yes">yes</td>', False: '<td class="no">no</td>'}.get(
                s["protected"], "<td>?</td>"
            ),
            f'<td class="l">{html.escape(s["why"] or "")}</td>',
            f"<td>{_span(s)}</td>",
            _cell(_value(s, c["measure"]), 1, "{:.4g}" + unit),
            _cell(s["wait_share"], 100, "{:.1f} %"),
            _cell(s["wait_per_timeslice_s"], 1000, "{:.3f} ms"),
            _cell(s["gpu_utilization"], 100, "{:.0f} %"),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def _section(Figure: Any, c: dict, summaries: list[dict], heading: str | None) -> str:
    mine = [s for s in summaries if s["job"] == c["job"]]
    parts = [f"<h2>{html.escape(heading)}</h2>"] if heading else []
    parts.append(f'<p class="verdict">{html.escape(c["verdict"])}</p>')
    parts.append(f'<p class="note">Measure: {html.escape(c["measure"]["how"])}.</p>')
    parts.append("<h3>Attempts</h3>")
    parts.append(_table(c, mine))
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


def render_html(comparisons: Sequence[dict], summaries: Sequence[dict]) -> str:
    """A self-contained HTML page of ``comparisons`` (from ``compare_all``) and the attempts'
    ``summaries``: the verdict first, a table of attempts, plots as inline PNG images. No
    script and no link to fetch: it opens offline and can be mailed as one file."""
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
    sections = [
        _section(Figure, c, summaries, None if len(comparisons) == 1 else f"Job {c['job']}")
        for c in comparisons
    ]
    notes = (
        '<h2>How to read this</h2>\n<ul class="note">'
        "<li><b>A/B</b>: attempts hostd protected against attempts it did not (a job opts out "
        "with HOSTD_PROTECT=0 in its environment). The speed ratio is above 1 when the "
        "protected ones were faster.</li>"
        "<li><b>95 % confidence</b>: the range the true ratio most likely lies in, found by "
        "resampling the attempts (bootstrap). A range that includes 1x means no difference "
        "can be told apart from chance: run more attempts.</li>"
        "<li><b>Worst attempt</b>: an effect is judged on its worst repetition: the slowest "
        "protected attempt against the median unprotected one.</li>"
        "<li><b>A/A</b>: how much attempts of the same arm differ among themselves; an effect "
        "smaller than that is not worth much.</li>"
        "<li><b>Wait share</b>: of the time the job's threads wanted a CPU, the share they "
        "spent waiting on a run queue (what hostd tries to remove).</li></ul>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        + "\n".join(sections)
        + "\n"
        + notes
        + "\n</body>\n</html>\n"
    )

"""The statistics of ``hostd report``: each job's attempts, protected against unprotected (A/B)
and among themselves (A/A: the noise an effect must exceed).

The measure is the job's own throughput (the median of its samples, the first left out as
warm-up) when every attempt has one, else the duration of the attempts that ended (assuming each
did the same work). The A/B ratio is a speed ratio (above 1: protection helped) with a 95 %
bootstrap confidence interval over attempts (seeded: the same files always give the same
numbers), and the worst attempt of each arm is set against the other arm's median: an effect is
judged on its worst repetition. Each arm's earlier and later halves are compared too (a drift
over time that is not protection's doing).

Pure functions: ``compare`` (one job) and ``compare_all`` (every job, or the one named), whose
comparison carries its verdict (``hostd.report.verdict``). Called by ``hostd.cli.report``
through ``hostd.report``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence

from hostd.policy import did_you_mean
from hostd.report.errors import ReportError
from hostd.report.load import _text, _time_order, summarise
from hostd.report.verdict import _verdict

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 20251126  # any fixed value: the same attempts always give the same intervals


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

"""The fleet's view of ``hostd report``: a job whose attempts ran on several hosts (records
gathered from many hosts with ``--dir``, or ``--prometheus``), host by host.

For each job and host: each arm's median and its attempts, and the host's own A/B (speed ratio,
bootstrap interval, finding: ``hostd.report.stats``' own, on the measure the job's comparison
chose); for each job and arm, how much the hosts' medians differ among themselves (A/A between
hosts: the noise a host's effect must exceed), with the fastest and the slowest host; and the
hosts and jobs that got slower under protection, worst first (a speed ratio below 1 whose
interval does not include 1, or that has no interval: too few attempts). ``fleet`` returns one
dict with a paragraph of plain words. Pure; called by ``hostd.cli.report`` through
``hostd.report``, drawn by ``hostd.report.html``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from hostd.report.stats import RESAMPLES, SEED, _ab, _value
from hostd.report.verdict import ARM, _pct, _x

NAMED = 5  # hosts or jobs named in the words; the rest counted


def _arm(values: list[float]) -> dict | None:
    return {"n": len(values), "median": statistics.median(values)} if values else None


def _versus(p: list[float], u: list[float], better: str, resamples: int, seed: int) -> dict:
    if not p or not u:
        return {"ratio": None, "low": None, "high": None, "finding": None}
    ab = _ab(p, u, better, resamples, seed)
    return {k: ab[k] for k in ("ratio", "low", "high", "finding")}


def _slower(entry: dict) -> bool:
    ratio = entry["ratio"]
    return ratio is not None and ratio < 1 and entry["finding"] in ("slower", "too few attempts")


def fleet(
    comparisons: Sequence[dict],
    summaries: Sequence[dict],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict:
    """Each job's attempts (``comparisons`` from ``compare_all``, ``summaries`` from
    ``summarise``) host by host: see the module's docstring."""
    per_host, per_job, between = [], [], []
    for c in comparisons:
        measure = c["measure"]
        if not measure["name"]:
            continue
        values: dict[tuple[str, bool], list[float]] = {}
        for s in summaries:
            if s["job"] == c["job"] and s["protected"] is not None:
                v = _value(s, measure)
                if v is not None:
                    values.setdefault((s["host"] or "?", s["protected"]), []).append(v)
        hosts = sorted({h for h, _ in values})
        for host in hosts:
            p, u = values.get((host, True), []), values.get((host, False), [])
            per_host.append({
                "job": c["job"], "host": host, "protected": _arm(p), "unprotected": _arm(u),
                **_versus(p, u, measure["better"], resamples, seed),
            })  # fmt: skip
        for flag in (True, False):
            medians = {h: statistics.median(values[h, flag]) for h in hosts if (h, flag) in values}
            if len(medians) < 2:
                continue
            speed = {h: m if measure["better"] == "higher" else -m for h, m in medians.items()}
            between.append({
                "job": c["job"],
                "protected": flag,
                "hosts": len(medians),
                "medians": medians,
                "spread": max(medians.values()) / min(medians.values()),
                "fastest": max(speed, key=lambda h: speed[h]),
                "slowest": min(speed, key=lambda h: speed[h]),
            })  # fmt: skip
        ab = c["ab"] or {}
        per_job.append({
            "job": c["job"],
            "hosts": len(hosts),
            "protected": _arm([v for (_, f), vs in values.items() if f for v in vs]),
            "unprotected": _arm([v for (_, f), vs in values.items() if not f for v in vs]),
            **{k: ab.get(k) for k in ("ratio", "low", "high", "finding")},
        })  # fmt: skip
    slower = [{**e, "host": None} for e in per_job if _slower(e)] + [
        e for e in per_host if _slower(e)
    ]
    slower = [
        {k: e[k] for k in ("job", "host", "ratio", "low", "high", "finding")}
        for e in sorted(slower, key=lambda e: (e["ratio"], e["job"], e["host"] or ""))
    ]
    doc = {
        "hosts": sorted({s["host"] or "?" for s in summaries}),
        "per_host": per_host,
        "per_job": per_job,
        "between_hosts": between,
        "slower": slower,
    }
    doc["verdict"] = _words(doc)
    return doc


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:NAMED])
    return shown + (f" and {len(items) - NAMED} more" if len(items) > NAMED else "")


def _words(f: dict) -> str:
    """One paragraph: where the attempts ran, who got slower under protection (worst first),
    and how much hosts of the same arm differ."""
    jobs = {e["job"] for e in f["per_job"]}
    said = [
        f"Attempts of {len(jobs)} job{'' if len(jobs) == 1 else 's'} on "
        f"{len(f['hosts'])} host{'' if len(f['hosts']) == 1 else 's'}."
    ]
    compared = [e for e in f["per_host"] if e["ratio"] is not None]
    if f["slower"]:
        items = []
        for e in f["slower"]:
            where = f"job {e['job']}" if e["host"] is None else f"{e['host']} ({e['job']})"
            how = (
                f"95 % confidence {_x(e['low'])} to {_x(e['high'])}"
                if e["low"] is not None
                else "too few attempts to be sure"
            )
            items.append(f"{where} at {_x(e['ratio'])} ({how})")
        said.append("Slower under protection, worst first: " + _named(items) + ".")
    elif compared or any(e["ratio"] is not None for e in f["per_job"]):
        said.append("No host and no job ran slower under protection.")
    else:
        said.append("No host ran attempts of both arms of a job: no host's A/B to tell.")
    for b in sorted(f["between_hosts"], key=lambda b: -b["spread"])[:NAMED]:
        said.append(
            f"Between hosts, the medians of {b['job']}'s {ARM[b['protected']]} attempts "
            f"differed by up to {_pct(b['spread'] - 1)} ({b['fastest']} fastest, "
            f"{b['slowest']} slowest, {b['hosts']} hosts)."
        )
    if f["between_hosts"]:
        said.append("A host's effect smaller than that is within the noise between hosts.")
    return " ".join(said)

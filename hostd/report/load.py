"""Reading the agent's attempt records (``STATE_DIR/attempts/*.json``, schema
``hostd.attempt/1``) and summarising each attempt in numbers: when and how long it ran, its
throughput, its GPUs' utilisation, its threads' run-queue wait per layer.

``load_attempts`` (files -> records and warnings) and ``summarise`` (one attempt) are pure but
for the reading; the parsers (``_num``, ``_amount``, ``_text``) take any JSON value and give a
usable one or None. A record ``hostd.report.prom`` builds from Prometheus' series has the same
shape with what Prometheus does not keep left out: a sample's ``all_layers`` (CPU and wait of
every layer together) instead of its ``layers``, and ``start_clipped`` when the attempt began
before the range asked for (its duration is then unknown). Called by ``hostd.report.stats``
and, through ``hostd.report``, by ``hostd.cli.report``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from hostd.model.attempts import SCHEMA
from hostd.report.errors import ReportError

ATTEMPTS = "attempts"  # the folder below the state dir where the agent records attempts
MAX_POINTS = 500  # of an attempt's throughput over time (more are averaged in buckets)


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
    return users_apart(attempts), warnings


def users_apart(attempts: list[dict]) -> list[dict]:
    """``attempts`` in time order, those of a job name several users share renamed per user.

    A job's name is its user's to write: where users share one, each user's attempts are a
    job of their own ("llama (uid 1000)"), so that nobody's runs count in another's A/B. Also
    ``hostd.report.prom``'s, for the records it builds from Prometheus' series."""
    users: dict[str, set] = {}
    for doc in attempts:
        users.setdefault(doc["job"], set()).add(doc.get("uid"))
    attempts = [
        {**doc, "job": f"{doc['job']} (uid {doc.get('uid')})"} if len(users[doc["job"]]) > 1
        else doc
        for doc in attempts
    ]  # fmt: skip
    attempts.sort(key=_time_order)
    return attempts


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
    if attempt.get("start_clipped") is True:  # began before the range Prometheus was asked for
        duration = None
    rates = [v for s in samples if (v := _num(s.get("throughput"))) is not None]
    kept = rates[1:] if len(rates) >= 3 else rates
    gpu = [v for s in samples if (v := _amount(s.get("gpu_utilization"))) is not None]
    total, layers = _Wait(), {}
    for s in samples:
        per_layer = s.get("layers")
        whole = s.get("all_layers")  # a record built from Prometheus: every layer together
        if not per_layer and isinstance(whole, dict):
            total.add(whole)
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

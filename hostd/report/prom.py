"""Attempt records from a Prometheus server (``hostd report --prometheus URL``): the verdict
``hostd report`` gives on one host, across every node and attempt the server has.

Every agent exports its live job attempts (``hostd.agent.metrics.job_families``):
``hostd_job_attempt_info`` (labels ``training_job``, ``attempt``, ``uid``, ``source``,
``protected``), ``hostd_job_throughput{unit}``, ``hostd_job_gpu_utilization_ratio`` (NVML), the
counters ``hostd_job_cpu_seconds_total`` and ``hostd_job_runqueue_wait_seconds_total``, and
``hostd_job_gpu_info``, its GPUs labelled as NVIDIA's DCGM exporter labels them. ``fetch`` asks
the server's HTTP API for them over a range (``/api/v1/query_range``, one value per ``step``;
``/api/v1/query`` for whether DCGM is scraped at all), the ``--selector`` matchers merged into
every query, and ``records`` turns the series of each (instance, training_job, attempt, uid)
into one record of the shape the agent writes (``hostd.attempt/1``, one sample per step), its
``host`` the node (a node-like target label, else the instance), so that ``hostd.report.stats``
compares them as it compares files; GPU utilisation is DCGM's where DCGM is scraped (joined on
``UUID`` and ``Hostname``). What the metrics do not carry (waits per layer, timeslices, why an
attempt was not protected, the agent's mode and policy) is left out and said so in
``Fetched.notes``, never made up.

Pure but for the reading (urllib, as ``load`` reads files): ``window``, ``matchers`` and
``records`` do no I/O. A failure is a ``ReportError`` of one line naming the URL and the query:
the server unreachable, an answer that is not Prometheus', nothing in range; ``BadInput`` (a
subclass) for what the user asked wrong, a time, a step, a selector, or a query Prometheus
refused (its own words). Called by ``hostd.cli.report`` through ``hostd.report``.
"""

from __future__ import annotations

import base64
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

from hostd.model.attempts import SCHEMA
from hostd.report.errors import ReportError
from hostd.report.load import users_apart

TIMEOUT_S = 30.0  # for each query
MIN_STEP_S = 15.0  # the default step: at least this, and at most MAX_POINTS values a series
MAX_POINTS = 1000
# The target labels that name a node, first found wins (else the instance)
NODE_LABELS = ("node", "nodename", "node_name", "kubernetes_node", "Hostname", "hostname", "host")
KEY = ("instance", "training_job", "attempt", "uid")  # one attempt record each
INFO = "hostd_job_attempt_info"
SERIES = {
    "throughput": "hostd_job_throughput",
    "gpu": "hostd_job_gpu_utilization_ratio",
    "cpu": "hostd_job_cpu_seconds_total",
    "wait": "hostd_job_runqueue_wait_seconds_total",
}
DCGM = "DCGM_FI_DEV_GPU_UTIL"  # percent
RANGE, INSTANT = "/api/v1/query_range", "/api/v1/query"
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
EXAMPLE = '{cluster="a",training_job=~"llama.*"}'

Key = tuple[str, str, str, str]


class BadInput(ReportError):
    """What was asked cannot be: a time, a step, a selector, a query Prometheus refused."""


@dataclass(frozen=True)
class Window:
    """The range asked for, in seconds since the epoch, and the step between values."""

    start: float
    end: float
    step: float

    def last(self) -> float:
        """The last time Prometheus evaluates a range query at (start + a whole number of steps)."""
        return self.start + math.floor((self.end - self.start) / self.step + 1e-9) * self.step


@dataclass
class Fetched:
    attempts: list[dict]
    source: dict  # what was asked of whom, and what the metrics do not say (JSON's "prometheus")

    @property
    def notes(self) -> list[str]:
        return self.source["notes"]


def parse_duration(text: str, what: str) -> float:
    """Seconds in ``text``: a Prometheus duration (``90s``, ``15m``, ``6h``, ``1h30m``, ``2d``)
    or a number of seconds; ``what`` (an option's name) is named when it is neither."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise BadInput(
                f"{what} {text}: not a duration (such as 90s, 15m, 6h, 1h30m, 2d)"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadInput(f"{what} {text}: a duration must be above 0")
    return seconds


def parse_time(text: str, now: float, what: str) -> float:
    """``now``, a time that long ago (``6h``, ``1h30m``), or an RFC 3339 time
    (``2026-11-29T06:00:00Z``; without an offset, UTC)."""
    text = text.strip()
    if text == "now":
        return now
    if re.fullmatch(f"(?:{_DURATION.pattern})+", text):
        return now - parse_duration(text, what)
    try:
        when = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text).replace(" ", "T", 1))
    except ValueError:
        raise BadInput(
            f"{what} {text}: not a time (RFC 3339 such as 2026-11-29T06:00:00Z, or a time ago "
            "such as 6h, or now)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def window(since: str, until: str | None, step: str | None, now: float) -> Window:
    """The range of ``--since`` to ``--until`` (default now), every ``--step`` (default: at least
    15 s, and at most ``MAX_POINTS`` values a series)."""
    start = parse_time(since, now, "--since")
    end = now if until is None else parse_time(until, now, "--until")
    if end <= start:
        raise BadInput(f"--since {since} is not before --until {until or 'now'}")
    if step is None:
        every = max(MIN_STEP_S, float(math.ceil((end - start) / MAX_POINTS)))
    else:
        every = parse_duration(step, "--step")
    return Window(start, end, every)


def matchers(selector: str | None) -> str:
    """The label matchers of ``--selector`` (``{a="1",b=~"x.*"}``, braces optional) as they go
    between a metric's braces ("" for none). A brace outside quotes would leave the selector and
    change the query: refused here, the matchers themselves are Prometheus' to judge."""
    text = (selector or "").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    quote, escaped = "", False
    for ch in text:
        if escaped:
            escaped = False
        elif quote:
            escaped = ch == "\\" and quote != "`"  # a backquoted string has no escapes
            quote = "" if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "{}":
            raise BadInput(f"--selector {selector}: expected label matchers such as {EXAMPLE}")
    if quote:
        raise BadInput(f"--selector {selector}: a quoted value is not closed")
    return text.strip().strip(",").strip()


def _selected(metric: str, inner: str) -> str:
    return f"{metric}{{{inner}}}" if inner else metric


def _dcgm_join(inner: str) -> str:
    """Each attempt's mean DCGM utilisation (0..1) of the GPUs it uses: DCGM's series joined to
    hostd's GPU labels (one DCGM series per GPU: duplicates of it, scraped twice, made one)."""
    return (
        f"avg by (instance, training_job, attempt, uid) ({_selected('hostd_job_gpu_info', inner)}"
        f" * on (UUID, Hostname) group_left () max by (UUID, Hostname) ({DCGM})) / 100"
    )


def _shown(url: str) -> tuple[str, dict]:
    """The URL without a user and password (for messages), and the header they make."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is no number
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput("--prometheus: expected an http:// or https:// URL, such as "
                       "http://prometheus:9090")  # fmt: skip
    headers = {}
    if parts.username is not None:
        user, password = (urllib.parse.unquote(v or "") for v in (parts.username, parts.password))
        headers["Authorization"] = (
            "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        )
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        parts = parts._replace(netloc=host + (f":{port}" if port else ""))
    return urllib.parse.urlunsplit(parts).rstrip("/"), headers


def ask(url: str, path: str, params: dict) -> list:
    """One query of Prometheus' HTTP API (a form POST): its ``data.result``."""
    shown, headers = _shown(url)
    query = params["query"]
    request = urllib.request.Request(
        shown + path,
        data=urllib.parse.urlencode(params).encode(),
        headers={**headers, "Accept": "application/json"},
    )
    status, kind = 200, ""
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            raw, kind = resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:  # Prometheus says why, in JSON, with 400, 422, 503
        status, kind = exc.code, exc.headers.get("Content-Type", "") if exc.headers else ""
        raw = exc.read()
    except (OSError, ValueError) as exc:  # URLError, a timeout, a refused connection, bad URL
        reason = getattr(exc, "reason", None) or exc
        raise ReportError(f"cannot reach Prometheus at {shown}: {reason}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
        raise ReportError(
            f"{shown}{path}: not an answer of Prometheus' API (HTTP {status}"
            + (f", {kind.split(';')[0]}" if kind else "")
            + f") to {query}: is {shown} a Prometheus server?"
        )
    if doc["status"] == "error":
        error = " ".join(str(doc.get("error") or "no reason given").split())
        if doc.get("errorType") == "bad_data":
            raise BadInput(f"Prometheus at {shown} refused {query}: {error}")
        raise ReportError(
            f"Prometheus at {shown} failed on {query}: {doc.get('errorType') or 'error'}: {error}"
        )
    result = (doc.get("data") or {}).get("result")
    if not isinstance(result, list):
        raise ReportError(f"{shown}{path}: Prometheus' answer to {query} holds no result")
    return result


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".")


def fetch(url: str, win: Window, selector: str | None = None) -> Fetched:
    """Every attempt Prometheus at ``url`` has in ``win`` (those ``selector`` matches), as
    records; ``ReportError`` when it has none (saying whether hostd is scraped there at all)."""
    shown, _ = _shown(url)
    inner = matchers(selector)
    span = {"start": _num(win.start), "end": _num(win.end), "step": _num(win.step)}
    asked: list[str] = []

    def over_range(query: str) -> list:
        asked.append(query)
        return ask(url, RANGE, {"query": query, **span})

    def at_end(query: str) -> list:
        asked.append(query)
        return ask(url, INSTANT, {"query": query, "time": _num(win.end)})

    seconds = f"{math.ceil(win.end - win.start)}s"
    info = over_range(_selected(INFO, inner))
    if not info:
        agents = at_end(f"count(count_over_time({_selected('hostd_info', inner)}[{seconds}]))")
        try:
            n = int(float(agents[0]["value"][1])) if agents else 0
        except (KeyError, IndexError, TypeError, ValueError):
            n = 0
        said = f" matching {selector}" if inner else ""
        raise ReportError(
            f"no {_selected(INFO, inner)} series at {shown} from {_iso(win.start)} to "
            f"{_iso(win.end)}: "
            + (
                f"{n} hostd agent{'s are' if n != 1 else ' is'} scraped there{said}, but no job "
                "attempt ran then (or --since reaches too little back)"
                if n
                else f"no hostd agent{said} is scraped there then (hostd_info)"
            )
        )
    series = {name: over_range(_selected(metric, inner)) for name, metric in SERIES.items()}
    dcgm = bool(at_end(f"count(count_over_time({DCGM}[{seconds}]))"))
    if dcgm:
        series["dcgm"] = over_range(_dcgm_join(inner))
    attempts, notes = records(info, series, win)
    if not attempts:
        raise ReportError(f"{_selected(INFO, inner)} at {shown} names no job attempt in range")
    if not dcgm:
        notes.append(
            f"DCGM is not scraped there ({DCGM}): GPU utilisation is the agents' own (NVML)."
        )
    source = {"url": shown, "start": _iso(win.start), "end": _iso(win.end), "step_s": win.step,
              "selector": selector or None, "dcgm": dcgm, "queries": asked,
              "notes": notes}  # fmt: skip
    return Fetched(attempts, source)


def _key(metric: object) -> Key:
    labels = metric if isinstance(metric, dict) else {}
    return tuple(str(labels.get(k, "")) for k in KEY)  # type: ignore[return-value]


def _values(series: object) -> list[tuple[float, float]]:
    """A range result's [time, "value"] pairs as numbers, the unusable left out."""
    raw = series.get("values") if isinstance(series, dict) else None
    out = []
    for pair in raw if isinstance(raw, list) else ():
        try:
            t, v = float(pair[0]), float(pair[1])
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite(t) and math.isfinite(v):
            out.append((t, v))
    return out


def _points(results: list) -> dict[Key, dict[float, float]]:
    """Per attempt, its values by time (several series of one attempt, such as the same agent
    scraped by two jobs or a unit that changed, made one)."""
    out: dict[Key, dict[float, float]] = {}
    for series in results:
        out.setdefault(_key(series.get("metric") if isinstance(series, dict) else None), {}).update(
            _values(series)
        )
    return out


def _delta(now: float, before: float) -> float:
    return now - before if now >= before else now  # a counter that went down began again


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def records(info: list, series: dict[str, list], win: Window) -> tuple[list[dict], list[str]]:
    """One ``hostd.attempt/1`` record per (instance, training_job, attempt, uid) of ``info``'s
    series (a range result of ``hostd_job_attempt_info``), its samples from ``series`` (range
    results by name: ``throughput``, ``gpu``, ``cpu``, ``wait``, ``dcgm``) at every step the
    attempt was live; and the notes of what they leave unsaid. Pure."""
    live: dict[Key, dict] = {}
    for one in info:
        labels = one.get("metric") if isinstance(one, dict) else None
        key = _key(labels)
        if not isinstance(labels, dict) or key[1] in ("", "other") or not key[2]:
            continue
        item = live.setdefault(key, {"labels": labels, "times": set(), "protected": False})
        item["times"].update(t for t, _ in _values(one))
        item["protected"] = item["protected"] or labels.get("protected") == "true"
    points = {name: _points(series.get(name) or []) for name in (*SERIES, "dcgm")}
    units: dict[Key, str] = {}
    for one in series.get("throughput") or []:
        labels = one.get("metric") if isinstance(one, dict) else None
        if isinstance(labels, dict) and labels.get("unit"):
            units[_key(labels)] = str(labels["unit"])
    out, clipped, running, from_dcgm = [], 0, 0, 0
    half, last = win.step / 2, win.last()
    for key, item in live.items():
        times = sorted(item["times"])
        if not times:
            continue
        began_before = times[0] < win.start + half
        still = times[-1] > last - half
        clipped, running = clipped + began_before, running + still
        rate, cpu, wait = (points[n].get(key, {}) for n in ("throughput", "cpu", "wait"))
        gpu = points["dcgm"].get(key) or points["gpu"].get(key, {})
        from_dcgm += bool(points["dcgm"].get(key))
        before: tuple[float, float] | None = None if began_before else (0.0, 0.0)
        samples = []
        for t in times:
            sample = {
                "t": t,
                "seconds": win.step,
                "layers": {},
                "gpu_utilization": gpu.get(t),
                "throughput": rate.get(t),
            }
            if t in cpu and t in wait:
                if before is not None:
                    sample["all_layers"] = {
                        "cpu_seconds": _delta(cpu[t], before[0]),
                        "wait_seconds": _delta(wait[t], before[1]),
                    }
                before = (cpu[t], wait[t])
            samples.append(sample)
        labels = item["labels"]
        out.append({
            "schema": SCHEMA,
            "job": key[1],
            "attempt": key[2],
            "source": labels.get("source") or None,
            "uid": int(key[3]) if key[3].isdigit() else key[3] or None,
            "host": next((str(labels[n]) for n in NODE_LABELS if labels.get(n)), key[0] or None),
            "instance": key[0],
            "protected": item["protected"],
            "why": None,
            "policy": None,
            "mode": None,
            "start": times[0],
            "start_clipped": began_before,
            "end": None if still else times[-1],
            "throughput_unit": units.get(key),
            "samples": samples,
        })  # fmt: skip
    notes = [
        "Waits per layer and timeslices are not in the metrics: the wait share is of the "
        "attempt's threads in all layers together, and there is no wait per timeslice.",
        "Why an attempt was not protected, and the agent's mode and policy, are not in the "
        "metrics.",
        f"Samples are Prometheus' values every {win.step:g} s, not the agents' own samples: an "
        "attempt's start and end are known to within a step.",
    ]
    if clipped:
        notes.append(
            f"{_count(clipped, 'attempt')} began before the range: its first value is the "
            "range's start, and its duration is unknown."
        )
    if running:
        notes.append(f"{_count(running, 'attempt')} still ran at the end of the range.")
    others = {k[0] for k in points["cpu"] if k[1] == "other"}
    if others:
        notes.append(
            f"{_count(len(others), 'node')} ran more attempts at once than an agent labels: the "
            'rest are summed as training_job="other" in the metrics and are not in this report.'
        )
    nodes: dict[tuple[str, str, str], set] = {}
    for rec in out:
        nodes.setdefault((rec["job"], rec["attempt"], str(rec["uid"])), set()).add(rec["host"])
    spread = sum(1 for hosts in nodes.values() if len(hosts) > 1)
    if spread:
        notes.append(
            f"{_count(spread, 'attempt')} ran on several nodes: each node's part counts as an "
            "attempt of its own, as the records gathered from those nodes would."
        )
    if from_dcgm:
        notes.append(
            f"GPU utilisation of {_count(from_dcgm, 'attempt')} is DCGM's ({DCGM}, joined "
            "through hostd_job_gpu_info); of the others, the agents' own (NVML)."
        )
    return users_apart(out), notes

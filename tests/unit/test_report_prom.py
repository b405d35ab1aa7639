"""``hostd report --prometheus``: attempt records built from a Prometheus server's HTTP API.

A stub server (``http.server`` in a thread) answers the queries with recorded API answers
(tests/fixtures/prom/) or with answers made from synthetic attempt records; the records built
from them, the selector merged into every query, the errors (unreachable, refused, not
Prometheus, nothing in range) in one line each, and the same verdict as ``hostd report`` on the
same attempts as files. The fleet's view (``hostd.report.fleet``) on both.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest

from hostd.report import (
    BadInput,
    ReportError,
    compare_all,
    fetch,
    fleet,
    load_attempts,
    render_html,
    summarise,
    window,
)
from hostd.report.prom import Window, matchers
from tests.unit.test_report import SCHEMA, T0, hostd, record, write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prom"
T = 1764400000  # the recorded answers' range: T to T + 100, a value every 10 s
WIN = Window(T, T + 100, 10)
Answer = Callable[[str, dict], tuple[int, object, str]]


class Stub:
    """A Prometheus API stand-in on a free localhost port: ``answer(path, params)`` gives
    (HTTP status, a JSON value or bytes, content type); every request is kept in ``asked``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.asked: list[tuple[str, dict, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                params = dict(urllib.parse.parse_qsl(self.rfile.read(size).decode()))
                stub.asked.append((self.path, params, dict(self.headers)))
                status, body, kind = stub.answer(self.path, params)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def queries(self) -> list[str]:
        return [params["query"] for _, params, _ in self.asked]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def name_of(query: str) -> str:
    """Which recorded answer a query gets."""
    if query.startswith("count(count_over_time(DCGM"):
        return "dcgm_count"
    if "DCGM" in query:
        return "dcgm_join"
    if query.startswith("count(count_over_time(hostd_info"):
        return "hostd_info_count"
    return query.split("{")[0]


def recorded(path: str, params: dict) -> tuple[int, object, str]:
    doc = json.loads((FIXTURES / f"{name_of(params['query'])}.json").read_text())
    return 200, doc, "application/json"


@pytest.fixture
def stub():
    server = Stub(recorded)
    yield server
    server.close()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


# --- the records ------------------------------------------------------------------------------


def test_records_from_recorded_answers(stub):
    got = fetch(stub.url, WIN)
    b, a = got.attempts  # in time order: node-b's began before the range
    assert (a["host"], a["instance"], a["job"], a["attempt"], a["uid"], a["source"]) == (
        "node-a", "10.1.0.1:9464", "pretrain.py", "torchrun r1 restart 0", 1000, "torchrun",
    )  # fmt: skip
    # protected from its second value on: the attempt was protected
    assert a["protected"] is True and b["protected"] is False
    assert (a["start"], a["end"], a["start_clipped"]) == (T + 10, T + 50, False)
    assert (b["start"], b["end"], b["start_clipped"]) == (T, None, True)
    assert a["throughput_unit"] == "steps/s" and a["schema"] == "hostd.attempt/1"
    # one sample a step; scraped by two jobs, still one attempt with one value a step
    assert [s["t"] for s in a["samples"]] == [T + 10 * k for k in range(1, 6)]
    assert [s["throughput"] for s in a["samples"]] == [None, 10.0, 10.5, 9.5, 10.0]
    assert [s["gpu_utilization"] for s in a["samples"]] == [0.9] * 5  # DCGM's, over NVML's
    assert [s["gpu_utilization"] for s in b["samples"]] == [0.4] * 11  # no DCGM: NVML's
    # the counters as each step's increase, from 0 where the attempt began in the range
    assert [s["all_layers"]["cpu_seconds"] for s in a["samples"]] == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert "all_layers" not in b["samples"][0]  # began before: its first value is a base
    assert b["samples"][1]["all_layers"] == {"cpu_seconds": 2.0, "wait_seconds": 1.0}
    assert all(s["layers"] == {} for s in a["samples"] + b["samples"])
    sa, sb = summarise(a), summarise(b)
    assert sa["throughput"] == 10.0  # the median, the first value left out as warm-up
    assert sa["wait_share"] == pytest.approx(0.5 / 9.5)
    assert sa["wait_per_timeslice_s"] is None and sa["layers"] == []  # not in the metrics
    assert (sa["duration_s"], sb["duration_s"]) == (40.0, None)
    assert sb["wait_share"] == pytest.approx(10 / 30)
    notes = " ".join(got.notes)
    for said in ("Waits per layer", "not protected", "every 10 s", "1 attempt began before",
                 "1 attempt still ran", 'training_job="other"', "GPU utilisation of 1 attempt is "
                 "DCGM's"):  # fmt: skip
        assert said in notes, said
    source = got.source
    assert (source["url"], source["dcgm"], source["step_s"]) == (stub.url, True, 10)
    assert (source["start"], source["end"]) == ("2025-11-29T07:06:40Z", "2025-11-29T07:08:20Z")
    assert source["queries"] == stub.queries()
    for path, params, _ in stub.asked:
        if path == "/api/v1/query_range":
            assert (params["start"], params["end"], params["step"]) == (str(T), str(T + 100), "10")
        else:
            assert path == "/api/v1/query" and params["time"] == str(T + 100)


def test_the_selector_is_merged_into_every_query(stub):
    got = fetch(stub.url, WIN, '{cluster="a", training_job=~"pre.*"}')
    inner = 'cluster="a", training_job=~"pre.*"'
    assert (
        stub.queries()
        == got.source["queries"]
        == [
            f"hostd_job_attempt_info{{{inner}}}",
            f"hostd_job_throughput{{{inner}}}",
            f"hostd_job_gpu_utilization_ratio{{{inner}}}",
            f"hostd_job_cpu_seconds_total{{{inner}}}",
            f"hostd_job_runqueue_wait_seconds_total{{{inner}}}",
            "count(count_over_time(DCGM_FI_DEV_GPU_UTIL[100s]))",
            f"avg by (instance, training_job, attempt, uid) (hostd_job_gpu_info{{{inner}}} * on "
            "(UUID, Hostname) group_left () max by (UUID, Hostname) (DCGM_FI_DEV_GPU_UTIL)) / 100",
        ]
    )
    assert got.source["selector"] == '{cluster="a", training_job=~"pre.*"}'


@pytest.mark.parametrize(
    ("selector", "inner"),
    [
        (None, ""),
        ("{}", ""),
        ('{a="1"}', 'a="1"'),
        ('a="1",', 'a="1"'),
        ('{a=~"x{2}"}', 'a=~"x{2}"'),  # a brace inside quotes is the value's
        ('{a="\\"}"}', 'a="\\"}"'),
        ("{a=~`x}`}", "a=~`x}`"),
    ],
)
def test_matchers(selector, inner):
    assert matchers(selector) == inner


@pytest.mark.parametrize("selector", ['{a="1"} or vector(1)', '{a="1"} or up{', 'a="1'])
def test_a_selector_that_leaves_its_braces_is_refused_here(selector):
    with pytest.raises(BadInput, match=r"^--selector "):
        matchers(selector)


def test_window():
    now = 2_000_000_000.0
    assert window("6h", None, None, now) == Window(now - 21600, now, 22.0)  # >= 15 s, 1000 values
    assert window("1h30m", "30m", "1m", now) == Window(now - 5400, now - 1800, 60.0)
    assert window("10m", "now", "2.5", now) == Window(now - 600, now, 2.5)
    got = window("2026-11-29T06:00:00Z", "2026-11-29T08:00:00+01:00", "10s", now)
    assert (iso(got.start), iso(got.end)) == (
        "2026-11-29T06:00:00+00:00",
        "2026-11-29T07:00:00+00:00",
    )
    assert window("2026-11-29T06:00:00", "2026-11-29T06:00:01", None, now).step == 15.0  # UTC


@pytest.mark.parametrize(
    ("since", "until", "step", "said"),
    [
        ("yesterday", None, None, "--since yesterday: not a time"),
        ("6h", "tomorrow", None, "--until tomorrow: not a time"),
        ("1h", "2h", None, "--since 1h is not before --until 2h"),
        ("1h", None, "0s", "--step 0s: a duration must be above 0"),
        ("1h", None, "fast", "--step fast: not a duration"),
    ],
)
def test_window_refuses_what_is_no_time(since, until, step, said):
    with pytest.raises(BadInput, match="^" + said):
        window(since, until, step, 2_000_000_000.0)


# --- errors -----------------------------------------------------------------------------------


def answering(status: int, body: object, kind: str = "application/json") -> Answer:
    return lambda path, params: (status, body, kind)


@pytest.fixture
def answer():
    servers: list[Stub] = []

    def start(how: Answer) -> Stub:
        servers.append(Stub(how))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_unreachable():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ReportError, match=f"^cannot reach Prometheus at {url}: ") as got:
        fetch(url, WIN)
    assert not isinstance(got.value, BadInput)
    result = hostd("report", "--prometheus", url, "--json")
    assert result.exit_code == 1
    assert one_line(result).startswith(f"hostd: cannot reach Prometheus at {url}: ")


def test_a_bad_selector_refused_by_prometheus_in_its_words(answer):
    refusal = json.loads((FIXTURES / "bad_data.json").read_text())
    server = answer(answering(400, refusal))
    result = hostd("report", "--prometheus", server.url, "--selector", "{training_job=llama}")
    assert result.exit_code == 2
    assert one_line(result) == (
        f"hostd: Prometheus at {server.url} refused hostd_job_attempt_info{{training_job=llama}}"
        f": {refusal['error']}"
    )


def test_a_query_that_fails_there_is_a_runtime_failure(answer):
    failed = {"status": "error", "errorType": "execution", "error": "query timed out"}
    server = answer(answering(422, failed))
    result = hostd("report", "--prometheus", server.url + "/", "--json")
    assert result.exit_code == 1
    assert one_line(result) == (
        f"hostd: Prometheus at {server.url} failed on hostd_job_attempt_info: execution: "
        "query timed out"
    )


def test_not_prometheus(answer):
    server = answer(answering(200, b"<html>a login page</html>", "text/html; charset=utf-8"))
    with pytest.raises(ReportError) as got:
        fetch(server.url, WIN)
    assert str(got.value) == (
        f"{server.url}/api/v1/query_range: not an answer of Prometheus' API (HTTP 200, "
        f"text/html) to hostd_job_attempt_info: is {server.url} a Prometheus server?"
    )


@pytest.mark.parametrize(
    ("agents", "said"),
    [
        ("hostd_info_count", "2 hostd agents are scraped there, but no job attempt ran then"),
        ("empty_vector", "no hostd agent is scraped there then (hostd_info)"),
    ],
)
def test_no_series_in_range(answer, agents, said):
    def how(path: str, params: dict) -> tuple[int, object, str]:
        name = agents if "hostd_info" in params["query"] else "empty_matrix"
        return 200, json.loads((FIXTURES / f"{name}.json").read_text()), "application/json"

    server = answer(how)
    with pytest.raises(ReportError) as got:
        fetch(server.url, WIN)
    assert str(got.value).startswith(
        f"no hostd_job_attempt_info series at {server.url} from 2025-11-29T07:06:40Z to "
        f"2025-11-29T07:08:20Z: {said}"
    )
    result = hostd("report", "--prometheus", server.url, "--since", "1h", "--json")
    assert result.exit_code == 1 and said in one_line(result)


def test_options_that_need_prometheus_or_exclude_it(tmp_path):
    result = hostd("report", "--dir", str(tmp_path), "--since", "6h")
    assert result.exit_code == 2 and one_line(result) == "hostd: --since needs --prometheus URL"
    result = hostd("report", "--prometheus", "http://x:9090", "--dir", str(tmp_path))
    assert result.exit_code == 2 and "one or the other" in one_line(result)
    result = hostd("report", "--prometheus", "prometheus:9090")
    assert one_line(result) == (
        "hostd: --prometheus: expected an http:// or https:// URL, such as http://prometheus:9090"
    )
    assert result.exit_code == 2
    result = hostd("report", "--prometheus", "http://x:9090", "--since", "yesterday")
    assert result.exit_code == 2 and "--since yesterday: not a time" in one_line(result)


def test_a_user_and_password_in_the_url_are_sent_never_shown(stub):
    url = stub.url.replace("http://", "http://ops:s%40cret@")
    got = fetch(url, WIN)
    assert got.source["url"] == stub.url
    sent = {headers.get("Authorization") for _, _, headers in stub.asked}
    assert sent == {"Basic " + base64.b64encode(b"ops:s@cret").decode()}


# --- the command ------------------------------------------------------------------------------


def test_cli_json_matches_its_schema(stub):
    result = hostd("report", "--prometheus", stub.url, "--since", iso(T), "--until",
                   iso(T + 100), "--step", "10s", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert "folder" not in doc and doc["prometheus"]["url"] == stub.url
    assert [(s["host"], s["protected"]) for s in doc["attempts"]] == [
        ("node-b", False), ("node-a", True),
    ]  # fmt: skip
    (c,) = doc["comparisons"]
    assert c["job"] == "pretrain.py" and c["hosts"] == ["node-a", "node-b"]
    assert c["ab"]["ratio"] == pytest.approx(10 / 8) and c["ab"]["finding"] == "too few attempts"
    f = doc["fleet"]
    assert f["hosts"] == ["node-a", "node-b"] and f["slower"] == []
    assert [(e["host"], e["ratio"]) for e in f["per_host"]] == [("node-a", None), ("node-b", None)]


def test_cli_writes_the_page_with_its_hosts_and_what_prometheus_does_not_say(stub, tmp_path):
    out = tmp_path / "fleet.html"
    result = hostd("report", "--prometheus", stub.url, "--since", iso(T), "--until",
                   iso(T + 100), "--step", "10", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}: Protected attempts ran at 1.25x")
    assert "\nhosts: Attempts of 1 job on 2 hosts." in result.stdout
    page = out.read_text()
    for said in (f"From Prometheus at {stub.url}", "<h2>Hosts</h2>",
                 "What this source does not say", "Waits per layer"):  # fmt: skip
        assert said in page, said


def test_cli_folder_of_one_host_is_as_before_and_of_several_hosts_has_its_hosts(tmp_path):
    recs = fleet_records()
    one = hostd("report", "--dir", str(write(tmp_path / "one", recs[:4])), "--json")
    assert "fleet" not in json.loads(one.stdout)  # one host: the shape of before
    many = hostd("report", "--dir", str(write(tmp_path / "many", recs)), "--json")
    doc = json.loads(many.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert doc["fleet"]["hosts"] == ["node-a", "node-b", "node-c"]


# --- the same verdict as from files -----------------------------------------------------------

STEP = 5.0  # the synthetic records' samples are 5 s apart


def fleet_records() -> list[dict]:
    """One job on three hosts, each running P U P U (record: four samples 5 s apart, the first
    a warm-up); node-c is slower protected."""
    out, i = [], 0
    for host, (p, u) in {"node-a": (12.5, 10.0), "node-b": (13.0, 10.4),
                         "node-c": (9.5, 9.8)}.items():  # fmt: skip
        for flag, value in ((True, p), (False, u), (True, p * 1.01), (False, u * 0.99)):
            rec = record(f"torchrun {host}-{i} restart 0", flag, start=T0 + 100 * i,
                         throughput=value, gpu=0.8 if flag else 0.6, duration=30.0)  # fmt: skip
            out.append({**rec, "host": host, "uid": 1000})
            i += 1
    return out


def answers_from(records: list[dict]) -> Answer:
    """What Prometheus scraping the agents that made ``records`` would answer, a value every
    ``STEP`` (at each of their samples); no DCGM."""
    hosts = sorted({r["host"] for r in records})
    series: dict[str, list] = {}
    for r in records:
        labels = {"instance": f"10.0.0.{hosts.index(r['host']) + 1}:9464", "job": "hostd",
                  "node": r["host"], "training_job": r["job"], "attempt": r["attempt"],
                  "uid": str(r["uid"])}  # fmt: skip
        ts = [s["t"] for s in r["samples"]]
        cpu = wait = 0.0
        counters: dict[str, list] = {"cpu": [], "wait": []}
        for s in r["samples"]:
            cpu += sum(ly["cpu_seconds"] for ly in s["layers"].values())
            wait += sum(ly["wait_seconds"] for ly in s["layers"].values())
            counters["cpu"].append([s["t"], repr(cpu)])
            counters["wait"].append([s["t"], repr(wait)])
        flag = "true" if r["protected"] else "false"
        for name, metric, values in (
            ("hostd_job_attempt_info", {"source": r["source"], "protected": flag},
             [[t, "1"] for t in ts]),
            ("hostd_job_throughput", {"unit": r["throughput_unit"]},
             [[s["t"], repr(s["throughput"])] for s in r["samples"]]),
            ("hostd_job_gpu_utilization_ratio", {},
             [[s["t"], repr(s["gpu_utilization"])] for s in r["samples"]]),
            ("hostd_job_cpu_seconds_total", {}, counters["cpu"]),
            ("hostd_job_runqueue_wait_seconds_total", {}, counters["wait"]),
        ):  # fmt: skip
            series.setdefault(name, []).append(
                {"metric": {"__name__": name, **labels, **metric}, "values": values}
            )

    def how(path: str, params: dict) -> tuple[int, object, str]:
        name = name_of(params["query"])
        kind = "vector" if path.endswith("/query") else "matrix"
        doc = {"status": "success", "data": {"resultType": kind, "result": series.get(name, [])}}
        return 200, doc, "application/json"

    return how


def test_the_same_verdict_as_from_the_files(tmp_path, answer):
    records = fleet_records()
    from_files, warnings = load_attempts(write(tmp_path, records))
    assert not warnings
    server = answer(answers_from(records))
    win = Window(T0 - 50, T0 + 100 * len(records) + 100, STEP)
    got = fetch(server.url, win)
    assert len(got.attempts) == len(records)
    by_files, by_prom = compare_all(from_files), compare_all(got.attempts)
    for a, b in zip(by_files, by_prom, strict=True):
        assert (a["job"], a["hosts"], a["attempts"]) == (b["job"], b["hosts"], b["attempts"])
        assert a["measure"] == b["measure"] and a["ab"] == b["ab"]
        assert a["verdict"] == b["verdict"]
        for x, y in zip(a["arms"], b["arms"], strict=True):
            for k in ("protected", "n", "mean", "median", "spread", "halves", "gpu_utilization"):
                assert x[k] == y[k], k
            assert x["wait_share"] == pytest.approx(y["wait_share"])
    assert by_prom[0]["ab"]["finding"] == "faster"
    files_summaries = [summarise(a) for a in from_files]
    prom_summaries = [summarise(a) for a in got.attempts]
    assert fleet(by_files, files_summaries) == fleet(by_prom, prom_summaries)
    f = fleet(by_prom, prom_summaries)
    # node-c got slower under protection; the job as a whole faster
    assert [(e["job"], e["host"], e["finding"]) for e in f["slower"]] == [
        ("trainer-ab", "node-c", "slower")
    ]
    assert f["slower"][0]["ratio"] == pytest.approx((9.5 + 9.595) / (9.8 + 9.702))
    assert [(e["host"], e["protected"]["n"], e["unprotected"]["n"]) for e in f["per_host"]] == [
        ("node-a", 2, 2), ("node-b", 2, 2), ("node-c", 2, 2),
    ]  # fmt: skip
    assert f["per_job"][0]["finding"] == "faster" and f["per_job"][0]["hosts"] == 3
    protected = next(b for b in f["between_hosts"] if b["protected"])
    assert (protected["fastest"], protected["slowest"]) == ("node-b", "node-c")
    assert protected["spread"] == pytest.approx((13.0 * 1.005) / (9.5 * 1.005))
    ratio = f["slower"][0]["ratio"]
    assert (
        f"Slower under protection, worst first: node-c (trainer-ab) at {ratio:.2f}x (95 %"
        in (f["verdict"])
    )
    assert "node-b fastest, node-c slowest" in f["verdict"]
    page = render_html(by_prom, prom_summaries, f, "From Prometheus", got.notes)
    assert "node-c" in page and "Between hosts (A/A)" in page

"""``hostd report`` and ``hostd.report``: synthetic attempt records written to a folder, read
back, summarised and compared (A/B with its bootstrap interval, A/A noise, the verdict's
words), rendered as a self-contained page, and the command through typer's runner (its --json
against docs/json/report.schema.json, its exit codes)."""

from __future__ import annotations

import html
import json
import random
import re
import statistics
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from hostd.cli import app
from hostd.report import (
    ReportError,
    compare,
    compare_all,
    load_attempts,
    render_html,
    save_figure,
    summarise,
)

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "json" / "report.schema.json"
T0 = 1_764_140_000.0


def record(
    name: str,
    protected: bool | None,
    *,
    job: str = "trainer-ab",
    start: float | None = None,
    duration: float | None = 300.0,
    throughput: float | None = None,
    gpu: float | None = None,
    trainer_wait: float = 0.2,
) -> dict:
    """One attempt as the agent records it: four samples, the first a slow warm-up, so the
    median of the other three is ``throughput``."""
    start = T0 + 1000 * len(name) + sum(map(ord, name)) % 997 if start is None else start
    samples = []
    for k in range(4):
        layer = "trainer" if protected else "rest"
        samples.append({
            "t": start + 5 * (k + 1),
            "seconds": 5.0,
            "layers": {
                layer: {"cpu_seconds": 4.0, "wait_seconds": trainer_wait, "timeslices": 1000,
                        "threads": 12},
                "data": {"cpu_seconds": 1.0, "wait_seconds": 0.5, "timeslices": 250},
            },
            "gpu_utilization": gpu,
            "throughput": None if throughput is None else throughput * (0.5 if k == 0 else 1),
        })  # fmt: skip
    return {
        "schema": "hostd.attempt/1",
        "job": job,
        "attempt": name,
        "source": "torchrun",
        "host": "node-7",
        "protected": protected,
        "why": None if protected else "HOSTD_PROTECT=0 in its environment",
        "policy": {"name": "training", "sha256": "0" * 64},
        "mode": "enforce",
        "start": start,
        "end": None if duration is None else start + duration,
        "ranks": 2,
        "gpus": [{"gpu": "0", "UUID": "GPU-0", "device": "nvidia0", "modelName": "H100"}],
        "throughput_unit": None if throughput is None else "steps/s",
        "samples": samples,
        "unknown_field": {"ignored": True},
    }


def arms(protected: list[float], unprotected: list[float], measure: str) -> list[dict]:
    """Attempts alternating protected and unprotected, one every 1000 s; ``measure`` says
    whether the values are throughputs or durations."""
    out = []
    for i, (flag, value) in enumerate(
        [(True, v) for v in protected] + [(False, v) for v in unprotected]
    ):
        kw = {"throughput": value} if measure == "throughput" else {"duration": value}
        out.append(record(f"attempt {i}", flag, start=T0 + 1000 * i, **kw))
    return out


def write(folder: Path, attempts: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(attempts):
        (folder / f"a{i:03d}.json").write_text(json.dumps(a))
    return folder


def expected_ratio(p: list[float], u: list[float], measure: str) -> float:
    mp, mu = statistics.fmean(p), statistics.fmean(u)
    return mp / mu if measure == "throughput" else mu / mp


def covered(p: list[float], u: list[float], measure: str, low: float, high: float) -> float:
    """The share of ratios of attempts resampled here (another generator) within [low, high]:
    about 95 % for a 95 % bootstrap interval."""
    rng = random.Random(99)
    n = 4000
    inside = sum(
        low <= expected_ratio(rng.choices(p, k=len(p)), rng.choices(u, k=len(u)), measure) <= high
        for _ in range(n)
    )
    return inside / n


@pytest.mark.parametrize(
    ("protected", "unprotected", "measure", "finding", "words"),
    [
        pytest.param([13.0, 13.2, 12.9], [10.0, 10.1, 9.9], "throughput", "faster",
                     ["were faster", "3 attempts each", "larger than the noise"], id="clear-win"),
        pytest.param([9.0, 9.1, 8.9, 9.05], [10.0, 10.1, 9.9], "throughput", "slower",
                     ["were slower", "4 protected and 3 unprotected attempts"], id="clear-loss"),
        pytest.param([10.0, 11.0, 9.5], [10.5, 9.8, 10.6], "throughput", "no difference",
                     ["No difference we can tell", "includes 1x", "within the noise"],
                     id="no-difference"),
        pytest.param([250.0, 255.0, 248.0], [300.0, 310.0, 305.0], "duration", "faster",
                     ["were faster", "assuming each attempt did the same work"],
                     id="duration-fallback"),
        pytest.param([12.0], [10.0], "throughput", "too few attempts",
                     ["1 attempt each", "no confidence interval"], id="one-per-arm"),
    ],
)  # fmt: skip
def test_ab(tmp_path, protected, unprotected, measure, finding, words):
    attempts, warnings = load_attempts(write(tmp_path, arms(protected, unprotected, measure)))
    assert not warnings and len(attempts) == len(protected) + len(unprotected)
    c = compare(attempts)
    assert c["measure"]["name"] == measure
    ab = c["ab"]
    ratio = expected_ratio(protected, unprotected, measure)
    assert ab["ratio"] == pytest.approx(ratio)
    assert (ab["n_protected"], ab["n_unprotected"]) == (len(protected), len(unprotected))
    assert ab["finding"] == finding
    if finding == "too few attempts":
        assert ab["low"] is None and ab["high"] is None
    else:
        assert ab["low"] <= ratio <= ab["high"]
        assert (ab["low"] > 1) == (finding == "faster")
        assert (ab["high"] < 1) == (finding == "slower")
        assert (ab["low"] <= 1 <= ab["high"]) == (finding == "no difference")
        assert 0.93 <= covered(protected, unprotected, measure, ab["low"], ab["high"]) <= 0.97
    # the worst protected attempt against the unprotected median, as a speed ratio
    if measure == "throughput":
        worst = min(protected) / statistics.median(unprotected)
    else:
        worst = statistics.median(unprotected) / max(protected)
    assert ab["worst_protected_vs_unprotected_median"] == pytest.approx(worst)
    if finding in ("faster", "slower"):
        assert f"worst protected attempt was {worst:.2f}x" in c["verdict"]
    assert f"{ratio:.2f}x the speed" in c["verdict"]
    for word in words:
        assert word in c["verdict"], c["verdict"]
    # A/A: each arm's spread is its max / min
    for arm, values in zip(c["arms"], (protected, unprotected), strict=True):
        assert arm["n"] == len(values)
        spread = max(values) / min(values) if len(values) >= 2 else None
        assert arm["spread"] == (pytest.approx(spread) if spread else None)
    # the same attempts give the same interval (seeded), another seed another one
    assert compare(attempts)["ab"] == ab
    if ab["low"] is not None:
        lows = {compare(attempts, seed=s, resamples=200)["ab"]["low"] for s in range(5)}
        assert len(lows) > 1


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ([True, True, True], ["No A/B: every attempt was protected", "HOSTD_PROTECT=0",
                              "differed by up to"]),
        ([False, False], ["No A/B: no attempt was protected"]),
        ([None, None], ["none of the 2 attempts says whether hostd protected it"]),
    ],
)  # fmt: skip
def test_one_arm_or_none(flags, words):
    attempts = [
        record(f"a{i}", flag, start=T0 + 100 * i, throughput=10.0 + i)
        for i, flag in enumerate(flags)
    ]
    c = compare(attempts)
    assert c["ab"] is None
    assert len(c["arms"]) == len({f for f in flags if f is not None})
    for word in words:
        assert word in c["verdict"], c["verdict"]


def test_no_measure_at_all():
    attempts = [record("p", True, duration=None), record("u", False, duration=None)]
    c = compare(attempts)
    assert c["measure"]["name"] is None and c["ab"] is None
    assert "Nothing to compare yet" in c["verdict"]


def test_a_running_attempt_is_left_out_of_durations():
    attempts = arms([200.0, 210.0], [250.0, 240.0], "duration")
    attempts.append(record("still running", True, start=T0 + 9000, duration=None))
    c = compare(attempts)
    assert c["measure"]["name"] == "duration"
    assert c["ab"]["n_protected"] == 2
    assert c["ab"]["ratio"] == pytest.approx(expected_ratio([200, 210], [250, 240], "duration"))
    assert "Left out: 1 attempt with no duration yet" in c["verdict"]


def test_no_ab_while_one_arm_is_still_running():
    attempts = [
        record("u0", False, start=T0, duration=300.0),
        record("u1", False, start=T0 + 400, duration=310.0),
        record("p0", True, start=T0 + 800, duration=None),
    ]
    c = compare(attempts)
    assert c["measure"]["name"] == "duration" and c["ab"] is None
    assert c["verdict"].startswith("No A/B yet: no protected attempt has a duration yet")


def test_throughput_needs_every_attempt_to_have_one():
    attempts = arms([12.0, 12.5], [10.0, 10.2], "throughput")
    running = record("starting", False, start=T0 + 9000, duration=None)
    c = compare([*attempts, running])  # has reported nothing yet: not counted
    assert c["measure"]["name"] == "throughput" and c["ab"]["n_unprotected"] == 2
    assert "Left out: 1 attempt with no throughput yet" in c["verdict"]
    attempts.append(record("silent", False, start=T0 + 9000, duration=280.0))
    assert compare(attempts)["measure"]["name"] == "duration"


def test_a_and_a_halves_find_a_drift():
    """Eight unprotected attempts that got faster halfway (something else changed)."""
    values = [10.0, 10.1, 9.9, 10.05, 12.0, 12.1, 11.9, 12.05]
    attempts = [
        record(f"u{i}", False, start=T0 + 100 * i, throughput=v) for i, v in enumerate(values)
    ]
    c = compare(attempts)
    halves = c["arms"][0]["halves"]
    assert halves["ratio"] == pytest.approx(
        statistics.fmean(values[4:]) / statistics.fmean(values[:4])
    )
    assert halves["low"] > 1 and (halves["n_first"], halves["n_second"]) == (4, 4)
    assert "changed over time" in c["verdict"]


def test_summarise():
    a = record("x", True, throughput=None, gpu=0.9, trainer_wait=1.0)
    a["samples"][1]["throughput"] = 10.0
    a["samples"][2]["throughput"] = 12.0
    a["samples"][3]["throughput"] = 11.0
    a["samples"][0]["throughput"] = 1.0  # warm-up: left out with 3 or more
    s = summarise(a)
    assert s["throughput"] == statistics.median([10.0, 12.0, 11.0])
    assert s["duration_s"] == 300.0 and s["gpu_utilization"] == pytest.approx(0.9)
    cpu, wait, slices = 4 * (4.0 + 1.0), 4 * (1.0 + 0.5), 4 * (1000 + 250)
    assert s["wait_share"] == pytest.approx(wait / (cpu + wait))
    assert s["wait_per_timeslice_s"] == pytest.approx(wait / slices)
    trainer = next(ly for ly in s["layers"] if ly["layer"] == "trainer")
    assert trainer["wait_share"] == pytest.approx(1.0 / 5.0)
    assert trainer["wait_per_timeslice_s"] == pytest.approx(1.0 / 1000)
    # two samples with a throughput: both count
    a["samples"] = a["samples"][:2]
    assert summarise(a)["throughput"] == pytest.approx(statistics.median([1.0, 10.0]))


def test_summarise_tolerates_missing_and_null_fields():
    s = summarise({"schema": "hostd.attempt/1", "job": "j", "attempt": "a", "start": None,
                   "samples": [None, {"layers": {"x": None, "y": {"cpu_seconds": "many"}}},
                               {"t": "soon", "throughput": float("nan")}]})  # fmt: skip
    assert s["duration_s"] is None and s["throughput"] is None and s["protected"] is None
    assert s["wait_share"] is None and s["wait_per_timeslice_s"] is None
    assert s["throughput_over_time"] == []


def test_load_attempts_skips_what_it_cannot_read(tmp_path):
    write(tmp_path, [record("good", True, throughput=5.0)])
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something/1", "job": "j"}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nojob.json").write_text(json.dumps({"schema": "hostd.attempt/1"}))
    (tmp_path / "notes.txt").write_text("not a record, not looked at")
    attempts, warnings = load_attempts(tmp_path)
    assert [a["attempt"] for a in attempts] == ["good"]
    assert len(warnings) == 4
    for name in ("broken.json", "other.json", "list.json", "nojob.json"):
        assert sum(name in w for w in warnings) == 1, warnings
    assert load_attempts(tmp_path / "missing") == ([], [])


def test_several_jobs():
    attempts = [
        *arms([12.0, 12.2], [10.0, 10.1], "throughput"),
        record("b0", True, job="bert", start=T0, throughput=3.0),
        record("b1", False, job="bert", start=T0 + 10, throughput=2.0),
    ]
    assert [c["job"] for c in compare_all(attempts)] == ["bert", "trainer-ab"]
    assert compare(attempts, "bert")["ab"]["ratio"] == pytest.approx(1.5)
    with pytest.raises(ReportError, match="name one"):
        compare(attempts)
    with pytest.raises(ReportError, match='did you mean "trainer-ab"'):
        compare_all(attempts, "trainer-abc")


@pytest.fixture(scope="module")
def page_inputs() -> tuple[list[dict], list[dict]]:
    attempts = arms([13.0, 13.2, 12.9], [10.0, 10.1, 9.9], "throughput")
    for a in attempts:
        for s in a["samples"]:
            s["gpu_utilization"] = 0.9 if a["protected"] else 0.7
    return compare_all(attempts), [summarise(a) for a in attempts]


def test_render_html_is_self_contained(page_inputs):
    comparisons, summaries = page_inputs
    page = render_html(comparisons, summaries)
    assert html.escape(comparisons[0]["verdict"]) in page
    assert page.index(html.escape(comparisons[0]["verdict"])) < page.index("<table>")
    assert page.count('src="data:image/png;base64,') >= 2
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page
    assert all(s["attempt"] in page for s in summaries)


def test_render_html_escapes_and_copes_with_one_arm():
    attempts = [record("<b>x</b>", True, job="<script>", throughput=4.0)]
    page = render_html(compare_all(attempts), [summarise(a) for a in attempts])
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;" in page


@pytest.mark.parametrize("measure", ["throughput", "duration"])
def test_the_attempts_table_has_distinct_headings(measure):
    """Issue 45.3: with duration as the measure, two columns were headed "duration" (the time
    each attempt ran, and the measure compared). Every heading names one column."""
    attempts = arms([13.0, 13.2], [10.0, 10.1], measure)
    page = render_html(compare_all(attempts), [summarise(a) for a in attempts])
    table = page[page.index("<table>") : page.index("</table>")]
    headings = re.findall(r"<th[^>]*>(.*?)</th>", table)
    assert measure in headings and "ran for" in headings
    assert len(headings) == len(set(headings)) == 10, headings


def test_a_name_in_tex_is_text():
    """Issue 44.7: a job named "$\\foo$" made matplotlib's mathtext raise in a plot title, so
    `hostd report` wrote nothing for any job. Names are text."""
    attempts = arms([13.0, 13.2], [10.0, 10.1], "throughput")
    for a in attempts:
        a["job"] = "$\\foo$ ^_{x}"
    page = render_html(compare_all(attempts), [summarise(a) for a in attempts])
    assert html.escape("$\\foo$ ^_{x}") in page and page.count("data:image/png") >= 2


def test_save_figure(tmp_path, page_inputs):
    comparisons, summaries = page_inputs
    for which in ("measure", "wait", "gpu", "throughput"):
        path = tmp_path / f"{which}.png"
        save_figure(comparisons[0], path, which, summaries=summaries)
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ReportError, match="no figure"):
        save_figure(comparisons[0], tmp_path / "x.png", "pie")


@pytest.mark.parametrize("measure", ["throughput", "duration"])
def test_the_plots_scale_their_axes_from_zero(measure):
    """Issue 46: a 0.5 % difference between the arms filled the whole y-axis (matplotlib spans
    only the data's range). Each plot's y-axis starts at zero, with a margin above the largest
    value, so the difference looks as large as it is."""
    from hostd.report.plots import (
        _figure_class,
        _plot_gpu,
        _plot_measure,
        _plot_over_time,
        _plot_wait,
    )

    attempts = arms([100.0, 100.5, 100.2], [99.7, 100.1, 99.9], measure)
    for a in attempts:
        for s in a["samples"]:
            s["gpu_utilization"] = 0.9 if a["protected"] else 0.89
    comparison = compare_all(attempts)[0]
    Figure = _figure_class()
    (ax,) = _plot_measure(Figure, comparison).axes
    low, high = ax.get_ylim()
    assert low == 0.0
    assert 100.5 < high <= 100.5 * 1.3  # a margin above the largest, not a sea of space
    summaries = [summarise(a) for a in attempts]
    if measure == "throughput":
        (ax,) = _plot_over_time(Figure, summaries).axes
        assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] > 100.5
    (ax,) = _plot_gpu(Figure, comparison).axes
    assert ax.get_ylim() == (0.0, 105.0)
    for ax in _plot_wait(Figure, comparison).axes:
        assert ax.get_ylim()[0] == 0.0


def test_without_matplotlib(monkeypatch, page_inputs):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ReportError, match=re.escape("pip install 'hostd[report]'")):
        render_html(*page_inputs)


# --- the command ------------------------------------------------------------------------------


def hostd(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def test_cli_json_matches_its_schema(tmp_path):
    folder = write(tmp_path / "attempts", arms([13.0, 13.2], [10.0, 10.1], "throughput"))
    (folder / "broken.json").write_text("{")
    result = hostd("report", "--dir", str(folder), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert doc["schema"] == schema["properties"]["schema"]["const"]
    assert [c["job"] for c in doc["comparisons"]] == ["trainer-ab"]
    assert len(doc["attempts"]) == 4
    assert "broken.json" in result.stderr and "warning" in result.stderr
    assert not list(tmp_path.glob("*.html"))


def test_cli_writes_the_page_and_says_the_verdict(tmp_path, monkeypatch):
    state = tmp_path / "state"
    write(state / "attempts", arms([13.0, 13.2], [10.0, 10.1], "throughput"))
    monkeypatch.setenv("HOSTD_STATE_DIR", str(state))
    out = tmp_path / "r.html"
    result = hostd("report", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}: Protected attempts")
    assert "data:image/png;base64," in out.read_text()


def test_cli_unknown_job_is_bad_input(tmp_path):
    folder = write(tmp_path, arms([13.0], [10.0], "throughput"))
    result = hostd("report", "--dir", str(folder), "--job", "trainer-ba", "--json")
    assert result.exit_code == 2
    assert 'did you mean "trainer-ab"' in result.stderr


def test_cli_no_attempts(tmp_path):
    result = hostd("report", "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert str(tmp_path / "attempts") in result.stderr and "A/B rollout" in result.stderr


def test_users_of_one_job_name_are_set_apart(tmp_path):
    """A job name is its user's to write: records of one name but two users are two jobs."""
    for name, uid in (("a1", 1000), ("a2", 1000), ("b1", 2000)):
        rec = record(name, True, throughput=10.0)
        rec["uid"] = uid
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    attempts, warnings = load_attempts(tmp_path)
    assert not warnings
    assert sorted({a["job"] for a in attempts}) == [
        "trainer-ab (uid 1000)", "trainer-ab (uid 2000)",
    ]  # fmt: skip
    same = tmp_path / "same"
    same.mkdir()
    for name in ("a1", "a2"):
        (same / f"{name}.json").write_text(json.dumps({**record(name, True), "uid": 1000}))
    assert {a["job"] for a in load_attempts(same)[0]} == {"trainer-ab"}  # one user: as named

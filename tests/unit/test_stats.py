"""``hostd.stats``: the schedstat parser, per-layer deltas over fixture samples, the readers
through ``Host`` on a fixture tree, and ``measure`` end to end on a captured host."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hostd.classify import Classified
from hostd.host import Host
from hostd.host.parsers import Schedstat, parse_schedstat
from hostd.policy import load_default
from hostd.stats import (
    Counters,
    StatsError,
    Unavailable,
    compare,
    measure,
    rates,
    read_counters,
    sample,
)
from tests.synth import process, thread

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
MS = 1_000_000  # ns

# Two trainer threads and one data thread; a comms layer with nobody in it.
RANK = process(100, "python3")
LOADER = process(200, "pt_data_worker")
T1, T2, W = thread(RANK, tid=100), thread(RANK, "pt_nccl", tid=101), thread(LOADER)
CLASSIFIED = [Classified(T1, "trainer", 0), Classified(T2, "trainer", 1), Classified(W, "data", 0)]
LAYERS = ["trainer", "comms", "data", "rest"]

BEFORE = {
    T1.key: Counters(1000 * MS, 10 * MS, 100, 50, 5),
    T2.key: Counters(0, 0, 0, 0, 0),
    W.key: Counters(5 * MS, 1 * MS, 7, 3, 1),
}
AFTER = {
    # 2 s later: T1 ran 1.5 s and waited 300 ms over 60 slices; T2 ran 0.5 s, waited 100 ms.
    T1.key: Counters(2500 * MS, 310 * MS, 160, 70, 45),
    T2.key: Counters(500 * MS, 100 * MS, 40, 10, 15),
    W.key: Counters(5 * MS, 1 * MS, 7, 3, 1),  # slept throughout
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("48402296 653195188 114\n", Schedstat(48402296, 653195188, 114)),
        ("0 0 0", Schedstat(0, 0, 0)),
        ("1 2 3 4\n", Schedstat(1, 2, 3)),  # a field added by a later kernel is ignored
    ],
)
def test_parse_schedstat(text, expected):
    assert parse_schedstat(text) == expected


@pytest.mark.parametrize("bad", ["", "\n", "1 2\n", "a b c\n", "1 -2 3\n", "1 2 3.5\n"])
def test_parse_schedstat_refuses_a_malformed_line(bad):
    with pytest.raises(ValueError, match="schedstat"):
        parse_schedstat(bad)


def test_per_layer_deltas_and_rates_are_exact():
    stats = compare(BEFORE, AFTER, CLASSIFIED, 2.0, layers=LAYERS)
    assert (stats.interval, stats.threads, stats.vanished, stats.appeared) == (2.0, 3, 0, 0)
    layers = {ly.layer: ly for ly in stats.layers}
    assert [ly.layer for ly in stats.layers] == LAYERS  # policy order, empty layers too
    trainer = layers["trainer"]
    assert trainer.threads == 2
    assert trainer.delta == Counters(2000 * MS, 400 * MS, 100, 30, 55)
    r = trainer.rates
    assert r.cpu == pytest.approx(1.0)  # 2 s of CPU in 2 s
    assert r.wait == pytest.approx(0.2)
    assert r.wait_share == pytest.approx(400 / 2400)
    assert r.wait_per_slice_ms == pytest.approx(4.0)  # 400 ms over 100 slices
    assert r.involuntary_per_s == pytest.approx(27.5)
    assert r.voluntary_per_s == pytest.approx(15.0)
    data = layers["data"]
    assert data.threads == 1 and data.delta == Counters()
    assert (data.rates.cpu, data.rates.wait_share, data.rates.wait_per_slice_ms) == (0, 0, 0)
    assert layers["comms"].threads == 0 and layers["rest"].delta == Counters()


def test_top_threads_by_wait_skip_threads_that_did_not_wait():
    stats = compare(BEFORE, AFTER, CLASSIFIED, 2.0, layers=LAYERS)
    assert [(t.tid, t.comm, t.pid, t.layer) for t in stats.top] == [
        (100, "python3", 100, "trainer"),
        (101, "pt_nccl", 100, "trainer"),
    ]
    assert stats.top[0].rates.wait == pytest.approx(0.15)  # 150 ms/s
    assert stats.top[1].rates.involuntary_per_s == pytest.approx(7.5)
    assert [t.tid for t in compare(BEFORE, AFTER, CLASSIFIED, 2.0, top=1).top] == [100]
    assert compare(BEFORE, AFTER, CLASSIFIED, 2.0, top=0).top == ()


def test_threads_that_appear_vanish_or_reuse_a_tid_are_not_counted():
    born = thread(RANK, "pt_new", tid=102)
    reused = Counters(1, 1, 1, 1, 1)
    before = {**BEFORE, (777, 1): Counters(9 * MS, 9 * MS, 9, 9, 9)}  # exits meanwhile
    after = {
        **AFTER,
        born.key: Counters(900 * MS, 900 * MS, 9, 9, 9),  # started meanwhile
        (777, 2): reused,  # tid 777 handed to a new thread: another start time
    }
    del after[T2.key]  # T2 exits meanwhile
    classified = [*CLASSIFIED, Classified(born, "trainer", 0)]
    stats = compare(before, after, classified, 2.0, layers=LAYERS)
    assert (stats.threads, stats.vanished, stats.appeared) == (2, 2, 2)
    trainer = next(ly for ly in stats.layers if ly.layer == "trainer")
    assert trainer.threads == 1
    assert trainer.delta == AFTER[T1.key] - BEFORE[T1.key]


def test_default_layer_order_is_that_of_the_classification():
    stats = compare(BEFORE, AFTER, CLASSIFIED, 2.0)
    assert [ly.layer for ly in stats.layers] == ["trainer", "data"]


@pytest.mark.parametrize("interval", [0, 0.0, -1.0])
def test_a_zero_or_negative_interval_is_refused_not_divided_by(interval):
    with pytest.raises(StatsError, match="positive"):
        compare(BEFORE, AFTER, CLASSIFIED, interval)
    with pytest.raises(StatsError, match="positive"):
        rates(Counters(1, 1, 1, 1, 1), interval)


def test_counters_subtract_and_add_field_by_field():
    a, b = Counters(10, 20, 30, 40, 50), Counters(1, 2, 3, 4, 5)
    assert a - b == Counters(9, 18, 27, 36, 45)
    assert (a - b) + b == a


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


STAT = "{tid} (python3) S 1 {tid} 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 2 0 {start} 0 0"
STATUS = "Name:\tpython3\nvoluntary_ctxt_switches:\t{v}\nnonvoluntary_ctxt_switches:\t{n}\n"


def test_readers_go_through_host_and_skip_gone_or_malformed_threads(tmp_path):
    for tid, sched in ((100, "30 20 10\n"), (101, "garbage\n")):
        base = f"proc/100/task/{tid}/"
        _write(tmp_path, base + "stat", STAT.format(tid=tid, start=5000 + tid))
        _write(tmp_path, base + "schedstat", sched)
        _write(tmp_path, base + "status", STATUS.format(v=7, n=9))
    host = Host(tmp_path)
    assert read_counters(host, 100, 100) == ((100, 5100), Counters(30, 20, 10, 7, 9))
    assert read_counters(host, 100, 101) is None  # malformed schedstat
    assert read_counters(host, 100, 102) is None  # gone
    gone = thread(RANK, tid=102)
    assert sample(host, [T1, T2, gone]) == {(100, 5100): Counters(30, 20, 10, 7, 9)}


def _with_schedstat(tmp_path: Path, text: str) -> Host:
    """A copy of the captured CI host with a schedstat file in every thread's folder."""
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "ci-vm", root, symlinks=True)
    for stat in root.glob("proc/*/task/*/stat"):
        stat.with_name("schedstat").write_text(text)
    return Host(root)


def test_measure_on_a_captured_host_sees_no_change(tmp_path):
    host = _with_schedstat(tmp_path, "1000 500 3\n")
    stats = measure(host, load_default(), 0.01, top=5)
    assert stats.threads > 0 and stats.interval >= 0.01
    assert sum(ly.threads for ly in stats.layers) == stats.threads
    assert all(ly.delta == Counters() for ly in stats.layers)
    assert stats.top == ()  # nobody waited in between


def test_measure_says_when_the_kernel_keeps_no_schedstat(tmp_path):
    with pytest.raises(Unavailable, match="no thread's schedstat could be read"):
        measure(Host(FIXTURES / "ci-vm"), load_default(), 0.01)
    with pytest.raises(Unavailable, match="reads 0"):
        measure(_with_schedstat(tmp_path, "0 0 0\n"), load_default(), 0.01)


def test_measure_refuses_bad_input_before_reading_anything():
    host = Host(FIXTURES / "ci-vm")
    with pytest.raises(StatsError, match="positive"):
        measure(host, load_default(), -1)
    with pytest.raises(StatsError, match="process 999999: no such process"):
        measure(host, load_default(), 1, scope=[999999])

"""``hostd top``'s screen without a terminal: marks from the agent's status, the keys, and a
screen that fits the terminal it is drawn for."""

from __future__ import annotations

import io

from rich.console import Console

from hostd.cli.topview import View, marks, render
from hostd.stats import Counters, LayerStats, Stats, ThreadStats, rates

LAYERS = ["comms", "data", "trainer", "rest"]


def _thread(tid: int, layer: str, wait_ns: int, run_ns: int) -> ThreadStats:
    delta = Counters(
        run_ns=run_ns, wait_ns=wait_ns, timeslices=10, voluntary=1, involuntary=tid % 7
    )
    return ThreadStats(tid, tid, f"thread-with-a-long-name-{tid}", layer, delta, rates(delta, 1.0))


def _stats(threads: list[ThreadStats]) -> Stats:
    layers = tuple(LayerStats(n, sum(t.layer == n for t in threads), Counters(),
                              rates(Counters(), 1.0)) for n in LAYERS)  # fmt: skip
    return Stats(1.0, len(threads), 0, 0, layers, tuple(threads))


def _drawn(renderable, width: int, height: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, height=height, color_system=None)
    console.print(renderable)
    return console.file.getvalue().splitlines()


def test_marks_say_demoted_sessions_and_recent_boosts():
    agent = {"preempt": {"demoted": [{"session": 50}], "recent": [
        {"what": "boost", "tid": 7, "time": 1000.0}, {"what": "boost", "tid": 8, "time": 900.0},
        {"what": "demote", "session": 50, "time": 999.0}]}}  # fmt: skip
    found = marks(agent, {5: 50, 6: 50, 7: 70, 8: 80, 9: 90}, now=1005.0)
    assert found == {5: "D", 6: "D", 7: "B"}  # 8's boost is 105 s old
    assert marks({}, {5: 50}) == {}


def test_the_screen_fits_80x24_and_the_keys_change_it():
    threads = [_thread(t, LAYERS[t % 4], wait_ns=t * 1000, run_ns=(100 - t) * 10_000)
               for t in range(1, 60)]  # fmt: skip
    view = View(list(LAYERS))
    lines = _drawn(render(view, _stats(threads), threads, {3: "D", 59: "B"}, title="hostd top",
                          size=(80, 24)), 80, 24)  # fmt: skip
    assert len(lines) <= 24 and max(map(len, lines)) <= 80
    rows = [ln for ln in lines if (ln.split() and ln.split()[0] in ("B", "D")) or
            (ln.split() and ln.split()[0].isdigit())]  # fmt: skip
    assert rows[0].split()[:2] == ["B", "59"]  # the most waiting first, marked B
    assert view.key("s") and view.said == "sorted by CPU"
    lines = _drawn(render(view, _stats(threads), threads, {3: "D"}, title="t", size=(80, 24)),
                   80, 24)  # fmt: skip
    first = next(ln for ln in lines if ln.strip().startswith(("1 ", "D")))
    assert first.split()[0] == "1"  # the most CPU: thread 1
    assert view.key("l") and view.layer == "comms"
    assert view.key("m") and view.marked_only
    lines = _drawn(render(view, _stats(threads), threads, {3: "D", 4: "D"}, title="t",
                          size=(80, 24)), 80, 24)  # fmt: skip
    listed = [ln.split()[1] for ln in lines if ln.split()[:1] == ["D"]]
    assert listed == ["4"]  # layer comms (4 % 4 == 0) and marked: only 4
    assert view.key("h") and view.help
    assert any("Marks: D" in ln for ln in _drawn(render(view, _stats([]), [], {}, title="t",
                                                         size=(80, 24)), 80, 24))  # fmt: skip
    assert not view.key("q")

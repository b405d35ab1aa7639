"""A full pass's desired state in pieces (``hostd.reconcile.desired_pieces``): together the
pieces are ``desired_state``, each knob once; hostd's cgroups come first, the threads then come
by whole processes, each piece naming its threads and holding only their knobs and their
processes' memory placement, and the IRQ and cpufreq knobs come last. Checked on every fixture
host with data, both shipped policies and pieces of 1, 3 and 10,000 threads. The pieces'
reports fold into one (``PassReport.fold``) that counts every outcome and keeps what went
wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostd import knobs
from hostd.host import Host
from hostd.policy import load_checked
from hostd.reconcile import HOST_PREFIXES, PassReport, Result, desired_pieces, desired_state
from hostd.snapshot import take

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
HOSTS = ["amd-mi300x", "dgx-h100", "gaudi2", "trn1"]
POLICIES = [None, str(Path(__file__).resolve().parents[2] / "policies" / "inference.toml")]


@pytest.mark.parametrize("size", [1, 3, 10_000])
@pytest.mark.parametrize("policy", POLICIES, ids=["default", "inference"])
@pytest.mark.parametrize("name", HOSTS)
def test_the_pieces_are_the_desired_state_in_order(name, policy, size):
    snap = take(Host(FIXTURES / name), load_checked(policy, False), allow_rt=True)
    plan = snap.plan()
    assert plan.tasks, "nothing planned: nothing to cut"
    pieces = list(desired_pieces(plan, snap.tasks, size))
    first, threads, last = pieces[0], pieces[1:-1], pieces[-1]

    together: dict[str, object] = {}
    for want, _ in pieces:
        assert not set(want) & set(together), "a knob in two pieces"
        together.update(want)
    assert together == desired_state(plan, snap.tasks)

    assert first[1] == [] and not any(knobs.is_task_key(k) for k in first[0])
    assert not any(k.startswith(HOST_PREFIXES) for k in first[0])
    assert last[1] is None and all(k.startswith(HOST_PREFIXES) for k in last[0])

    named = [ident for _, only in threads for ident in only]
    assert sorted(named) == sorted(t.key for t in snap.tasks)  # each thread in one piece
    pid_of = {t.key: t.pid for t in snap.tasks}
    biggest = max(sum(1 for t in snap.tasks if t.pid == p) for p in set(pid_of.values()))
    seen_pids: set[int] = set()
    for n, (want, only) in enumerate(threads):
        pids = {pid_of[ident] for ident in only}
        assert not pids & seen_pids, "a process cut in two"
        seen_pids |= pids
        assert len(only) < size + biggest
        assert len(only) >= size or n == len(threads) - 1
        for key in want:
            assert knobs.is_task_key(key) and knobs.parse_task_key(key) in set(only), key
    numa = [k for want, _ in threads for k in want if k.endswith("/numa")]
    assert len(numa) == len(plan.numa)  # with their processes' threads, not after them all


def test_a_folded_report_counts_every_outcome_and_keeps_what_went_wrong():
    parts = [
        PassReport([Result("a", "applied"), Result("b", "error", None, "EIO")]),
        PassReport([Result("c", "skipped"), Result("d", "gone"), Result("e", "restored")]),
        PassReport([Result("f", "applied"), Result("g", "not-permitted"), Result("h", "left")]),
    ]
    report = PassReport()
    for part in parts:
        report.fold(part)
    every = [r for part in parts for r in part.results]
    assert report.counts == PassReport(every).counts
    assert [r.key for r in report.results] == ["b", "g", "h"]
    again = PassReport()
    again.fold(report)  # a folded report folds on with its counts
    assert again.counts == report.counts

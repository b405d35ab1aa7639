"""cpufreq and IRQ knobs against a copy of a captured-style fixture tree (this machine has no
cpufreq): apply through the journal, check the files, restore, and compare byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostd.host import Host
from hostd.journal import Journal
from hostd.policy import parse_policy
from hostd.reconcile import Observed, desired_state, reconcile, restore
from hostd.snapshot import take
from tests.fakes import FakeCalls, host_copy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "dgx-h100"
POLICY = b"""
version = 1
[[layer]]
name = "trainer"
comment = "ranks"
match = [[{ gpu = true }]]
kind = "grouped"
cpus = { max = 8 }
sched = { policy = "fifo", priority = 10 }
governor = "performance"
min_freq = "max"
epp = "performance"
irqs = "avoid"

[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for sub in ("sys/devices/system/cpu", "proc/irq"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture
def tree(tmp_path):
    return host_copy(tmp_path)


def _host_knobs(tree: Path):
    host = Host(tree)
    snap = take(host, parse_policy(POLICY, "test.toml"))
    plan = snap.plan()
    want = {
        k: v
        for k, v in desired_state(plan, snap.tasks).items()
        if not k.startswith(("task/", "cgroup/"))  # cgroupfs is not in the fixture tree
    }
    return host, plan, want, Observed(snap.tasks)


def test_governor_floor_epp_and_irqs_apply_and_restore(tree, tmp_path):
    before = _files(tree)
    host, plan, want, seen = _host_knobs(tree)
    trainer = plan.layer("trainer").cpus
    assert trainer and plan.cpufreq and plan.irqs
    journal = Journal(tmp_path / "state", "boot")
    report = reconcile(host, journal, want, seen, live_keys=set(), unchangeable=set())
    assert report.counts.get("applied", 0) > 0
    assert set(report.counts) <= {"applied", "skipped"}, report.counts
    cpu = min(trainer)
    base = tree / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
    assert (base / "scaling_governor").read_text() == "performance\n"
    assert (base / "scaling_min_freq").read_text() == (base / "cpuinfo_max_freq").read_text()
    assert (base / "energy_performance_preference").read_text() == "performance\n"
    outside = min(set(range(64)) - set(trainer))
    assert (
        tree / f"sys/devices/system/cpu/cpu{outside}/cpufreq/scaling_governor"
    ).read_text().strip() == "powersave"
    for ip in plan.irqs:
        text = (tree / f"proc/irq/{ip.irq}/smp_affinity_list").read_text()
        assert not set(_cpus(text)) & trainer
    # A second pass finds everything in place and writes nothing.
    again = reconcile(host, journal, want, seen, live_keys=set(), unchangeable=set())
    assert "applied" not in again.counts
    restored = restore(host, journal)
    assert set(restored.counts) == {"restored"}
    assert _files(tree) == before
    assert not (tmp_path / "state" / "journal.jsonl").exists()


def test_observe_mode_writes_nothing(tree):
    before = _files(tree)
    host, _, want, seen = _host_knobs(tree)
    report = reconcile(host, None, want, seen, live_keys=set(), unchangeable=set())
    assert report.counts.get("would-apply", 0) > 0
    assert _files(tree) == before


def test_a_refused_knob_is_remembered_and_not_retried(tree, tmp_path):
    host, _, want, seen = _host_knobs(tree)
    key = next(k for k in want if k.startswith("irq/"))
    path = tree / f"proc/irq/{key.split('/')[1]}/smp_affinity_list"
    path.unlink()
    path.mkdir()  # writing a directory fails with EISDIR: an unexpected refusal, reported
    unchangeable: set[str] = set()
    journal = Journal(tmp_path / "s", "b")
    report = reconcile(host, journal, want, seen, live_keys=set(), unchangeable=unchangeable)
    outcome = {r.key: r.outcome for r in report.results}
    assert outcome[key] in ("error", "unchangeable", "gone")
    assert outcome[next(k for k in want if k.startswith("cpu/"))] == "applied"


def _cpus(text: str) -> set[int]:
    from hostd.model.cpus import parse_cpulist

    return set(parse_cpulist(text))


def test_observed_answers_from_the_snapshot_only_for_the_same_thread():
    from hostd.knobs import task_key
    from tests import synth

    proc = synth.process(40)
    t = synth.thread(proc, tid=41, nice=-3, policy=1, affinity=frozenset({0, 1, 2, 5}))
    seen = Observed([t])
    assert seen.get(task_key(41, t.start_time, "affinity")) == "0-2,5"
    assert seen.get(task_key(41, t.start_time, "nice")) == -3
    assert seen.get(task_key(41, t.start_time, "sched")) == ["fifo", 0, None]
    # What the snapshot cannot say: another thread that reused the tid, an unknown thread, a
    # knob /proc/PID/stat does not show, a host knob.
    missing = object()
    for key in (
        task_key(41, t.start_time + 1, "nice"),
        task_key(42, t.start_time, "nice"),
        task_key(41, t.start_time, "cpuset"),
        "irq/9/smp_affinity_list",
    ):
        assert seen.get(key, missing) is missing, key


def test_a_full_state_disk_writes_no_knob_and_says_so(tree, tmp_path, monkeypatch):
    """Write-ahead: with no durable record of its original, a knob is not written, on this
    pass or the next; once the disk has room again the same pass applies everything."""
    import errno
    import os

    before = _files(tree)
    host, _, want, seen = _host_knobs(tree)
    journal = Journal(tmp_path / "state", "boot")

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    for _ in range(2):  # the second pass must not take the first one's failed keys as recorded
        report = reconcile(host, journal, want, seen, live_keys=set(), unchangeable=set())
        assert set(report.counts) <= {"unjournaled", "skipped"}, report.counts
        assert report.counts["unjournaled"] > 0
        assert "No space left" in next(r.detail for r in report.results if r.detail)
        assert _files(tree) == before and len(journal) == 0
    monkeypatch.undo()
    report = reconcile(host, journal, want, seen, live_keys=set(), unchangeable=set())
    assert report.counts.get("applied", 0) > 0 and "unjournaled" not in report.counts
    restore(host, journal)
    assert _files(tree) == before


def test_a_pass_writes_in_apply_order_whatever_the_order_it_is_given(tree, tmp_path):
    """``Spec.apply_order``: a thread's policy before its nice, its affinity before both, the
    IRQs after the threads, however ``want`` lists them (a dict in the planner's order)."""
    calls = FakeCalls(tree)
    host = Host(tree, calls=calls)
    task = next(t for t in take(host, parse_policy(POLICY, "test.toml")).tasks if t.pid != t.tid)
    irq = next(k for k in _host_knobs(tree)[2] if k.startswith("irq/"))
    key = f"task/{task.tid}@{task.start_time}/"
    want = {
        irq: "0",
        key + "nice": -3 if task.nice != -3 else -4,
        key + "sched": ["batch", 0, False],
        key + "affinity": "0" if task.affinity != frozenset({0}) else "1",
    }
    journal = Journal(tmp_path / "j", "b")
    report = reconcile(host, journal, want, Observed([task]), unchangeable=set())
    applied = [r.key for r in report.results if r.outcome == "applied"]
    assert applied == [key + "affinity", key + "sched", key + "nice", irq]
    assert [w[0] for w in calls.writes] == ["affinity", "sched", "nice"]


def test_records_that_say_the_same_share_one_inherit_dict(tree, tmp_path):
    """Threads of one session given the same value (a storm's twins, a re-layer's pool) share
    one inherit dict in memory (one each was 20 MB at 100,000 threads), on record and on load;
    a thread given another value has its own."""
    host = Host(tree, calls=FakeCalls(tree))
    tasks = take(host, parse_policy(POLICY, "test.toml")).tasks
    sessions: dict[int, list] = {}
    for t in tasks:
        sessions.setdefault(t.process.session, []).append(t)
    a, b, c = next(ts for ts in sessions.values() if len(ts) >= 3)[:3]
    keys = [f"task/{t.tid}@{t.start_time}/nice" for t in (a, b, c)]
    want = dict(zip(keys, (7, 7, 8), strict=True))
    journal = Journal(tmp_path / "j", "b")
    reconcile(host, journal, want, Observed([a, b, c]), unchangeable=set())

    for j in (journal, Journal(tmp_path / "j", "b")):
        ha, hb, hc = (j.records[k].inherit for k in keys)
        assert ha is hb and ha == {"to": 7, "sid": a.process.session, "tick": ha["tick"]}
        assert hc is not ha and hc == {**ha, "to": 8}


def test_a_restore_leaves_what_someone_else_changed_since(tree, tmp_path):
    """Issue 44.4: an IRQ's affinity set by hand after hostd set it is left as it is ("left"),
    after a crash too (the journal read again from its file); one hostd changed twice is put
    back, as are the others and the governors (which the kernel may change by itself)."""
    before = _files(tree)
    host, _, want, seen = _host_knobs(tree)
    journal = Journal(tmp_path / "state", "boot")
    reconcile(host, journal, want, seen, live_keys=set(), unchangeable=set())
    irqs = sorted(k for k in want if k.startswith("irq/"))
    by_hand, twice = irqs[0], irqs[1]
    original = journal.original(by_hand)
    again = {**want, twice: "3"}
    assert want[twice] != "3" and journal.original(twice) != "3"
    report = reconcile(host, journal, again, Observed(()), live_keys=set(), unchangeable=set())
    assert {r.key: r.outcome for r in report.results}[twice] == "applied"
    hand = "7" if "7" not in (want[by_hand], original) else "9"
    path = tree / f"proc/irq/{by_hand.split('/')[1]}/smp_affinity_list"
    path.write_text(hand + "\n")  # an admin, since
    crashed = Journal(tmp_path / "state", "boot")  # after a kill -9: what the file says
    assert crashed.records[twice].wrote == (want[twice], "3")
    report = restore(host, crashed)
    outcome = {r.key: r.outcome for r in report.results}
    assert outcome.pop(by_hand) == "left"
    assert set(outcome.values()) == {"restored"}, outcome
    assert path.read_text() == hand + "\n"
    after = _files(tree)
    changed = {name for name in before if after[name] != before[name]}
    assert changed == {str(path.relative_to(tree))}
    assert not crashed.records  # the left knob's record is closed: hostd is done with it

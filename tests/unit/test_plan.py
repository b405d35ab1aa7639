"""Table-driven tests of the pure planner over synthetic topologies (tests/synth.py)."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostd.agent.incremental import Incremental
from hostd.classify import Classifier
from hostd.model.topology import CgroupLayout
from hostd.plan import TaskPlanner, plan
from hostd.policy import parse_policy
from hostd.reconcile import desired_state
from tests import synth

TRAINING = b"""
version = 1
[[layer]]
name = "trainer"
comment = "ranks"
match = [[{ gpu = true }], [{ parent_comm_prefix = "pt_elastic" }, { uid = 0 }]]
kind = "grouped"
cpus = { min = 2, max = "50%" }
sched = { policy = "fifo", priority = 10 }
numa = "gpu-local"
governor = "performance"
irqs = "avoid"

[[layer]]
name = "data"
comment = "loaders"
match = [[{ comm_prefix = "pt_data_worker" }]]
kind = "confined"
cpus = { min = 1, max = 4 }
sched = { policy = "other", nice = -5 }

[[layer]]
name = "rest"
comment = "all else"
match = [[]]
"""


def run(topo, tasks, policy_bytes=TRAINING, **kw):
    policy = parse_policy(policy_bytes, "test.toml")
    classified = Classifier(policy).classify_all(tasks)
    return plan(topo, classified, policy, **kw)


def job(topo, ranks=((0, "/dev/nvidia0"), (1, "/dev/nvidia4")), threads_per_rank=20):
    online = topo.online
    launcher = synth.process(100, "pt_elastic")
    tasks = synth.threads(launcher, 2, online=online)
    for i, (_, dev) in enumerate(ranks):
        rank = synth.process(
            200 + i,
            parent_comm="pt_elastic",
            gpu_devices=("/dev/nvidia-uvm", "/dev/nvidiactl", dev),
            ppid=100,
        )
        tasks += synth.threads(rank, threads_per_rank, online=online)
        worker = synth.process(300 + i, "pt_data_worker", parent_comm="python3", ppid=200 + i)
        tasks += synth.threads(worker, 2, online=online)
    other = synth.process(400, "stress-ng")
    tasks += synth.threads(other, 4, online=online)
    return tasks


def test_trainer_gets_gpu_local_whole_cores_on_both_nodes():
    topo = synth.topology("2x8x2", gpus=8, cpufreq=True)
    p = run(topo, job(topo))
    trainer = p.layer("trainer")
    # 50% of 32 CPUs, whole cores (both siblings), split over the two GPU nodes by rank count.
    assert len(trainer.cpus) == 16
    for cpu in trainer.cpus:
        assert topo.cpus[cpu].siblings <= trainer.cpus
    assert {topo.cpus[c].node for c in trainer.cpus} == {0, 1}
    assert trainer.mems == frozenset({0, 1})
    # Each rank is narrowed to its GPU's node; its threads are FIFO 10.
    by_pid = {}
    for tp in p.tasks:
        by_pid.setdefault(tp.pid, []).append(tp)
    for pid, node in ((200, 0), (201, 1)):
        for tp in by_pid[pid]:
            assert tp.layer == "trainer"
            assert tp.policy == "fifo" and tp.priority == 10 and tp.reset_on_fork
            assert tp.affinity <= topo.nodes[node].cpus
            assert tp.node == node
    assert [(n.pid, n.node) for n in p.numa] == [(200, 0), (201, 1)]
    # The pool keeps CPU 0 and the data layer's CPUs are its own.
    assert 0 in p.pool
    data = p.layer("data")
    assert data.cpus and not data.cpus & trainer.cpus and not data.cpus & p.pool
    # Governor on the trainer's CPUs only.
    assert {c.cpu for c in p.cpufreq} == set(trainer.cpus)
    assert {c.governor for c in p.cpufreq} == {"performance"}


def test_grouped_and_confined_and_open_affinity():
    topo = synth.topology("1x8x1")
    p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)))
    trainer, data = p.layer("trainer"), p.layer("data")
    for tp in p.tasks:
        if tp.layer == "trainer":  # grouped: own CPUs plus the pool
            assert tp.affinity == trainer.cpus | p.pool
        elif tp.layer == "data":  # confined: own CPUs only
            assert tp.affinity == data.cpus
        elif tp.affinity is not None:  # open: the pool
            assert tp.affinity == p.pool


def test_catch_all_always_keeps_a_cpu():
    greedy = TRAINING.replace(b'max = "50%"', b'max = "100%"').replace(b"min = 2", b"min = 64")
    for shape in ("1x1x1", "1x2x1", "1x1x2", "2x2x2"):
        topo = synth.topology(shape, gpus=1)
        p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)), greedy)
        assert p.pool, shape
        assert all(tp.affinity is None or tp.affinity for tp in p.tasks)


def test_layer_without_cpu_says_so_and_uses_pool():
    topo = synth.topology("1x1x1", gpus=1)
    p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)))
    trainer = p.layer("trainer")
    assert not trainer.cpus
    assert any("no CPU of its own" in n for n in trainer.notes)
    assert all(tp.affinity is None for tp in p.tasks if tp.layer == "trainer")


def test_the_pool_keeps_a_quarter_of_the_cpus_and_at_least_two():
    # On 2 CPUs a grouped trainer gets none of its own: it, the data workers and the comm threads
    # all use both CPUs (a one-CPU pool starved the open layers: BENCHMARKS.md).
    topo = synth.topology("1x2x1", gpus=1)
    p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)))
    assert not p.layer("trainer").cpus and not p.layer("data").cpus
    assert p.pool == topo.online
    # On 16 CPUs, 4 stay in the pool however much the layers ask for.
    greedy = TRAINING.replace(b'max = "50%"', b'max = "100%"').replace(b"min = 2", b"min = 64")
    topo = synth.topology("1x16x1", gpus=1)
    p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)), greedy)
    assert len(p.pool) == 4


GROUP_NICE = b"""
version = 1
[[layer]]
name = "trainer"
comment = "ranks"
match = [[{ parent_comm_prefix = "pt_elastic" }, { uid = 0 }]]
sched = { group_nice = -20 }

[[layer]]
name = "rest"
comment = "all else"
match = [[]]
"""


def test_group_nice_goes_to_the_session_a_layer_process_leads_and_only_with_autogroups():
    topo = replace(synth.topology("1x4x1"), autogroup=True)
    leader = synth.process(200, parent_comm="pt_elastic", ppid=100, session=200)
    member = synth.process(201, parent_comm="pt_elastic", ppid=100, session=7)  # a shell's
    worker = synth.process(300, "pt_data_worker", parent_comm="python3", ppid=200, session=200)
    tasks = synth.threads(leader, 3) + synth.threads(member, 2) + synth.threads(worker, 1)
    p = run(topo, tasks, GROUP_NICE)
    decided = {tp.tid: tp.group_nice for tp in p.tasks if tp.group_nice is not None}
    # Only the leader's main thread carries its session's weight: one write per session, never
    # a session that a layer process does not lead.
    assert decided == {200: -20}
    want = desired_state(p, tasks)
    assert [k for k in want if k.endswith("/autogroup")] == ["task/200@5200/autogroup"]
    assert want["task/200@5200/autogroup"] == -20
    # With autogroups off the kernel ignores the value: nothing to write.
    p = run(replace(topo, autogroup=False), tasks, GROUP_NICE)
    assert all(tp.group_nice is None for tp in p.tasks)


def test_a_heavier_session_is_given_only_while_demoted_work_needs_outweighing():
    """``weighted=False`` (the agent's watch: every demoted session sits in /hostd.demoted or a
    capped cgroup): a layer's negative group_nice is not given, its default (0) still is."""
    topo = replace(synth.topology("1x4x1"), autogroup=True)
    leader = synth.process(200, parent_comm="pt_elastic", ppid=100, session=200)
    service = synth.process(500, "svc", session=500)
    tasks = synth.threads(leader, 2) + synth.threads(service, 1)
    both = GROUP_NICE.replace(
        b'[[layer]]\nname = "rest"',
        b'[[layer]]\nname = "system"\ncomment = "services"\nmatch = [[{ comm_prefix = "svc" }]]\n'
        b'sched = { group_nice = 0 }\n\n[[layer]]\nname = "rest"',
    )
    given = run(topo, tasks, both)
    assert {tp.tid: tp.group_nice for tp in given.tasks if tp.group_nice is not None} == {
        200: -20,
        500: 0,
    }
    assert given.weighted
    kept = run(topo, tasks, both, weighted=False)
    assert {tp.tid: tp.group_nice for tp in kept.tasks if tp.group_nice is not None} == {500: 0}
    assert not kept.weighted
    again = TaskPlanner.for_plan(kept, topo, parse_policy(both, "t.toml"), allow_rt=True)
    assert again.weighted is False


def test_empty_layers_get_no_cpus():
    topo = synth.topology("2x8x2", gpus=8)
    other = synth.process(400, "stress-ng")
    p = run(topo, synth.threads(other, 4, online=topo.online))
    assert p.pool == topo.online
    assert not p.layer("trainer").cpus and not p.layer("data").cpus
    assert p.tasks == ()  # nothing to decide for the catch-all's threads


def test_irqs_avoid_trainer_cpus_and_nic_irqs_stay_on_their_node():
    topo = synth.topology("2x8x2", gpus=8, nics=2)
    p = run(topo, job(topo))
    trainer = p.layer("trainer").cpus
    assert p.irqs
    nic_node = {irq: nic.node for nic in topo.nics for irq in nic.irqs}
    for ip in p.irqs:
        assert ip.affinity and not ip.affinity & trainer
        if ip.irq in nic_node:
            assert ip.affinity <= topo.nodes[nic_node[ip.irq]].cpus


def test_kernel_threads_and_excluded_pids_are_never_planned():
    topo = synth.topology("1x4x1")
    kthread = synth.process(2, "kthreadd", kthread=True)
    me = synth.process(999, "hostd")
    tasks = [synth.thread(kthread, online=topo.online), synth.thread(me, online=topo.online)]
    everything_fifo = b"""
version = 1
[[layer]]
name = "all"
comment = "every thread"
match = [[]]
sched = { policy = "batch" }
"""
    p = run(topo, tasks, everything_fifo, exclude_pids=frozenset({999}))
    assert p.tasks == ()
    named = everything_fifo.replace(b"match = [[]]", b"match = [[{ is_kthread = true }], []]")
    p = run(topo, tasks, named, exclude_pids=frozenset({999}))
    assert [tp.tid for tp in p.tasks] == [2]


def test_base_affinity_narrower_pin_is_kept_where_it_overlaps():
    topo = synth.topology("1x8x1", gpus=1)
    tasks = job(topo, ranks=((0, "/dev/nvidia0"),))
    pinned = synth.process(500, "pinned")
    tasks.append(synth.thread(pinned, affinity=frozenset({1}), online=topo.online))
    p = run(topo, tasks)
    assert 1 in p.pool
    # Its pin is inside the pool: no change for it.
    assert all(tp.tid != 500 for tp in p.tasks)
    # Given an original affinity of everything, hostd would move it to the pool.
    p2 = run(topo, tasks, base_affinity={(500, 5500): topo.online})
    tp = next(tp for tp in p2.tasks if tp.tid == 500)
    assert tp.affinity == p2.pool


def test_governor_not_offered_is_a_note_not_a_plan():
    topo = synth.topology("1x8x1", gpus=1, cpufreq=True, governors=("powersave",))
    p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)))
    assert p.cpufreq == ()
    assert any("governor 'performance' not offered" in n for n in p.notes)


def test_plan_is_deterministic_and_order_independent():
    topo = synth.topology("2x8x2", gpus=8, nics=2, cpufreq=True)
    tasks = job(topo)
    first = run(topo, tasks).to_json()
    shuffled = list(tasks)
    random.Random(7).shuffle(shuffled)
    assert run(topo, shuffled).to_json() == first


@pytest.mark.parametrize(
    ("shape", "gpus"), [("1x2x1", 0), ("1x4x2", 1), ("2x4x2", 2), ("2x16x2", 8), ("4x4x1", 4)]
)
def test_shipped_default_policy_plans_on_synthetic_hosts(shape, gpus):
    from hostd.policy import default_policy_bytes

    topo = synth.topology(shape, gpus=gpus, nics=1, cpufreq=True)
    p = run(topo, job(topo, ranks=((0, "/dev/nvidia0"),)), default_policy_bytes())
    assert p.pool
    owned = [lp.cpus for lp in p.layers]
    assert sum(len(c) for c in owned) == len(frozenset().union(*owned))  # disjoint


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from(["1x1x1", "1x2x1", "1x2x2", "1x4x2", "2x4x2", "2x3x1", "4x2x2"]),
    n_gpus=st.integers(0, 8),
    kinds=st.lists(st.sampled_from(["confined", "grouped", "open"]), min_size=1, max_size=4),
    mins=st.lists(st.integers(0, 6), min_size=4, max_size=4),
    maxs=st.lists(st.sampled_from(["1", "3", '"25%"', '"50%"', '"100%"', "0.75"]), min_size=4,
                  max_size=4),
    sizes=st.lists(st.integers(0, 12), min_size=4, max_size=4),
)  # fmt: skip
def test_plan_invariants_hold_for_any_layers(shape, n_gpus, kinds, mins, maxs, sizes):
    topo = synth.topology(shape, gpus=n_gpus)
    text = "version = 1\n"
    tasks = []
    for i, kind in enumerate(kinds):
        text += f'[[layer]]\nname = "l{i}"\ncomment = "c"\nmatch = [[{{ comm_prefix = "w{i}" }}]]\n'
        text += f'kind = "{kind}"\n'
        if kind != "open":
            text += f"cpus = {{ min = {mins[i]}, max = {maxs[i]} }}\n"
            if i % 2:
                text += 'numa = "gpu-local"\nirqs = "avoid"\n'
        proc = synth.process(1000 + i * 100, f"w{i}", gpu_devices=(f"/dev/nvidia{i}",))
        tasks += synth.threads(proc, sizes[i], online=topo.online) if sizes[i] else []
    text += '[[layer]]\nname = "rest"\ncomment = "c"\nmatch = [[]]\n'
    try:
        p = run(topo, tasks, text.encode())
    except Exception as exc:  # min above max is a policy error, not a planner one
        assert "min no larger than max" in str(exc)
        return
    owned = [lp.cpus for lp in p.layers]
    assert p.pool, "the catch-all must keep a CPU"
    assert sum(len(c) for c in owned) + len(p.pool) == len(topo.online)  # a partition
    assert frozenset().union(p.pool, *owned) == topo.online
    for lp in p.layers:
        if lp.kind != "open" and lp.threads and not lp.cpus:
            assert lp.notes
    for tp in p.tasks:
        assert tp.affinity is None or (tp.affinity and tp.affinity <= topo.online)


@pytest.mark.parametrize("shape", ["1x8x1", "2x8x2", "1x2x1"])
def test_incremental_decisions_equal_the_full_plan(shape):
    """The agent decides a new or renamed thread with ``TaskPlanner.for_plan``: for every thread
    it must say what the full plan said (same CPUs, sched, node, cpuset)."""
    topo = synth.topology(shape, gpus=8 if shape.startswith("2") else 1)
    policy = parse_policy(TRAINING, "test.toml")
    classified = Classifier(policy).classify_all(job(topo))
    full = plan(topo, classified, policy)
    planner = TaskPlanner.for_plan(full, topo, policy, allow_rt=True)
    by_key = {(tp.tid, tp.start_time): tp for tp in full.tasks}
    numa = {}
    for item in classified:
        tp, np_ = planner.decide(item)
        assert tp == by_key.get(item.task.key), item.task
        if np_ is not None:
            numa[np_.pid] = np_
    assert not numa  # the full plan's NUMA targets are known: nothing placed twice


def test_incremental_rt_cap_frees_slots_of_exited_threads():
    topo = synth.topology("1x2x1")
    capped = TRAINING.replace(
        b'sched = { policy = "fifo", priority = 10 }',
        b'sched = { policy = "fifo", priority = 10, max_rt_threads = 2 }',
    )
    policy = parse_policy(capped, "test.toml")
    launcher = synth.process(100, "pt_elastic")
    rank = synth.process(200, parent_comm="pt_elastic", ppid=100)
    tasks = synth.threads(launcher, 1, online=topo.online) + synth.threads(rank, 3)
    classified = Classifier(policy).classify_all(tasks)
    full = plan(topo, classified, policy)
    planner = TaskPlanner.for_plan(full, topo, policy, allow_rt=True)
    rank_items = [c for c in classified if c.task.pid == 200]
    assert [planner.decide(c)[0].policy for c in rank_items] == ["fifo", "fifo", "other"]
    planner.forget(rank_items[0].task.key)  # a FIFO thread exited: its slot is free again
    newcomer = rank_items[2]
    assert planner.decide(newcomer)[0].policy == "fifo"


def test_v2_cpusets_are_threaded_children_of_each_jobs_own_cgroup():
    """On v2 a layer's threads go to ``G/hostd.<layer>`` of their own cgroup G, one per home;
    the other threads of a process hostd split stay (or go back) home; nothing else moves."""
    topo = synth.topology("1x8x1")
    home = "/system.slice/train.service"
    # The launcher (layer "rest") was a trainer before it renamed itself: it is in hostd.trainer.
    launcher = replace(synth.process(100, "pt_elastic"), cpuset=f"{home}/hostd.trainer")
    rank = replace(synth.process(200, parent_comm="pt_elastic", ppid=100), cpuset=home)
    other = replace(synth.process(400, "stress-ng"), cpuset="/user.slice/u.scope")
    worker = replace(
        synth.process(300, "pt_data_worker", parent_comm="python3", ppid=200),
        cpuset=f"{home}/hostd.trainer",  # forked by a trainer thread: born in its cpuset
    )
    rank_threads = synth.threads(rank, 2, online=topo.online)
    tasks = [
        *synth.threads(launcher, 1, online=topo.online),
        *rank_threads,
        *synth.threads(worker, 1, online=topo.online),
        *synth.threads(other, 2, online=topo.online),
    ]
    # train.service is systemd's: hostd writes into it only where the policy asks.
    asks = TRAINING + b'\n[cgroups]\nwrite = ["service"]\n'
    p = run(topo, tasks, asks)
    assert [(cs.layer, cs.path) for cs in p.cpusets] == [
        ("data", f"{home}/hostd.data"),
        ("trainer", f"{home}/hostd.trainer"),
    ]
    trainer = p.layer("trainer")
    assert p.cpusets[1].cpus == trainer.cpus | p.pool  # grouped: its CPUs and the pool
    where = {tp.tid: tp.cpuset for tp in p.tasks}
    assert {where[t.tid] for t in rank_threads} == {f"{home}/hostd.trainer"}
    assert where[100] == home  # no cpuset for its layer: back home
    assert where[300] == f"{home}/hostd.data"
    assert all(tp.cpuset is None for tp in p.tasks if tp.pid == 400)  # no layer with a cpuset
    # The cgroup a process is classified by is its home, wherever hostd put its leader.
    planner = TaskPlanner.for_plan(p, topo, parse_policy(asks, "t.toml"), allow_rt=True)
    for item in Classifier(parse_policy(asks, "t.toml")).classify_all(tasks):
        assert planner.decide(item)[0] == next((t for t in p.tasks if t.tid == item.task.tid), None)

    want = desired_state(p, tasks)
    keys = [k for k in want if k.startswith("cgroup/")]
    assert keys == [  # the controller enabled from the root down, then the groups
        "cgroup/subtree/",
        "cgroup/subtree/system.slice",
        f"cgroup/subtree{home}",
        f"cgroup/cpuset{home}/hostd.data",
        f"cgroup/cpuset{home}/hostd.trainer",
    ]
    # Not asked (the shipped policies): no cgroup of systemd's is written; the threads keep
    # their cgroup and get their layer's CPUs by affinity; one that hostd put in a cpuset
    # before goes back home.
    p = run(topo, tasks)
    assert p.cpusets == ()
    where = {tp.tid: tp.cpuset for tp in p.tasks}
    assert {where.get(t.tid) for t in rank_threads} == {None}
    assert where[100] == home and where[300] == home
    assert not [k for k in desired_state(p, tasks) if k.startswith("cgroup/")]
    assert {tp.affinity for tp in p.tasks if tp.tid in {t.tid for t in rank_threads}} != {None}


def test_v1_cpusets_take_only_threads_of_the_root_cpuset():
    topo = replace(
        synth.topology("1x8x1"),
        cgroup=CgroupLayout("hybrid", None, (), (("cpuset", "/sys/fs/cgroup/cpuset"),), "v1"),
    )
    rank = synth.process(200, parent_comm="pt_elastic", ppid=100)
    boxed = replace(synth.process(201, parent_comm="pt_elastic", ppid=100), cpuset="/docker/a")
    tasks = [*synth.threads(rank, 2), *synth.threads(boxed, 2)]
    p = run(topo, tasks)
    assert [cs.path for cs in p.cpusets] == ["/hostd/trainer"]
    assert {tp.cpuset for tp in p.tasks if tp.pid == 200} == {"/hostd/trainer"}
    assert {tp.cpuset for tp in p.tasks if tp.pid == 201} == {None}  # docker's: left alone
    assert "cgroup/subtree/" not in desired_state(p, tasks)


def test_a_thread_decided_again_drops_the_join_it_waited_for():
    """An event pass lets a new thread's cpuset join wait (``JOIN_AFTER_S``). Renamed out of
    that layer before the join is due, the thread must not be moved into it a second later:
    a comm thread on the trainer's CPUs, and later affinity writes refused (EINVAL)."""
    topo = replace(
        synth.topology("1x8x1"),
        cgroup=CgroupLayout("hybrid", None, (), (("cpuset", "/sys/fs/cgroup/cpuset"),), "v1"),
    )
    policy = parse_policy(TRAINING, "test.toml")
    classifier = Classifier(policy)
    tasks = job(topo)
    classified = classifier.classify_all(tasks)
    full = plan(topo, classified, policy)
    inc = Incremental(cache=SimpleNamespace(procs={}))  # type: ignore[arg-type]
    inc.start(topo, full, TaskPlanner.for_plan(full, topo, policy, allow_rt=True), classified)
    worker = next(t.process for t in tasks if t.comm == "pt_data_worker")
    born = synth.thread(worker, tid=399, online=topo.online)  # a new thread, in the root cpuset
    key = f"task/{born.tid}@{born.start_time}/cpuset"

    def decide(task):
        return inc.decide(inc.classify([task], classifier, frozenset()), lambda _: None)

    assert key not in decide(born)
    assert inc.pending[born.key][0] == "/hostd/data"  # the data layer's cpuset, in a second
    renamed = replace(born, comm="helper")  # now in "rest": no cpuset of its own
    assert decide(renamed)[key] == "/"  # wanted home (where it still is), now
    assert born.key not in inc.pending
    # A thread that exits before its join is due: nothing left to move (in a storm of
    # short-lived threads, joins of dead threads took a sixth of the agent's time).
    assert key not in decide(born) and born.key in inc.pending
    inc.drop(born.tid, cached=False)
    assert born.key not in inc.pending


TWIN_POLICY = b"""
version = 1
[preempt]
session_nice = 19
[[layer]]
name = "trainer"
comment = "ranks"
match = [[{ comm_prefix = "rank" }]]
kind = "grouped"
cpus = { min = 2, max = 3 }
sched = { policy = "batch", nice = -5, group_nice = -10 }
preempt = true

[[layer]]
name = "data"
comment = "loaders"
match = [[{ comm_prefix = "pt_data_worker" }]]
kind = "confined"
cpus = { min = 1, max = 1 }

[[layer]]
name = "rest"
comment = "all else"
match = [[]]
preemptible = true
"""


@settings(max_examples=120, deadline=None)
@given(
    v2=st.booleans(),
    procs=st.lists(
        st.tuples(
            st.sampled_from(["rank", "pt_data_worker", "stress-ng"]),
            st.sampled_from(["/", "/hostd/trainer", "/docker/a", "/job", "/job/hostd.trainer"]),
            st.integers(1, 8),  # threads
            st.integers(0, 2),  # session: 0 its own, 1 demoted, 2 demoted and spared
        ),
        min_size=1,
        max_size=6,
    ),
    threads=st.lists(
        st.tuples(
            st.sampled_from([0, 0, 1]),  # its policy (1: SCHED_FIFO, which a demotion keeps)
            st.sampled_from([None, None, (0, 1), (6, 7)]),  # its affinity
            st.booleans(),  # renamed into the data layer
        ),
        min_size=36,
        max_size=36,
    ),
    bases=st.lists(st.sampled_from([None, None, None, (7,)]), min_size=36, max_size=36),
    flip=st.integers(0, 36),  # a session demoted after this many decisions
)
def test_twins_are_decided_as_the_planner_decides_each_thread(v2, procs, threads, bases, flip):
    """``TaskPlanner.decide`` hands a thread its twin's decision (same process, layer, base
    affinity, policy, demotion and cpuset state): every decision must be what deciding that
    thread alone gives, whatever came before it (its process in a cpuset or not yet, its session
    demoted midway, the leader of a demoted session among them)."""
    layout = (
        CgroupLayout("v2", "/sys/fs/cgroup", ("cpuset", "cpu"), (), "v2")
        if v2
        else CgroupLayout("hybrid", None, (), (("cpuset", "/sys/fs/cgroup/cpuset"),), "v1")
    )
    topo = replace(synth.topology("1x8x1"), cgroup=layout)
    policy = parse_policy(TWIN_POLICY + b'[cgroups]\nwrite = ["service", "other"]\n', "t.toml")
    tasks, demoted, spared = [], set(), set()
    for i, (comm, cpuset, n, session) in enumerate(procs):
        pid = 1000 + 100 * i
        proc = replace(synth.process(pid, comm, session=pid if session else 0), cpuset=cpuset)
        if session:
            demoted.add(pid)
        if session == 2:
            spared.add(pid)
        for j, task in enumerate(synth.threads(proc, n, online=topo.online)):
            policy_no, affinity, renamed = threads[(6 * i + j) % 36]
            tasks.append(
                replace(
                    task, policy=policy_no, affinity=frozenset(affinity or topo.online),
                    comm="pt_data_worker" if renamed else task.comm,
                )
            )  # fmt: skip
    classified = Classifier(policy).classify_all(tasks)
    full = plan(
        topo, classified, policy, demoted_sessions=frozenset(demoted), spared_pids=frozenset(spared)
    )

    def planner():
        p = TaskPlanner.for_plan(full, topo, policy, allow_rt=True)
        p.demoted, p.spared = set(demoted) - {max(demoted, default=0)}, set(spared)
        p.cpuset_pids.clear()  # as an event pass finds it: its processes join one by one
        return p

    twins, alone = planner(), planner()
    for n, item in enumerate(classified * 2):  # twice: the second time, every twin is known
        if n == flip:
            for p in (twins, alone):
                p.demoted.add(max(demoted, default=0))
        base = None if bases[n % 36] is None else frozenset(bases[n % 36])
        assert twins.decide(item, base) == alone._decide(item, base), item.task

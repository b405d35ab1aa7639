"""Preemptible work and the starvation guard: the pure decisions (hostd.preempt) and what the
planner makes of them, table-driven over synthetic samples (no kernel, no root)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hostd.classify import Classified, Classifier
from hostd.model.node import place
from hostd.plan import TaskPlanner, plan
from hostd.policy import Guard, Preempt, load_default, parse_policy
from hostd.preempt import (
    Demotion,
    Sample,
    Watch,
    counted_layers,
    explain,
    shielding_layers,
    why_group_kept,
    why_kept,
)
from tests.synth import topology as synth
from tests.unit.test_classify import LAUNCHER, RANK_ENV, make_task

REPO_POLICY = Path(__file__).resolve().parents[2] / "hostd" / "policy" / "training.toml"

MS = 1_000_000  # ns
PREEMPTIBLE = frozenset({"rest", "compile"})


def watch(**kw) -> Watch:
    return Watch(Preempt(**kw), Guard(), PREEMPTIBLE)


def sample(
    tid: int, run_ms: float, wait_ms: float, *, sid: int = 500, layer: str = "rest", state="R"
):
    return Sample((tid, 7), tid, sid, layer, int(run_ms * MS), int(wait_ms * MS), state)


def feed(w: Watch, rounds: list[list[Sample]], *, active: bool = True, step: float = 1.0, **kw):
    """Feed rounds of samples one second apart; the decisions of each round."""
    return [w.update(i * step, r, active=active, **kw) for i, r in enumerate(rounds)]


def busy_rounds(n: int, tids=(11, 12), cpu_each: float = 0.4, wait_each: float = 0.4, **kw):
    """``n`` rounds in which each thread runs ``cpu_each`` and waits ``wait_each`` per second."""
    return [
        [sample(t, 1000 * cpu_each * i, 1000 * wait_each * i, **kw) for t in tids] for i in range(n)
    ]


# -- demotion ---------------------------------------------------------------------------------
def test_a_busy_session_is_demoted_after_one_interval() -> None:
    w = watch()
    first, second = feed(w, busy_rounds(2))
    assert not first  # one sample: no rate yet
    assert [d.sid for d in second.demote] == [500]
    assert second.demote[0].demand == pytest.approx(1.6)  # 2 threads x (0.4 run + 0.4 wait)
    assert 500 in w.demoted


def test_demand_counts_waiting_not_only_running() -> None:
    """A competitor squeezed by the job uses little CPU but wants a lot: it still counts."""
    w = watch(busy=0.5)
    _, d = feed(w, busy_rounds(2, tids=(11,), cpu_each=0.02, wait_each=0.9))
    assert [x.sid for x in d.demote] == [500]


@pytest.mark.parametrize(
    ("layer", "cpu", "demoted"),
    [
        ("rest", 0.6, True),
        ("compile", 0.6, True),
        ("rest", 0.2, False),  # below busy (0.5)
        ("system", 0.9, False),  # not a preemptible layer
        ("trainer", 0.9, False),
    ],
)
def test_only_busy_preemptible_threads_count(layer: str, cpu: float, demoted: bool) -> None:
    w = watch()
    _, d = feed(w, busy_rounds(2, tids=(11,), cpu_each=cpu, wait_each=0.0, layer=layer))
    assert bool(d.demote) is demoted


@pytest.mark.parametrize(
    ("wants", "demoted"),
    [
        ([0.9], []),  # one interactive session within the user's allowance (1 CPU)
        ([0.9, 0.6], [1]),  # past it: the busier one goes
        ([0.6, 0.6, 0.6], [2, 3]),  # three loops under ptys (`script`): one keeps its CPU
    ],
)
def test_a_users_interactive_sessions_keep_an_allowance(wants, demoted) -> None:
    """Issue 44.8: a terminal is a user's to open (`script`, `ssh -t`, tmux); three busy loops
    under ptys kept 1.9 CPUs next to the job. Now a user's interactive sessions together keep
    ``interactive_cpus``, the least busy first; the rest are demoted."""
    w = watch(interactive_cpus=1.0)
    rounds = [
        [sample(10 * (k + 1), 1000 * want * i, 0, sid=k + 1) for k, want in enumerate(wants)]
        for i in range(2)
    ]
    decisions = feed(w, rounds, interactive=lambda sid: 1000)
    assert sorted(d.sid for d in decisions[-1].demote) == demoted


def test_a_name_in_an_unprotected_layer_does_not_hide_a_busy_session() -> None:
    """Issue 44.8: a busy loop named pt_elastic (the launcher's layer, neither protected nor
    preemptible) was never counted. Every layer but the protected ones counts."""
    w = Watch(Preempt(), Guard(), PREEMPTIBLE, counted=PREEMPTIBLE | {"helpers"})
    _, d = feed(w, busy_rounds(2, tids=(11,), cpu_each=0.9, wait_each=0.0, layer="helpers"))
    assert [x.sid for x in d.demote] == [500]
    policy = load_default()
    # the launcher's layer can be landed in by a name; the services' and GPU services' cannot
    assert counted_layers(policy) == policy.preemptible | {"helpers"}


def _starved_rounds(n: int, ran_until: int) -> list[list[Sample]]:
    """A demoted session's thread that wants a CPU every round (it waits, state R) and runs
    only in the first ``ran_until`` rounds: 0.5 s of CPU there, nothing after."""
    return [
        [sample(11, 500 * min(i, ran_until), 900 * i)] for i in range(n)
    ]  # fmt: skip


def test_a_demoted_session_that_gets_no_cpu_past_the_floor_is_lifted() -> None:
    """Issue 43.3: the floor. Demoted at once (it wants 1.4 CPUs), it then waits every second
    without running (the job keeps every CPU and the guard's boosts do not reach it): lifted
    once it waited ``floor`` seconds, said so, and not demoted again for ``release_after``."""
    w = watch(floor=4.0, release_after=10.0)
    decisions = feed(w, _starved_rounds(20, ran_until=2))
    demoted_at = next(i for i, d in enumerate(decisions) if d.demote)
    lifted_at = next(i for i, d in enumerate(decisions) if d.lifted)
    assert demoted_at == 1 and decisions[lifted_at].lifted == [500]
    # it last ran in round 2, so rounds 3.. wait: 4 s of waiting after round 3 starts the count
    assert lifted_at == 3 + 4
    assert dict(decisions[lifted_at].release)[500].endswith("(the floor)")
    again = [i for i, d in enumerate(decisions) if d.demote and i > lifted_at]
    assert again and again[0] == lifted_at + 10  # held off for release_after, then demoted


def test_a_demoted_session_that_runs_now_and_then_stays_demoted() -> None:
    """Running a little (a boost, the idle class's share) is progress: no lift."""
    w = watch(floor=4.0)
    rounds = [[sample(11, 5 * i, 900 * i)] for i in range(20)]  # 5 ms a second
    decisions = feed(w, rounds)
    assert not any(d.lifted for d in decisions) and 500 in w.demoted


def test_kept_sessions_are_never_demoted() -> None:
    w = watch()
    decisions = feed(w, busy_rounds(3), kept=lambda sid: "an interactive session")
    assert not any(d.demote for d in decisions)
    assert not w.demoted


def test_nothing_is_demoted_while_no_protected_layer_has_threads() -> None:
    w = watch()
    decisions = feed(w, busy_rounds(3), active=False)
    assert not any(d.demote for d in decisions)


def test_release_when_the_job_leaves() -> None:
    w = watch()
    feed(w, busy_rounds(2))
    d = w.update(2.0, busy_rounds(3)[2], active=False)
    assert d.release == [(500, "no protected layer has threads")]
    assert not w.demoted


def test_release_when_the_session_is_gone() -> None:
    w = watch()
    feed(w, busy_rounds(2))
    d = w.update(2.0, [], active=True, sessions_alive=lambda sid: False)
    assert d.release == [(500, "the session is gone")]


def test_release_only_after_wanting_little_for_release_after() -> None:
    w = watch(release_after=3.0)
    feed(w, busy_rounds(2))  # demoted at t=1
    quiet = [sample(11, 400, 400), sample(12, 400, 400)]  # no progress: wants nothing
    released_at = None
    for t in range(2, 9):
        d = w.update(float(t), quiet, active=True)
        if d.release:
            released_at = t
            break
    # low from t=2 on; released once it has been low for 3 s
    assert released_at == 5
    assert "wanted under 0.125 CPUs for 3 s" in d.release[0][1]


def test_a_demoted_session_that_wants_again_is_kept_demoted() -> None:
    w = watch(release_after=2.0)
    feed(w, busy_rounds(2))
    quiet = [sample(11, 400, 400)]
    w.update(2.0, quiet, active=True)
    busy_again = [sample(11, 400, 1400)]  # waited a whole second: it wants the CPU
    d = w.update(3.0, busy_again, active=True)
    assert not d.release and w.demoted[500].low_since is None


# -- the starvation guard ------------------------------------------------------------------------
def starving(n: int, tid: int = 21, **kw):
    """Runnable all the time, never running."""
    return [[sample(tid, 5, 1000 * i, **kw)] for i in range(n)]


def test_a_starving_thread_is_boosted_after_starve_after() -> None:
    w = Watch(Preempt(), Guard(starve_after=3.0), PREEMPTIBLE)
    decisions = feed(w, starving(6))
    boosted_at = [i for i, d in enumerate(decisions) if d.boost]
    # first rate at t=1 (starving since t=0); 3 s later, then again 3 s after that
    assert boosted_at == [3]
    assert decisions[3].boost[0].key == (21, 7)


def _with_uid(sample_: Sample, uid: int) -> Sample:
    return dataclasses.replace(sample_, uid=uid)


@pytest.mark.parametrize(
    ("hog_uid", "demoted", "boosted"),
    [
        (1000, False, False),  # its own user's nice-0 sibling starves it: its own doing
        (2000, False, True),  # another user's work starves it
        (1000, True, True),  # hostd demoted it: hostd's doing
    ],
)
def test_a_thread_starved_by_its_own_users_work_gains_nothing(hog_uid, demoted, boosted) -> None:
    """Issue 44.13: a user's nice-19 process starved by its own nice-0 sibling got 10 ms of
    SCHED_FIFO every 5 s. The guard boosts only what hostd's demotion or another user starves."""
    w = Watch(Preempt(), Guard(starve_after=2.0), PREEMPTIBLE)
    if demoted:
        w.demoted[500] = Demotion(500, 0.0, 1.0)
    rounds = [
        [
            _with_uid(sample(21, 5, 1000 * i, sid=500), 1000),  # runnable, never running
            _with_uid(sample(31, 900 * i, 0, sid=600, state="R"), hog_uid),  # the hog
        ]
        for i in range(6)
    ]
    # no job runs unless hostd demoted it (else its busy session would be demoted too)
    got = {s.key[0] for d in feed(w, rounds, active=demoted) for s in d.boost}
    assert (21 in got) is boosted


def test_a_thread_under_a_real_time_spinner_is_starving() -> None:
    """RT throttling leaves a normal thread 5 % of a CPU under a real-time spinner, and
    schedstat shows it waiting only about half of the time (measured on 6.18)."""
    w = Watch(Preempt(), Guard(starve_after=2.0), PREEMPTIBLE)
    rounds = [[sample(21, 50 * i, 475 * i)] for i in range(4)]
    assert [i for i, d in enumerate(feed(w, rounds)) if d.boost] == [2]


def test_boosts_stay_within_their_budget_longest_starving_first() -> None:
    w = Watch(Preempt(interval=1.0), Guard(starve_after=1.0, boost_ms=10), PREEMPTIBLE)
    first = [sample(t, 0, 0) for t in range(100, 120)]
    w.update(0.0, [sample(t, 0, 0) for t in range(100, 110)], active=True)  # 10 since t=0
    w.update(1.0, first, active=True)  # 10 more since t=1
    later = [sample(t, 0, 2000) for t in range(100, 120)]
    d = w.update(2.0, later, active=True)
    assert len(d.boost) == 5  # 5 % of a CPU in 10 ms boosts per 1 s round
    assert {s.key[0] for s in d.boost} <= set(range(100, 110))


def test_a_thread_that_runs_a_little_is_not_starving() -> None:
    w = Watch(Preempt(), Guard(starve_after=2.0), PREEMPTIBLE)
    rounds = [[sample(21, 200 * i, 800 * i)] for i in range(6)]  # 20 % of a CPU
    assert not any(d.boost for d in feed(w, rounds))


def test_a_sleeping_thread_is_not_starving() -> None:
    w = Watch(Preempt(), Guard(starve_after=2.0), PREEMPTIBLE)
    rounds = [[sample(21, 0, 100 * i)] for i in range(6)]  # waited 10 % of the time
    assert not any(d.boost for d in feed(w, rounds))
    w = Watch(Preempt(), Guard(starve_after=2.0), PREEMPTIBLE)
    rounds = [[sample(21, 0, 900 * i, state="RS"[i % 2])] for i in range(6)]  # not always R
    assert not any(d.boost for d in feed(w, rounds))


def test_guard_off_boosts_nothing() -> None:
    w = Watch(Preempt(), Guard(enabled=False, starve_after=1.0), PREEMPTIBLE)
    assert not any(d.boost for d in feed(w, starving(5)))


def test_a_real_time_runaway_is_found_once() -> None:
    w = Watch(Preempt(), Guard(rt_runaway_after=2.0, rt_runaway_share=0.9), PREEMPTIBLE)
    rounds = [[sample(31, 990 * i, 0, layer="comms")] for i in range(6)]
    decisions = feed(w, rounds, rt_keys={(31, 7)})
    found = [i for i, d in enumerate(decisions) if d.runaway]
    assert found == [2]
    assert (31, 7) in w.runaways


def test_a_real_time_thread_that_blocks_is_no_runaway() -> None:
    w = Watch(Preempt(), Guard(rt_runaway_after=2.0), PREEMPTIBLE)
    rounds = [[sample(31, 300 * i, 0, layer="comms")] for i in range(8)]
    assert not any(d.runaway for d in feed(w, rounds, rt_keys={(31, 7)}))


def test_a_busy_thread_hostd_did_not_make_real_time_is_no_runaway() -> None:
    w = Watch(Preempt(), Guard(rt_runaway_after=1.0), PREEMPTIBLE)
    rounds = [[sample(31, 990 * i, 0, layer="trainer")] for i in range(5)]
    assert not any(d.runaway for d in feed(w, rounds))


# -- which sessions are kept ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sid", "layers", "tty", "why"),
    [
        (0, {"rest"}, False, "the kernel's or init's session"),
        (1, {"rest"}, False, "the kernel's or init's session"),
        (77, {"rest"}, False, "hostd's own session"),
        (500, {"rest"}, True, None),  # a terminal: an allowance (Watch), never a pass
        (500, {"rest", "trainer"}, False, "it holds threads of the protected layer 'trainer'"),
        (500, {"system", "rest"}, False, "layer 'system' weighs its sessions itself"),
        (500, {"rest", "helpers", "compile"}, False, None),
    ],
)
def test_why_kept(sid: int, layers: set[str], tty: bool, why: str | None) -> None:
    policy = load_default()
    got = why_kept(
        sid,
        layers=layers,
        tty=tty,
        own_sid=77,
        protected=policy.protected,
        shielding=shielding_layers(policy),
    )
    assert got == why if why is None else got.startswith(why)


def test_the_job_s_launcher_is_kept_a_process_named_like_one_is_not() -> None:
    """A session holding the parent of a protected process (torchrun, busy importing torch
    while its ranks start in sessions of their own) is the job's; a busy process named
    pt_elastic that started no protected process is not."""
    policy = load_default()
    common = dict(tty=False, own_sid=77, protected=policy.protected,
                  shielding=shielding_layers(policy))  # fmt: skip
    got = why_kept(500, layers={"launcher"}, launched="trainer", **common)
    assert got == "it started a process of the protected layer 'trainer' (the job's launcher)"
    assert why_kept(500, layers={"launcher"}, **common) is None


C = "ab" * 32
POD = (
    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c_0.slice/"
    f"cri-containerd-{C}.scope"
)


@pytest.mark.parametrize(
    ("places", "keep", "why"),
    [
        # the node's own: its services, kube-system's pods, static pods, root's logins
        ([place("/system.slice/kubelet.service")], Preempt(), "node infrastructure: service"),
        (
            [place(POD).with_pod("kube-system", "calico-node-x")],
            Preempt(),
            "node infrastructure: pod kube-system/calico-node-x",
        ),
        (
            [place(POD).with_pod("monitoring", "fluent-bit-x")],
            Preempt(keep_namespaces=("monitoring",)),
            "node infrastructure: pod monitoring/",
        ),
        (
            [place(POD).with_pod("default", "etcd-n1", static=True)],
            Preempt(),
            "node infrastructure: static pod",
        ),
        # a node agent in a namespace the policy does not list: the host's network, privileged
        (
            [place(POD).with_host_access("host network").with_pod("monitoring", "node-exp-x")],
            Preempt(),
            "a node agent: pod monitoring/node-exp-x (burstable, host network)",
        ),
        (
            [place(POD).with_host_access("privileged").with_pod("team-a", "npd-x")],
            Preempt(),
            "a node agent: pod team-a/npd-x (burstable, privileged)",
        ),
        ([place("/user.slice/user-0.slice/session-9.scope")], Preempt(), "an operator's login"),
        (
            [place("/system.slice/run-u7.service")],
            Preempt(keep_units=("run-*.service",)),
            "transient run-u7.service ([preempt] keep_units)",
        ),
        # competing work wherever it sits: a container under system.slice, a workload pod, a pod
        # whose namespace the runtime did not say, a transient unit, a user's login, a user's
        # manager's units
        ([place(f"/system.slice/docker-{C}.scope")], Preempt(), None),
        ([place(POD).with_pod("team-a", "train-0")], Preempt(), None),
        ([place(POD)], Preempt(), None),
        ([place("/system.slice/run-u7.service")], Preempt(), None),
        ([place("/user.slice/user-1000.slice/session-9.scope")], Preempt(), None),
        (
            [place("/user.slice/user-1000.slice/user@1000.service/app.slice/a.service")],
            Preempt(),
            None,
        ),
        ([place("/")], Preempt(), None),
        # a policy that keeps less
        ([place("/system.slice/kubelet.service")], Preempt(keep_kinds=()), None),
        (
            [place(POD).with_host_access("host network").with_pod("monitoring", "node-exp-x")],
            Preempt(keep_node_agents=False),
            None,
        ),
        ([place("/user.slice/user-0.slice/session-9.scope")], Preempt(keep_logins_of=()), None),
        # any process of the session in a kept place keeps it
        ([place("/"), place("/system.slice/cron.service")], Preempt(), "node infrastructure"),
    ],
)
def test_what_the_node_keeps(places: list, keep: Preempt, why: str | None) -> None:
    got = why_kept(
        500, layers={"rest"}, tty=False, own_sid=77, protected=frozenset(),
        shielding=frozenset(), places=places, keep=keep,
    )  # fmt: skip
    assert got == why if why is None else got is not None and got.startswith(why), got


# -- which cgroups yield as a whole ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "members", "why"),
    [
        ("/", {5: 500}, "the root cgroup"),
        ("/tenant.scope", None, "its processes could not all be listed"),
        ("/tenant.scope", {}, "it holds no process"),
        ("/tenant.scope", {5: 500, 6: None}, "it holds process 6, which hostd does not watch"),
        ("/user.slice/s.scope", {5: 500, 9: 900}, "it holds process 9 of session 900, which is"),
        ("/tenant.scope", {5: 500, 6: 500, 7: 600}, None),  # two demoted sessions
    ],
)
def test_why_group_kept(path: str, members, why: str | None) -> None:
    got = why_group_kept(path, members, {500, 600}, writable=("service", "login", "other"))
    assert got == why if why is None else got.startswith(why)


@pytest.mark.parametrize(
    ("path", "writable", "why"),
    [
        # another manager's cgroup is written only where the policy's [cgroups] write says so
        (f"/system.slice/docker-{C}.scope", (), "it is another manager's (container of docker"),
        (f"/system.slice/docker-{C}.scope", ("container",), None),
        (POD, ("container",), "it is another manager's (pod uid"),
        (POD, ("pod",), None),
        ("/system.slice/run-u9.service", ("container", "pod"), "it is another manager's (transi"),
        ("/user.slice/user-1000.slice/session-4.scope", ("login",), None),
    ],
)
def test_a_managers_cgroup_is_weighed_only_where_the_policy_says(
    path: str, writable: tuple, why: str | None
) -> None:
    got = why_group_kept(path, {5: 500}, {500}, writable=writable)
    assert got == why if why is None else got is not None and got.startswith(why), got


# -- the planner ---------------------------------------------------------------------------------
def synth_topology(autogroup: bool = True):
    return dataclasses.replace(synth("1x4x1"), autogroup=autogroup)


def _planner(policy, demoted=(), runaways=(), autogroup=True) -> tuple[TaskPlanner, Classifier]:
    topo = synth_topology(autogroup)
    p = TaskPlanner(
        topo,
        policy,
        {},
        topo.online,
        (),
        allow_rt=True,
        demoted=frozenset(demoted),
        runaways=frozenset(runaways),
    )
    return p, Classifier(policy)


def _decide(planner: TaskPlanner, classifier: Classifier, task):
    layer, group = classifier.matched_group(task)
    return planner.decide(Classified(task, layer.name, group))[0]


def test_threads_of_a_demoted_session_get_sched_idle_and_its_leader_nice_19() -> None:
    policy = load_default()
    planner, cls = _planner(policy, demoted={700})
    leader = make_task("stress-ng", pid=700, uid=1000)
    worker = make_task("stress-ng", pid=701, session=700, uid=1000)
    other = make_task("stress-ng", pid=801, session=800, uid=1000)
    tp = _decide(planner, cls, leader)
    assert (tp.policy, tp.priority, tp.group_nice) == ("idle", None, 19)
    tp = _decide(planner, cls, worker)
    assert (tp.policy, tp.group_nice) == ("idle", None)
    assert _decide(planner, cls, other) is None  # not demoted: rest has nothing to decide


def test_a_demoted_sessions_non_preemptible_leader_gets_only_the_session_weight() -> None:
    """The launcher's session: pt_elastic (helpers) keeps its own policy, its session weighs
    nice 19, the busy processes it started get SCHED_IDLE."""
    policy = load_default()
    planner, cls = _planner(policy, demoted={900})
    launcher = make_task("pt_elastic", pid=900, uid=0)
    tp = _decide(planner, cls, launcher)
    assert (tp.layer, tp.policy, tp.nice, tp.group_nice) == ("helpers", None, None, 19)
    busy = make_task("python3", pid=905, session=900, parent_comm="pt_elastic", uid=0)
    tp = _decide(planner, cls, busy)
    assert (tp.layer, tp.policy) == ("rest", "idle")


def test_a_rank_leads_its_session_a_busy_sibling_does_not() -> None:
    policy = load_default()
    cls = Classifier(policy)
    # torchrun gives each rank its RANK; a busy process started in the launcher's session
    # has none: it is in the job, below no rank
    rank = make_task(
        "python3", pid=910, parent_comm="pt_elastic", uid=0, env=RANK_ENV, parent_job=LAUNCHER
    )
    sibling = make_task(
        "python3", pid=911, session=900, parent_comm="pt_elastic", uid=0, parent_job=LAUNCHER
    )
    assert cls.classify(rank).name == "trainer"
    assert cls.classify(sibling).name == "rest"
    assert sibling.process.job is not None and sibling.process.job.role == "other"


def test_session_nice_keep_leaves_the_session_weight() -> None:
    text = b"""version = 1
[preempt]
session_nice = "keep"
[[layer]]
name = "job"
comment = "c"
match = [[{ uid = 0 }]]
preempt = true
[[layer]]
name = "rest"
comment = "c"
match = [[]]
preemptible = true
"""
    policy = parse_policy(text, "<t>")
    planner, cls = _planner(policy, demoted={700})
    tp = _decide(planner, cls, make_task("x", pid=700, uid=1000))
    assert (tp.policy, tp.group_nice) == ("idle", None)


def test_no_autogroups_no_session_weight() -> None:
    planner, cls = _planner(load_default(), demoted={700}, autogroup=False)
    tp = _decide(planner, cls, make_task("x", pid=700, uid=1000))
    assert (tp.policy, tp.group_nice) == ("idle", None)


def _realtime_comms():
    """The default policy with its comm threads SCHED_FIFO 20 (as it had them before)."""
    text = (
        (REPO_POLICY)
        .read_text()
        .replace(
            'kind = "open"\n',
            'kind = "open"\nsched = { policy = "fifo", priority = 20 }\n',
            1,  # the first layer's: comms
        )
    )
    assert 'policy = "fifo"' in text
    return parse_policy(text.encode(), "training-rt-comms.toml")


def test_a_runaway_real_time_thread_gets_normal_scheduling() -> None:
    policy = _realtime_comms()
    comm = make_task(
        "gloo_tcp_loop", pid=910, tid=915, leader=False, uid=0, env=RANK_ENV, parent_job=LAUNCHER
    )
    planner, cls = _planner(policy)
    assert _decide(planner, cls, comm).policy == "fifo"
    planner, cls = _planner(policy, runaways={comm.key})
    tp = _decide(planner, cls, comm)
    assert (tp.policy, tp.priority, tp.nice) == ("other", None, -20)


def _fields(proc) -> dict:
    return {f: getattr(proc, f) for f in proc.__dataclass_fields__}


def test_plan_carries_the_demoted_sessions() -> None:
    policy = load_default()
    topo = synth_topology()
    tasks = [make_task("stress-ng", pid=700, uid=1000)]
    p = plan(topo, Classifier(policy).classify_all(tasks), policy, demoted_sessions={700})
    assert p.demoted == (700,)
    assert p.to_json()["demoted_sessions"] == [700]
    assert [t.policy for t in p.tasks] == ["idle"]


# -- explanations ----------------------------------------------------------------------------------
def test_explain_says_what_preemptible_means_and_what_is_live() -> None:
    policy = load_default()
    lines = explain(policy, "rest", tid=5, session=500, kept_because=None, live=None)
    assert "preemptible" in lines[0] and "SCHED_IDLE" in lines[0] and "nice 19" in lines[0]
    live = {
        "active": True,
        "demoted": [{"session": 500, "seconds": 12, "demand_at_demotion": 1.5}],
        "recent": [{"tid": 5, "what": "boost", "why": "runnable for 5 s without running"}],
    }
    lines = explain(policy, "rest", tid=5, session=500, kept_because=None, live=live)
    assert any("DEMOTED" in ln and "1.50 CPUs" in ln for ln in lines)
    assert any("guard: boost" in ln for ln in lines)
    lines = explain(policy, "rest", tid=5, session=500, kept_because="an interactive session")
    assert any("never demoted: an interactive session" in ln for ln in lines)
    assert "preempt:" in explain(policy, "trainer", tid=5, session=5, kept_because=None)[0]
    assert explain(policy, "system", tid=5, session=5, kept_because=None) == []


def test_the_boost_beats_every_real_time_layer() -> None:
    from hostd.agent.watch import boost_value

    assert boost_value(load_default()) == ["fifo", 1, True]  # no real-time layer
    assert boost_value(_realtime_comms()) == ["fifo", 21, True]  # comms fifo 20


def test_bursts_of_the_fair_server_do_not_hide_starvation() -> None:
    """Sampled every 0.2 s, a thread under a real-time hog runs 50 ms once a second: some
    rounds show 25 % run, the window since it became runnable shows 5 %."""
    w = Watch(Preempt(interval=0.2), Guard(starve_after=1.0), PREEMPTIBLE)
    run = wait = 0.0
    boosted = []
    for i in range(16):
        if i and i % 5 == 0:
            run += 50
        wait += 95
        d = w.update(i * 0.2, [sample(21, run, wait)], active=True)
        if d.boost:
            boosted.append(i)
    assert boosted and boosted[0] <= 6


def test_short_lived_processes_count_through_their_sessions_cpu_time() -> None:
    """A build's compilers live less than a round: no thread of theirs has two samples, but the
    CPU time of the session's processes (and of the children they reaped) shows the work."""
    w = watch(busy=0.5)
    d = w.update(0.0, [], active=True, process_demand={600: 1.7})
    assert [(x.sid, x.demand) for x in d.demote] == [(600, 1.7)]
    w = watch(busy=0.5)
    assert not w.update(0.0, [], active=True, process_demand={600: 0.3}).demote


def test_another_owners_real_time_thread_in_a_demoted_session_keeps_its_policy() -> None:
    planner, cls = _planner(load_default(), demoted={700})
    rt = make_task("spinner", pid=700, uid=1000)
    rt.policy, rt.rt_priority = 1, 50  # SCHED_FIFO 50, set by its owner
    tp = _decide(planner, cls, rt)
    assert tp.policy is None and tp.group_nice == 19

"""The first-match classifier over synthetic threads: each predicate (and its negation),
first-match order, OR-of-AND groups, the catch-all, explanations, and where the default policy
puts the real threads of a PyTorch training job (FACTS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostd.classify import Classifier
from hostd.model.tasks import Process, Task
from hostd.policy import Policy, Predicate, load_default, load_policy, parse_policy

REPO = Path(__file__).resolve().parents[2]
GOOD = REPO / "tests" / "fixtures" / "policies" / "good"

RANK_PID = 4242
INDUCTOR_CMDLINE = (
    "/usr/bin/python3 /opt/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker"
    f"/__main__.py --parent={RANK_PID}"
)
TRAIN_CMDLINE = "/usr/bin/python3 -u train.py --epochs 3"
CUDA_FDS = ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl")


def make_task(
    comm: str = "python3",
    *,
    pid: int = 1000,
    leader: bool = True,
    tid: int | None = None,
    pcomm: str | None = None,
    parent_comm: str = "bash",
    cgroup: str = "/user.slice/user-1000.slice/session-1.scope",
    cmdline: str | None = None,
    exe: str | None = "/usr/bin/python3",
    uid: int = 1000,
    gid: int = 1000,
    nice: int = 0,
    gpu_devices: tuple[str, ...] = (),
    nvml: bool = False,
    kthread: bool = False,
    session: int | None = None,
    tty: bool = False,
) -> Task:
    """A thread with plausible defaults: a non-root user's single-threaded python3."""
    if tid is None:
        tid = pid if leader else pid + 7
    if kthread:
        cgroup, cmdline, exe, gpu_devices = "/", "", None, ()
    process = Process(
        pid=pid,
        start_time=100_000 + pid,
        comm=comm if pcomm is None else pcomm,
        ppid=1,
        parent_comm=parent_comm,
        cgroup=cgroup,
        cpuset="/",
        cmdline=comm if cmdline is None else cmdline,
        exe=exe,
        gpu_devices=tuple(sorted(gpu_devices)),
        nvml=nvml,
        is_kthread=kthread,
        session=pid if session is None else session,
        tty=tty,
    )
    return Task(
        tid=tid,
        start_time=100_000 + tid,
        comm=comm,
        state="S",
        uid=uid,
        gid=gid,
        nice=nice,
        policy=0,
        rt_priority=0,
        affinity=frozenset(range(4)),
        utime=0,
        stime=0,
        processor=0,
        process=process,
    )


def policy_of(*layers: tuple[str, str], catch_all: str = "rest") -> Policy:
    """A policy from (name, match) pairs, then a catch-all layer."""
    text = "version = 1\n"
    for name, match in (*layers, (catch_all, "[[]]")):
        text += f'\n[[layer]]\nname = "{name}"\ncomment = "test"\nmatch = {match}\n'
    return parse_policy(text.encode(), "<test>")


def one_predicate(predicate: str, negate: bool = False) -> Classifier:
    if negate:
        predicate = f"{{ not = {predicate} }}"
    return Classifier(policy_of(("hit", f"[[{predicate}]]")))


# -- each predicate -------------------------------------------------------------------------
# (predicate, a thread it matches, a thread it does not match)
PREDICATE_CASES = [
    ('{ comm_prefix = "pt_nccl" }', {"comm": "pt_nccl_watchdg"}, {"comm": "python3"}),
    (
        '{ comm_prefix = ["pt_data_worker", "pt_data_pin"] }',
        {"comm": "pt_data_pin"},
        {"comm": "pt_dat"},
    ),
    (
        '{ pcomm_prefix = "pt_elastic" }',
        {"comm": "pt_tcpstore_uv", "pcomm": "pt_elastic", "leader": False},
        {"comm": "pt_tcpstore_uv", "pcomm": "python3", "leader": False},
    ),
    (
        '{ parent_comm_prefix = "pt_elastic" }',
        {"parent_comm": "pt_elastic"},
        {"parent_comm": "bash"},
    ),
    (
        '{ cgroup_prefix = "/training.slice/" }',
        {"cgroup": "/training.slice/job-1.scope"},
        {"cgroup": "/user.slice/training.slice/job-1.scope"},
    ),
    (
        '{ cgroup_suffix = [".scope", ".service"] }',
        {"cgroup": "/system.slice/trainer.service"},
        {"cgroup": "/x/job.scope/sub"},
    ),
    (
        '{ cgroup_contains = "job-" }',
        {"cgroup": "/kubepods/job-17/rank0"},
        {"cgroup": "/kubepods/job17/rank0"},
    ),
    (
        '{ cgroup_regex = "/job-[0-9]+/" }',
        {"cgroup": "/training.slice/job-17/rank0"},
        {"cgroup": "/training.slice/job-x/rank0"},
    ),
    (
        '{ comm_regex = "^pt_autograd_[0-9]+$" }',
        {"comm": "pt_autograd_0"},
        {"comm": "pt_autograd_x"},
    ),
    (
        '{ cmdline_regex = "torch/_inductor/compile_worker" }',  # searched, not anchored
        {"cmdline": INDUCTOR_CMDLINE},
        {"cmdline": TRAIN_CMDLINE},
    ),
    ('{ exe = "/usr/bin/python3" }', {"exe": "/usr/bin/python3"}, {"exe": "/usr/bin/python3.11"}),
    ('{ exe = "/usr/bin/python3" }', {"exe": "/usr/bin/python3"}, {"exe": None}),
    ("{ uid = 0 }", {"uid": 0}, {"uid": 1000}),
    ("{ uid = [1000, 1001] }", {"uid": 1001}, {"uid": 0}),
    ("{ gid = [27] }", {"gid": 27}, {"gid": 0}),
    ("{ nice_above = 5 }", {"nice": 6}, {"nice": 5}),
    ("{ nice_below = -5 }", {"nice": -6}, {"nice": -5}),
    ("{ is_group_leader = true }", {"leader": True}, {"leader": False}),
    ("{ is_group_leader = false }", {"leader": False}, {"leader": True}),
    ("{ is_kthread = true }", {"comm": "kworker/0:1", "kthread": True}, {"comm": "kworker/0:1"}),
    ("{ is_kthread = false }", {}, {"kthread": True}),
    ("{ gpu = true }", {"gpu_devices": CUDA_FDS}, {}),
    ("{ gpu = true }", {"gpu_devices": ("/dev/kfd",)}, {"gpu_devices": ()}),
    ("{ gpu = false }", {}, {"gpu_devices": ("/dev/nvidia3",)}),
    ("{ nvml_gpu_process = true }", {"nvml": True}, {"nvml": False}),
    ("{ nvml_gpu_process = false }", {"nvml": False}, {"nvml": True}),
    # torchrun starts each rank in a session of its own; a process it forks that does not
    # call setsid is in the launcher's session (issue: busy processes with the ranks' comm)
    ("{ session_leader = true }", {"pid": 4000}, {"pid": 4000, "session": 3990}),
    ("{ session_leader = false }", {"pid": 4000, "session": 1}, {"pid": 4000}),
]


def _case_id(case: tuple[str, dict, dict]) -> str:
    return case[0].strip("{} ").split(" ")[0] + ("" if len(case[0]) < 60 else "...")


@pytest.mark.parametrize(
    ("predicate", "hit", "miss"),
    PREDICATE_CASES,
    ids=[f"{i}-{_case_id(c)}" for i, c in enumerate(PREDICATE_CASES)],
)
def test_predicate(predicate: str, hit: dict, miss: dict) -> None:
    classifier = one_predicate(predicate)
    assert classifier.classify(make_task(**hit)).name == "hit"
    assert classifier.classify(make_task(**miss)).name == "rest"


@pytest.mark.parametrize(
    ("predicate", "hit", "miss"),
    PREDICATE_CASES,
    ids=[f"{i}-not-{_case_id(c)}" for i, c in enumerate(PREDICATE_CASES)],
)
def test_negated_predicate(predicate: str, hit: dict, miss: dict) -> None:
    classifier = one_predicate(predicate, negate=True)
    assert classifier.classify(make_task(**hit)).name == "rest"
    assert classifier.classify(make_task(**miss)).name == "hit"


def test_every_predicate_has_a_case() -> None:
    from hostd.policy import PREDICATES

    used = {c[0].strip("{} ").split(" ")[0] for c in PREDICATE_CASES}
    assert used == set(PREDICATES)


# -- order, groups, catch-all -----------------------------------------------------------------
def test_first_match_wins_over_a_more_specific_later_layer() -> None:
    classifier = Classifier(
        policy_of(
            ("broad", '[[{ comm_prefix = "pt_" }]]'), ("nccl", '[[{ comm_prefix = "pt_nccl" }]]')
        )
    )
    task = make_task("pt_nccl_watchdg")
    assert classifier.classify(task).name == "broad"
    explanation = classifier.explain(task)
    assert [r.layer for r in explanation.layers] == ["broad"]  # stops at the winner


def test_layer_order_is_the_file_order() -> None:
    classifier = Classifier(
        policy_of(
            ("nccl", '[[{ comm_prefix = "pt_nccl" }]]'), ("broad", '[[{ comm_prefix = "pt_" }]]')
        )
    )
    assert classifier.classify(make_task("pt_nccl_watchdg")).name == "nccl"
    assert classifier.classify(make_task("pt_gloo_runloop")).name == "broad"


OR_OF_AND = policy_of(
    ("fast", '[[{ comm_prefix = "pt_nccl" }, { uid = 0 }], [{ gpu = true }]]'),
)


@pytest.mark.parametrize(
    ("task", "layer", "group"),
    [
        (make_task("pt_nccl_watchdg", uid=0), "fast", 0),  # both of group 0
        (make_task("pt_nccl_watchdg", uid=1000), "rest", 0),  # half of group 0 only
        (make_task("python3", uid=0), "rest", 0),  # the other half only
        (make_task("python3", gpu_devices=CUDA_FDS), "fast", 1),  # group 1
        (make_task("pt_nccl_watchdg", uid=0, gpu_devices=CUDA_FDS), "fast", 0),  # first group
    ],
    ids=["and-both", "and-comm-only", "and-uid-only", "or-second-group", "both-groups"],
)
def test_or_of_and(task: Task, layer: str, group: int) -> None:
    classifier = Classifier(OR_OF_AND)
    got_layer, got_group = classifier.matched_group(task)
    assert (got_layer.name, got_group) == (layer, group)
    (classified,) = classifier.classify_all([task])
    assert (classified.layer, classified.group, classified.task) == (layer, group, task)
    explanation = classifier.explain(task)
    assert (explanation.layer, explanation.group) == (layer, group)


def test_catch_all_takes_what_nothing_else_matches() -> None:
    classifier = Classifier(policy_of(("a", "[[{ uid = 0 }]]"), catch_all="leftovers"))
    task = make_task("bash", uid=1000)
    assert classifier.classify(task).name == "leftovers"
    assert classifier.matched_group(task)[1] == 0


def test_catch_all_with_groups_before_its_empty_group() -> None:
    text = (
        'version = 1\n[[layer]]\nname = "a"\ncomment = "c"\nmatch = [[{ gpu = true }]]\n'
        '[[layer]]\nname = "rest"\ncomment = "c"\nmatch = [[{ uid = 0 }], []]\n'
    )
    classifier = Classifier(parse_policy(text.encode(), "<t>"))
    assert classifier.matched_group(make_task(uid=0))[1] == 0
    assert classifier.matched_group(make_task(uid=1000))[1] == 1
    assert classifier.explain(make_task(uid=1000)).group == 1


def test_classify_all_keeps_input_order() -> None:
    classifier = Classifier(OR_OF_AND)
    tasks = [make_task("a", pid=3), make_task("pt_nccl_x", pid=1, uid=0), make_task("b", pid=2)]
    assert [c.task.tid for c in classifier.classify_all(tasks)] == [3, 1, 2]
    assert [c.layer for c in classifier.classify_all(tasks)] == ["rest", "fast", "rest"]


# -- explain ----------------------------------------------------------------------------------
def test_explain_names_the_failing_predicate_and_actual_value() -> None:
    classifier = Classifier(load_default())
    # a non-root CPU-only rank: parent pt_elastic but not uid 0, so the trainer's gate fails
    task = make_task("python3", pid=RANK_PID, parent_comm="pt_elastic", uid=1000)
    explanation = classifier.explain(task)
    assert explanation.layer == "rest" and explanation.group == 0
    assert [r.layer for r in explanation.layers] == [
        "comms",
        "data",
        "helpers",
        "trainer",
        "compile",
        "system",
        "rest",
    ]
    assert [r.matched for r in explanation.layers] == [False] * 6 + [True]
    comms = explanation.layers[0]
    assert [g.failed.name for g in comms.groups] == ["comm_prefix"] * 3
    assert all(g.actual == "python3" and not g.matched for g in comms.groups)
    trainer = explanation.layers[3]
    assert [(g.failed, g.actual) for g in trainer.groups] == [
        (Predicate("gpu", True), False),
        (Predicate("nvml_gpu_process", True), False),
        (Predicate("uid", (0,)), 1000),  # parent_comm_prefix passed; uid is the first failure
    ]
    compile_ = explanation.layers[4]
    assert compile_.groups[0].failed.name == "cmdline_regex"
    assert compile_.groups[0].actual == "python3"  # make_task's default cmdline is the comm
    lines = explanation.lines()
    assert "layer 'trainer': no match" in lines
    assert "  group 2: uid = 0 failed (uid is 1000)" in lines
    assert "  group 0: gpu = true failed (GPU devices open is False)" in lines
    assert lines[-1] == "layer 'rest': MATCHED by group 0"


def test_explain_matched_group_and_gpu_devices_shown() -> None:
    classifier = Classifier(load_default())
    task = make_task(
        "pt_data_worker", pid=5000, parent_comm="python3", uid=1000, gpu_devices=CUDA_FDS
    )
    explanation = classifier.explain(task)
    assert (explanation.layer, explanation.group) == ("data", 0)
    comms = explanation.layers[0]
    # the comm test fails first, so the gpu part of comms' groups is never reached
    assert comms.groups[0].failed == Predicate(
        "comm_prefix", ("pt_nccl", "NCCL", "gloo_tcp_loop", "pt_gloo")
    )
    assert comms.groups[0].actual == "pt_data_worker"
    assert explanation.lines()[-1] == "layer 'data': MATCHED by group 0"

    # a thread that fails on `gpu` shows the devices it does hold (here: none of them)
    trainer = Classifier(policy_of(("t", "[[{ gpu = false }]]")))
    failed = trainer.explain(make_task(gpu_devices=CUDA_FDS)).layers[0].groups[0]
    assert failed.failed == Predicate("gpu", False)
    assert failed.actual == list(CUDA_FDS)


def test_explain_shows_negated_predicates() -> None:
    classifier = Classifier(load_default())
    # a kernel thread whose name starts like the C++ compiler's: `not is_kthread` keeps it out
    task = make_task("ld", kthread=True, uid=0)
    explanation = classifier.explain(task)
    assert explanation.layer == "rest"
    compile_ = explanation.layers[4]
    assert compile_.groups[1].failed == Predicate("is_kthread", True, negate=True)
    assert compile_.groups[1].actual is True
    assert "  group 1: not (is_kthread = true) failed (is kernel thread is True)" in (
        explanation.lines()
    )


# -- the default policy on the real names of a PyTorch job (FACTS.md) ------------------------
def rank(comm: str = "python3", **kw: object) -> Task:
    """A thread of a torchrun rank: the process keeps the interpreter's name, its parent is
    the launcher (pt_elastic); by default root and CPU-only, as measured in FACTS.md."""
    args: dict = {
        "pid": RANK_PID,
        "pcomm": "python3",
        "parent_comm": "pt_elastic",
        "cmdline": TRAIN_CMDLINE,
        "uid": 0,
        "gid": 0,
        "leader": comm == "python3",
    }
    args.update(kw)
    return make_task(comm, **args)


def data_worker(**kw: object) -> Task:
    """A DataLoader worker: a process forked from the rank and renamed, with its cmdline."""
    args: dict = {
        "pid": 5001,
        "parent_comm": "python3",
        "cmdline": TRAIN_CMDLINE,
        "uid": 0,
        "gid": 0,
    }
    args.update(kw)
    return make_task("pt_data_worker", **args)


DEFAULT_CASES = [
    ("rank main thread, root, CPU", rank(), "trainer", 2),
    ("rank OpenMP worker (python3, tid != pid)", rank(leader=False), "trainer", 2),
    ("rank main thread, not root, CPU", rank(uid=1000, gid=1000), "rest", 0),
    ("rank main thread, CUDA fds", rank(uid=1000, gpu_devices=CUDA_FDS), "trainer", 0),
    ("rank main thread, in NVML only", rank(uid=1000, nvml=True), "trainer", 1),
    ("rank on ROCm (/dev/kfd)", rank(uid=1000, gpu_devices=("/dev/kfd",)), "trainer", 0),
    ("pt_data_worker, root", data_worker(), "data", 2),
    ("pt_data_worker thread (tid != pid)", data_worker(leader=False), "data", 2),
    ("pt_data_worker of a CUDA rank", data_worker(uid=1000, gpu_devices=CUDA_FDS), "data", 0),
    ("pt_data_worker, in NVML", data_worker(uid=1000, nvml=True), "data", 1),
    ("pt_data_worker, not root, CPU", data_worker(uid=1000), "rest", 0),
    ("pt_data_pin thread of a CUDA rank", rank("pt_data_pin", gpu_devices=CUDA_FDS), "data", 0),
    ("gloo_tcp_loop, root CPU rank", rank("gloo_tcp_loop"), "comms", 2),
    ("pt_gloo_runloop, root CPU rank", rank("pt_gloo_runloop"), "comms", 2),
    ("gloo_tcp_loop, non-root CPU rank", rank("gloo_tcp_loop", uid=1000), "rest", 0),
    (
        "pt_nccl_watchdg, CUDA rank",
        rank("pt_nccl_watchdg", uid=1000, gpu_devices=CUDA_FDS),
        "comms",
        0,
    ),
    ("pt_nccl_heartbt, NVML rank", rank("pt_nccl_heartbt", uid=1000, nvml=True), "comms", 1),
    ("NCCL Progress 3, CUDA rank", rank("NCCL Progress 3", gpu_devices=CUDA_FDS), "comms", 0),
    (
        "pt_autograd_0, CUDA rank",
        rank("pt_autograd_0", uid=1000, gpu_devices=CUDA_FDS),
        "trainer",
        0,
    ),
    (
        "cc1plus, child of g++",
        make_task(
            "cc1plus",
            pid=6000,
            parent_comm="g++",
            exe="/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus",
            uid=0,
        ),
        "compile",
        1,
    ),
    (
        "g++, child of the rank",
        make_task("g++", pid=6001, parent_comm="python3", uid=0),
        "compile",
        1,
    ),
    (
        "Inductor compile worker (cmdline only)",
        make_task("python3", pid=6100, parent_comm="python3", cmdline=INDUCTOR_CMDLINE, uid=0),
        "compile",
        0,
    ),
    (
        "Inductor compile worker's pool thread",
        make_task(
            "python3", pid=6100, leader=False, parent_comm="python3", cmdline=INDUCTOR_CMDLINE
        ),
        "compile",
        0,
    ),
    (
        "pt_elastic launcher",
        make_task("pt_elastic", pid=4000, parent_comm="bash", uid=0),
        "helpers",
        0,
    ),
    (
        "pt_tcpstore_uv thread of the launcher",
        make_task("pt_tcpstore_uv", pid=4000, pcomm="pt_elastic", leader=False, uid=0),
        "helpers",
        0,
    ),
    (
        # Seen on an H100 node (torch 2.11): the launcher initializes CUDA and holds
        # /dev/nvidia0, nvidiactl and nvidia-uvm. It is no rank: as trainer it would shield its
        # whole session (busy processes it started among them) from preemption.
        "pt_elastic launcher holding GPU-driver fds",
        make_task("pt_elastic", pid=4000, parent_comm="bash", uid=1000, gpu_devices=CUDA_FDS),
        "helpers",
        0,
    ),
    (
        "an unnamed thread of a launcher holding GPU-driver fds",
        make_task(
            "python3", pid=4000, pcomm="pt_elastic", leader=False, uid=1000, gpu_devices=CUDA_FDS
        ),
        "helpers",
        0,
    ),
    (
        # FACTS.md: CUDA driver threads live in the CUDA process, which holds /dev/nvidia*,
        # so the trainer layer's `gpu = true` takes them before "helpers" is tried.
        "cuda-EvtHandlr of a CUDA rank",
        rank("cuda-EvtHandlr", uid=1000, gpu_devices=CUDA_FDS),
        "trainer",
        0,
    ),
    ("kworker kernel thread", make_task("kworker/3:1H", pid=90, kthread=True, uid=0), "rest", 0),
    ("an interactive shell", make_task("bash", exe="/usr/bin/bash"), "rest", 0),
    (
        "a user thread renamed pt_nccl_watchdg (no GPU, not root)",
        make_task("pt_nccl_watchdg", parent_comm="pt_elastic"),
        "rest",
        0,
    ),
    (
        "a user's process renamed pt_data_worker (no GPU, not root)",
        make_task("pt_data_worker", parent_comm="python3"),
        "rest",
        0,
    ),
]


@pytest.mark.parametrize(
    ("task", "layer", "group"),
    [pytest.param(t, ly, g, id=desc) for desc, t, ly, g in DEFAULT_CASES],
)
def test_default_policy_places_real_threads(task: Task, layer: str, group: int) -> None:
    classifier = Classifier(load_default())
    assert classifier.classify(task).name == layer
    assert classifier.matched_group(task) == (classifier.policy.layer(layer), group)
    explanation = classifier.explain(task)
    assert (explanation.layer, explanation.group) == (layer, group)


def test_default_policy_rt_layers_need_a_gate() -> None:
    """No thread of a non-root, GPU-less user lands in a real-time layer, whatever its names."""
    classifier = Classifier(load_default())
    names = ["pt_nccl_watchdg", "NCCL Service 1", "gloo_tcp_loop", "pt_data_worker", "python3"]
    for comm in names:
        for parent in ("pt_elastic", "bash", "python3"):
            task = make_task(comm, parent_comm=parent, pcomm=comm)
            assert not classifier.classify(task).sched.realtime, (comm, parent)


# -- property: classify and explain agree ---------------------------------------------------
NAMES = [
    "python3",
    "pt_elastic",
    "pt_tcpstore_uv",
    "pt_data_worker",
    "pt_data_pin",
    "gloo_tcp_loop",
    "pt_gloo_runloop",
    "pt_nccl_watchdg",
    "pt_nccl_heartbt",
    "NCCL Progress 1",
    "pt_autograd_0",
    "cuda-EvtHandlr",
    "cc1plus",
    "g++",
    "ld",
    "kworker/0:1",
    "bash",
]
CGROUPS = ["/", "/training.slice/job-1.scope", "/user.slice/user-1000.slice", "/kubepods/job-3/x"]
CMDLINES = ["", TRAIN_CMDLINE, INDUCTOR_CMDLINE, "bash --login"]
DEVICES = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/kfd", "/dev/accel/accel0"]
comm_text = st.text(max_size=15)


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    return make_task(
        draw(st.sampled_from(NAMES) | comm_text),
        pid=draw(st.integers(1, 2**22)),
        leader=draw(st.booleans()),
        pcomm=draw(st.none() | st.sampled_from(NAMES) | comm_text),
        parent_comm=draw(st.sampled_from(NAMES) | comm_text),
        cgroup=draw(st.sampled_from(CGROUPS) | st.text(max_size=40)),
        cmdline=draw(st.none() | st.sampled_from(CMDLINES) | st.text(max_size=80)),
        exe=draw(st.none() | st.sampled_from(["/usr/bin/python3", "/opt/conda/bin/python"])),
        uid=draw(st.sampled_from([0, 1000, 1001]) | st.integers(0, 2**32 - 1)),
        gid=draw(st.sampled_from([0, 27, 1000]) | st.integers(0, 2**32 - 1)),
        nice=draw(st.integers(-20, 19)),
        gpu_devices=tuple(draw(st.sets(st.sampled_from(DEVICES), max_size=3))),
        nvml=draw(st.booleans()),
        kthread=draw(st.booleans()),
    )


CLASSIFIERS = [
    Classifier(load_default()),
    Classifier(load_policy(GOOD / "every-predicate.toml")),
    Classifier(load_policy(GOOD / "sched-all.toml")),
]


@settings(max_examples=300, deadline=None)
@given(task=tasks(), which=st.sampled_from(range(len(CLASSIFIERS))))
def test_classify_always_returns_the_layer_explain_names(task: Task, which: int) -> None:
    classifier = CLASSIFIERS[which]
    layer = classifier.classify(task)
    assert layer in classifier.policy.layers
    explanation = classifier.explain(task)
    assert explanation.layer == layer.name
    assert classifier.matched_group(task) == (layer, explanation.group)
    *earlier, last = explanation.layers
    assert last.layer == layer.name and last.matched
    assert last.groups[explanation.group].matched
    assert not any(g.matched for g in last.groups[: explanation.group])
    assert all(not r.matched for r in earlier)
    assert all(g.failed is not None for r in earlier for g in r.groups)
    assert explanation.lines()[-1] == f"layer {layer.name!r}: MATCHED by group {explanation.group}"

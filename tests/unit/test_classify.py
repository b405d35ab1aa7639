"""The first-match classifier over synthetic threads: each predicate (and its negation),
first-match order, OR-of-AND groups, the catch-all, explanations, and where the default policy
puts the real threads of a PyTorch training job (FACTS.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostd.classify import Classifier
from hostd.model.jobs import Job, job_of
from hostd.model.node import KERNEL, Place, place
from hostd.model.tasks import GPU_DEVICE_PREFIXES, Process, Task
from hostd.policy import (
    Policy,
    Predicate,
    default_policy_bytes,
    load_default,
    load_policy,
    parse_policy,
)

REPO = Path(__file__).resolve().parents[2]
GOOD = REPO / "tests" / "fixtures" / "policies" / "good"

RANK_PID = 4242
INDUCTOR_CMDLINE = (
    "/usr/bin/python3 /opt/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker"
    f"/__main__.py --parent={RANK_PID}"
)
TRAIN_CMDLINE = "/usr/bin/python3 -u train.py --epochs 3"
CUDA_FDS = ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl")
RANK3 = Job("torchrun r1", "rank", 3, RANK_PID, False, "rank 3 from its environment")
RANK3_GPU = Job("torchrun r1", "rank", 3, RANK_PID, True, "rank 3 from its environment")
DATA3 = Job("torchrun r1", "data", 3, RANK_PID, True, "pt_data_worker below the rank")


UID = "1b2c3d4e-0000-1111-2222-333344445555"
SESSION = "/user.slice/user-1000.slice/session-4.scope"
KUBE_PROXY = place(
    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
    f"{UID.replace('-', '_')}.slice/cri-containerd-{'c' * 64}.scope"
).with_pod("kube-system", "kube-proxy-x7")


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
    env: dict[str, str] | None = None,
    parent_job: Job | None = None,
    rank_gpu: bool = False,
    job: Job | str | None = "derived",
    activity: str = "",
    node: Place | None = None,
) -> Task:
    """A thread with plausible defaults: a non-root user's single-threaded python3. Its job is
    derived as hostd.tasks derives it (from ``env``, the cmdline, the cgroup and the parent's
    job ``parent_job``) unless ``job`` gives one."""
    if tid is None:
        tid = pid if leader else pid + 7
    if kthread:
        cgroup, cmdline, exe, gpu_devices = "/", "", None, ()
    if job == "derived":
        job = (
            None
            if kthread
            else job_of(
                pid=pid,
                comm=comm if pcomm is None else pcomm,
                cmdline=comm if cmdline is None else cmdline,
                cgroup=cgroup,
                env=env or {},
                gpu=nvml or any(d.startswith(GPU_DEVICE_PREFIXES) for d in gpu_devices),
                parent=parent_job,
                parent_comm=parent_comm,
                rank_gpu=rank_gpu,
            )
        )
    assert not isinstance(job, str)
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
        env=tuple(sorted((env or {}).items())),
        job=job,
        node=node or (KERNEL if kthread else place(cgroup)),
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
        activity=activity,
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
    ("{ job = true }", {"job": RANK3}, {}),
    ("{ job = false }", {}, {"job": DATA3}),
    ('{ job_role = "rank" }', {"job": RANK3}, {"job": DATA3}),
    ('{ job_role = ["data", "compile"] }', {"job": DATA3}, {}),
    # the rank's GPU (DATA3: forked from a forkserver, it holds none itself), or its own
    ("{ job_gpu = true }", {"job": DATA3}, {"job": RANK3}),
    ("{ job_gpu = true }", {"job": RANK3, "gpu_devices": CUDA_FDS}, {"gpu_devices": CUDA_FDS}),
    ("{ job_gpu = false }", {"job": RANK3}, {"job": RANK3_GPU}),
    # torchrun starts each rank in a session of its own; a process it forks that does not
    # call setsid is in the launcher's session (issue: busy processes with the ranks' comm)
    ("{ session_leader = true }", {"pid": 4000}, {"pid": 4000, "session": 3990}),
    ("{ session_leader = false }", {"pid": 4000, "session": 1}, {"pid": 4000}),
    # what an unnamed thread of a job was seen doing (hostd.tasks reads it from /proc)
    ('{ activity = "polls" }', {"activity": "polls"}, {"activity": "waits"}),
    ('{ activity = ["polls", "rdma-events"] }', {"activity": "rdma-events"}, {"activity": ""}),
    # the node model (hostd.model.node): from the cgroup path, and the managers' records
    (
        '{ node = "container" }',
        {"cgroup": f"/system.slice/docker-{'a' * 64}.scope"},
        {"cgroup": "/system.slice/docker.service"},
    ),
    ('{ node = ["pod", "kernel"] }', {"kthread": True}, {}),
    (
        '{ unit = "ssh.service" }',
        {"cgroup": "/system.slice/ssh.service"},
        {"cgroup": "/user.slice/user-0.slice/session-4.scope/ssh.service"},
    ),
    (
        '{ pod_namespace = "kube-system" }',
        {"node": KUBE_PROXY},
        {"node": KUBE_PROXY.with_pod("default", "x")},
    ),
    (
        '{ pod_qos = "besteffort" }',
        {"cgroup": f"/kubepods/besteffort/pod{UID}/{'b' * 64}"},
        {"cgroup": f"/kubepods/pod{UID}/{'b' * 64}"},
    ),
    (
        "{ static_pod = true }",
        {"node": KUBE_PROXY.with_pod("kube-system", "etcd-n1", True)},
        {"node": KUBE_PROXY},
    ),
    (
        '{ login_service = "sshd" }',
        {"node": place(SESSION).with_login("sshd", False)},
        {"node": place(SESSION).with_login("cron", False)},
    ),
    (
        "{ login_tty = true }",
        {"node": place(SESSION).with_login("sshd", True)},
        {"node": place(SESSION).with_login("sshd", False)},
    ),
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
    # a non-root CPU-only rank of a torchrun job: a rank, but neither GPU nor root
    task = rank(uid=1000, gid=1000)
    explanation = classifier.explain(task)
    assert explanation.layer == "rest" and explanation.group == 0
    assert [r.layer for r in explanation.layers] == [
        "comms",
        "data",
        "helpers",
        "trainer",
        "compile",
        "gpu-services",
        "system",
        "rest",
    ]
    assert [r.matched for r in explanation.layers] == [False] * 7 + [True]
    comms = explanation.layers[0]
    assert [g.failed.name for g in comms.groups] == ["comm_prefix"] * 2 + ["activity"] * 2
    assert all(g.actual == "python3" and not g.matched for g in comms.groups[:2])
    assert comms.groups[2].actual is False  # a leader: what it does is not looked at
    trainer = explanation.layers[3]
    shown = "rank 3 of job torchrun r1 (rank 3 from its environment, started by pt_elastic)"
    assert [(g.failed, g.actual) for g in trainer.groups] == [
        (Predicate("job_gpu", True), shown),  # job_role passed; the GPU gate is what failed
        (Predicate("uid", (0,)), 1000),
    ]
    compile_ = explanation.layers[4]
    assert compile_.groups[0].failed.name == "job_role"
    assert compile_.groups[0].actual == shown
    lines = explanation.lines()
    assert "layer 'trainer': no match" in lines
    assert "  group 1: uid = 0 failed (uid is 1000)" in lines
    assert lines[-1] == "layer 'rest': MATCHED by group 0"


def test_explain_says_what_an_unnamed_thread_is() -> None:
    task = rank(leader=False, uid=1000, gpu_devices=CUDA_FDS)
    assert task.job_line() == "unnamed thread of rank 3 of job torchrun r1"
    named = rank("pt_autograd_0", uid=1000, gpu_devices=CUDA_FDS)
    assert named.job_line() == (
        "rank 3 of job torchrun r1 (rank 3 from its environment, started by pt_elastic)"
    )
    worker = data_worker(uid=1000, parent=FORKSERVER)
    assert worker.job_line() == (
        "data process of rank 3 of job torchrun r1 (pt_data_worker below the rank, pid "
        f"{RANK_PID} being the rank)"
    )
    assert make_task("bash").job_line() is None


def test_an_unnamed_thread_is_known_by_what_it_does() -> None:
    classifier = Classifier(load_default())
    kinds = {"polls": "comms", "rdma-events": "comms", "feeds": "data", "waits": "trainer",
             "runs": "trainer", "other": "trainer", "": "trainer"}  # fmt: skip
    for does, layer in kinds.items():
        task = rank(leader=False, uid=1000, gpu_devices=CUDA_FDS, activity=does)
        assert classifier.classify(task).name == layer, does
        # the gates hold: the same thread of a rank that holds no GPU (and is not root's)
        assert classifier.classify(rank(leader=False, uid=1000, activity=does)).name == "rest"
    task = rank(leader=False, uid=1000, gpu_devices=CUDA_FDS, activity="polls")
    assert "layer 'comms': MATCHED by group 2" in classifier.explain(task).lines()
    assert task.job_line() == (
        "unnamed thread of rank 3 of job torchrun r1, seen: polls (blocked in poll, select or "
        "epoll (NCCL's proxy service, UDS and RAS threads))"
    )


def test_explain_matched_group_and_gpu_devices_shown() -> None:
    classifier = Classifier(load_default())
    task = data_worker(uid=1000, gpu=True, gpu_devices=CUDA_FDS)
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
    assert compile_.groups[2].failed == Predicate("is_kthread", True, negate=True)
    assert compile_.groups[2].actual is True
    assert "  group 2: not (is_kthread = true) failed (is kernel thread is True)" in (
        explanation.lines()
    )


# -- the default policy on the real names of a PyTorch job (FACTS.md) ------------------------
LAUNCHER = Job("torchrun r1", "launcher", None, 0, False, "torchrun")
RANK_ENV = {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "r1"}
SLURM_STEP = "/system.slice/slurmstepd.scope/job_4242/step_0"
POD = (
    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c2d.slice/"
    "cri-containerd-9a8b.scope"
)


def rank(comm: str = "python3", **kw: object) -> Task:
    """A thread of a torchrun rank: the process keeps the interpreter's name, its parent is
    the launcher (pt_elastic), torchrun gave it RANK and its run id; by default root and
    CPU-only, as measured in FACTS.md."""
    args: dict = {
        "pid": RANK_PID,
        "pcomm": "python3",
        "parent_comm": "pt_elastic",
        "cmdline": TRAIN_CMDLINE,
        "uid": 0,
        "gid": 0,
        "leader": comm == "python3",
        "env": RANK_ENV,
        "parent_job": LAUNCHER,
    }
    args.update(kw)
    return make_task(comm, **args)


def of_rank(gpu: bool = False) -> Job:
    """The job of rank 3 itself (what its children inherit)."""
    task = rank(gpu_devices=CUDA_FDS if gpu else ())
    assert task.process.job is not None
    return task.process.job


def child(comm: str, *, gpu: bool = False, parent: Job | None = None, **kw: object) -> Task:
    """A process below rank 3 (forked by it, or by its forkserver: ``parent``), root unless
    ``uid`` says otherwise; ``gpu``: the rank holds GPU-driver files."""
    args: dict = {
        "pid": 5001,
        "parent_comm": "python3",
        "cmdline": TRAIN_CMDLINE,
        "uid": 0,
        "gid": 0,
        "env": RANK_ENV,
        "parent_job": parent or of_rank(gpu),
    }
    args.update(kw)
    return make_task(comm, **args)


def data_worker(**kw: object) -> Task:
    """A DataLoader worker: a process forked from the rank and renamed, with its cmdline."""
    return child("pt_data_worker", **kw)


FORKSERVER = child(
    "python3.14", gpu=True, cmdline="/usr/bin/python3.14 -c from multiprocessing.forkserver ..."
).process.job


DEFAULT_CASES = [
    ("rank main thread, root, CPU", rank(), "trainer", 1),
    ("rank OpenMP worker (python3, tid != pid)", rank(leader=False), "trainer", 1),
    ("rank main thread, not root, CPU", rank(uid=1000, gid=1000), "rest", 0),
    ("rank main thread, CUDA fds", rank(uid=1000, gpu_devices=CUDA_FDS), "trainer", 0),
    ("rank main thread, in NVML only", rank(uid=1000, nvml=True), "trainer", 0),
    ("rank on ROCm (/dev/kfd)", rank(uid=1000, gpu_devices=("/dev/kfd",)), "trainer", 0),
    (
        "rank on Gaudi (/dev/accel)",
        rank(uid=1000, gpu_devices=("/dev/accel/accel0",)),
        "trainer",
        0,
    ),
    ("rank on Trainium (/dev/neuron)", rank(uid=1000, gpu_devices=("/dev/neuron0",)), "trainer", 0),
    (
        "an unnamed NCCL thread of a CUDA rank (NCCL_SET_THREAD_NAME unset)",
        rank(leader=False, uid=1000, gpu_devices=CUDA_FDS),
        "trainer",
        0,
    ),
    ("pt_data_worker, root", data_worker(), "data", 2),
    ("pt_data_worker thread (tid != pid)", data_worker(leader=False), "data", 2),
    ("pt_data_worker of a CUDA rank", data_worker(uid=1000, gpu=True), "data", 0),
    (
        "pt_data_worker from a forkserver (Python 3.14), CUDA rank",
        data_worker(uid=1000, parent=FORKSERVER, parent_comm="python3.14"),
        "data",
        0,
    ),
    ("pt_data_worker, not root, CPU", data_worker(uid=1000), "rest", 0),
    ("pt_data_pin thread of a CUDA rank", rank("pt_data_pin", gpu_devices=CUDA_FDS), "data", 1),
    (
        "QueueFeederThre (Python 3.14) of a CUDA rank",
        rank("QueueFeederThre", uid=1000, gpu_devices=CUDA_FDS),
        "data",
        1,
    ),
    ("gloo_tcp_loop, root CPU rank", rank("gloo_tcp_loop"), "comms", 1),
    ("pt_gloo_runloop, root CPU rank", rank("pt_gloo_runloop"), "comms", 1),
    ("gloo_tcp_loop, non-root CPU rank", rank("gloo_tcp_loop", uid=1000), "rest", 0),
    (
        "pt_nccl_watchdg, CUDA rank",
        rank("pt_nccl_watchdg", uid=1000, gpu_devices=CUDA_FDS),
        "comms",
        0,
    ),
    ("pt_nccl_heartbt, NVML rank", rank("pt_nccl_heartbt", uid=1000, nvml=True), "comms", 0),
    ("NCCL Progress 3, CUDA rank", rank("NCCL Progress 3", gpu_devices=CUDA_FDS), "comms", 0),
    (
        "pt_autograd_0, CUDA rank",
        rank("pt_autograd_0", uid=1000, gpu_devices=CUDA_FDS),
        "trainer",
        0,
    ),
    (
        "Thread-2 (_serve) (Python 3.14) of a CUDA rank",
        rank("Thread-2 (_serv", uid=1000, gpu_devices=CUDA_FDS),
        "helpers",
        4,
    ),
    (
        # a busy process that says it is a rank, without a GPU and not root's: a thread it
        # names Thread-... does not escape preemption into helpers
        "Thread-1 of a rank without GPU, not root",
        rank("Thread-1", uid=1000, gid=1000),
        "rest",
        0,
    ),
    ("the forkserver below a rank", child("python3.14", gpu=True, uid=1000), "helpers", 2),
    ("wandb-core below a rank", child("wandb-core", gpu=True, uid=1000), "helpers", 2),
    ("a helper below a rank without GPU, not root", child("wandb-core", uid=1000), "rest", 0),
    (
        "cc1plus, child of another user's g++ (no job)",
        make_task(
            "cc1plus",
            pid=6000,
            parent_comm="g++",
            exe="/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus",
            uid=0,
        ),
        "compile",
        2,
    ),
    ("g++, child of the rank", child("g++", pid=6001), "compile", 0),
    ("ptxas, child of a CUDA rank", child("ptxas", pid=6002, gpu=True, uid=1000), "compile", 0),
    (
        "Inductor compile worker (cmdline only)",
        child("python3", pid=6100, cmdline=INDUCTOR_CMDLINE),
        "compile",
        0,
    ),
    (
        "Inductor compile worker's pool thread",
        child("python3", pid=6100, leader=False, cmdline=INDUCTOR_CMDLINE),
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
        "torchrun before it renames itself, in a Slurm step",
        make_task(
            "torchrun",
            pid=4000,
            parent_comm="slurmstepd",
            cmdline="/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 8 train.py",
            cgroup=SLURM_STEP + "/user/task_0",
            uid=1000,
        ),
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
        # FACTS.md: CUDA driver threads live in the CUDA process, which holds /dev/nvidia*.
        "cuda-EvtHandlr of a CUDA rank",
        rank("cuda-EvtHandlr", uid=1000, gpu_devices=CUDA_FDS),
        "trainer",
        0,
    ),
    (
        "a Slurm task (srun, no torchrun): SLURM_PROCID in its step, CUDA",
        make_task(
            "python3",
            pid=7000,
            parent_comm="slurmstepd",
            cgroup=SLURM_STEP + "/user/task_2",
            env={"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2"},
            uid=1000,
            gpu_devices=CUDA_FDS,
        ),
        "trainer",
        0,
    ),
    (
        "slurmstepd, the step's root daemon",
        make_task(
            "slurmstepd", pid=6990, cgroup=SLURM_STEP + "/slurm", uid=0, parent_comm="systemd"
        ),
        "system",
        0,
    ),
    (
        "a Kubernetes PyTorchJob rank (RANK, WORLD_SIZE), CUDA",
        make_task(
            "python",
            pid=7100,
            parent_comm="containerd-shim",
            cgroup=POD,
            env={"RANK": "1", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "MASTER_ADDR": "job-0"},
            uid=1000,
            gpu_devices=CUDA_FDS,
        ),
        "trainer",
        0,
    ),
    (
        "nvidia-persistenced (root, a system service, holds every GPU)",
        make_task(
            "nvidia-persiste",
            pid=800,
            cgroup="/system.slice/nvidia-persistenced.service",
            uid=0,
            gpu_devices=CUDA_FDS,
        ),
        "gpu-services",
        0,
    ),
    (
        "nv-hostengine (DCGM)",
        make_task(
            "nv-hostengine",
            pid=801,
            cgroup="/system.slice/nvidia-dcgm.service",
            uid=0,
            gpu_devices=CUDA_FDS,
        ),
        "gpu-services",
        0,
    ),
    # A GPU service is a service of the node; a pod, a container or a login holding a GPU is
    # competing work (rest), kept from demotion only where [preempt] keeps it (the GPU
    # operator's namespace: hostd.preempt.why_place_kept).
    (
        "dcgm-exporter in a pod, in NVML's list",
        make_task("dcgm-exporter", pid=802, cgroup=POD, uid=0, nvml=True),
        "rest",
        0,
    ),
    (
        "another user's python holding a GPU, no job",
        make_task("python3", pid=803, uid=1001, gpu_devices=CUDA_FDS),
        "rest",
        0,
    ),
    (
        "nvidia-persistenced on a host without systemd (the root cgroup)",
        make_task("nvidia-persiste", pid=806, cgroup="/", uid=118, gpu_devices=CUDA_FDS),
        "gpu-services",
        0,
    ),
    (
        "a GPU workload in a Docker container under system.slice",
        make_task(
            "python3",
            pid=807,
            cgroup=f"/system.slice/docker-{'d' * 64}.scope",
            uid=0,
            gpu_devices=CUDA_FDS,
        ),
        "rest",
        0,
    ),
    (
        "the kubelet",
        make_task("kubelet", pid=808, cgroup="/system.slice/kubelet.service", uid=0),
        "system",
        0,
    ),
    (
        "a busy container under system.slice (Docker, systemd's cgroup driver)",
        make_task("python3", pid=809, cgroup=f"/system.slice/docker-{'d' * 64}.scope", uid=0),
        "rest",
        0,
    ),
    (
        "a systemd-run unit",
        make_task("stress-ng", pid=810, cgroup="/system.slice/run-u12.service", uid=0),
        "rest",
        0,
    ),
    (
        "kube-proxy, a pod of kube-system",
        make_task("kube-proxy", pid=811, uid=0, node=KUBE_PROXY),
        "rest",
        0,
    ),
    (
        "another user's process that sets RANK and WORLD_SIZE, no GPU",
        make_task("python3", pid=804, uid=1001, env={"RANK": "0", "WORLD_SIZE": "1"}),
        "rest",
        0,
    ),
    (
        "root's shell that exports RANK and WORLD_SIZE: no job without a launcher or MASTER_ADDR",
        make_task("bash", pid=805, uid=0, tty=True, env={"RANK": "0", "WORLD_SIZE": "1"}),
        "rest",
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


def test_twins_that_do_different_things_are_classified_apart() -> None:
    """classify_all shares a decision between threads of a process that look alike to every
    predicate: two unnamed threads of a rank that do different things are no twins."""
    classifier = Classifier(load_default())
    rank_proc = rank(leader=False, uid=1000, gpu_devices=CUDA_FDS).process
    polls = make_task(pid=rank_proc.pid, tid=rank_proc.pid + 1, leader=False, activity="polls")
    waits = make_task(pid=rank_proc.pid, tid=rank_proc.pid + 2, leader=False, activity="waits")
    polls.process = waits.process = rank_proc
    polls.uid = waits.uid = 1000
    got = [c.layer for c in classifier.classify_all([polls, waits])]
    assert got == ["comms", "trainer"]


def test_the_event_path_shares_a_decision_between_twins_only(monkeypatch) -> None:
    """``Classifier.twin`` (an event pass's classification: 27 us a thread under the default
    policy, a look-up for a twin) keeps a decision for threads of the same process object that
    look alike to every predicate. A thread that does something else, or whose process changed
    (the cache makes a new object then, never changes one in place), is decided again."""
    classifier = Classifier(load_default())
    asked = []
    matched_group = classifier.matched_group
    monkeypatch.setattr(classifier, "matched_group", lambda t: asked.append(t) or matched_group(t))
    rank_proc = rank(leader=False, uid=1000, gpu_devices=CUDA_FDS).process

    def thread(tid: int, activity: str, process: Process = rank_proc) -> Task:
        task = make_task(pid=process.pid, tid=tid, leader=False, activity=activity)
        task.process, task.uid = process, 1000
        return task

    first, twin, waits = thread(4243, "polls"), thread(4244, "polls"), thread(4245, "waits")
    names = [classifier.twin(t)[0].name for t in (first, twin, waits)]
    assert names == ["comms", "comms", "trainer"]
    assert asked == [first, waits]  # the twin was a look-up
    refused = replace(rank_proc, env=(*rank_proc.env, ("HOSTD_PROTECT", "0")))
    moved = thread(4244, "polls", refused)
    got = classifier.twin(moved)
    assert asked[-1] is moved  # decided again: another process object
    assert got == matched_group(moved) and got[0].name != "comms"


def test_a_job_opts_out_of_protection_or_in_never_past_the_gates() -> None:
    """HOSTD_PROTECT in a job's environment: 0 is always honoured (none of the layers that
    protect); 1 only matters under [jobs] protect = false, and selects no more than the
    policy's unforgeable gates allow."""
    default = Classifier(load_default())
    wanted = rank(uid=1000, gpu_devices=CUDA_FDS)
    assert default.classify(wanted).name == "trainer"
    refused = rank(uid=1000, gpu_devices=CUDA_FDS, env={**RANK_ENV, "HOSTD_PROTECT": "0"})
    got = default.classify(refused).name
    assert got not in default.policy.protected and got != "trainer"
    lines = default.explain(refused).lines()
    assert "layer 'trainer': skipped: its job refuses protection (HOSTD_PROTECT)" in lines
    # a policy whose jobs are protected only when they ask
    text = default_policy_bytes().decode().replace("[agent]", "[jobs]\nprotect = false\n\n[agent]")
    opt_in = Classifier(parse_policy(text.encode(), "opt-in.toml"))
    assert opt_in.classify(wanted).name not in opt_in.policy.protected
    asked = rank(uid=1000, gpu_devices=CUDA_FDS, env={**RANK_ENV, "HOSTD_PROTECT": "1"})
    assert opt_in.classify(asked).name == "trainer"
    # asking gives nothing the gates do not: a rank without a GPU, not root's
    no_gpu = rank(uid=1000, env={**RANK_ENV, "HOSTD_PROTECT": "yes"})
    assert opt_in.classify(no_gpu).name == "rest"
    # a process outside any job is not concerned
    assert (
        opt_in.classify(make_task("sshd", uid=0)).name
        == default.classify(make_task("sshd", uid=0)).name
    )

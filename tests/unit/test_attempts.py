"""Job attempts: who an attempt is (from the launcher's environment and the cgroup), the record the
agent keeps of it on a fixture host, the metrics with their bounded labels, and the throughput
file a job names, read only when the job's user owns it."""

from __future__ import annotations

import json
import os

import pytest

from hostd.agent import Agent
from hostd.host import Host
from hostd.model.attempts import attempt_of, command_name, halve, parse_throughput
from hostd.model.jobs import Job
from hostd.reconcile import PassReport
from tests.fakes import FakeCalls, host_copy
from tests.unit.test_metrics import scrape

RANK = Job("torchrun 4000", "rank", 0, 4100, True, "test")
POD = (
    "/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-ab.scope"
)
STEP = "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"


@pytest.mark.parametrize(
    ("job", "env", "cgroup", "cmdline", "want"),
    [
        (RANK, {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NAME": "llama"},
         STEP, "python train.py", ("llama", "slurm 4242 restart 2", "slurm")),
        # no job name: the script; Slurm's default name for an interactive allocation says
        # nothing either; the job id only when there is no script
        (RANK, {"SLURM_JOB_ID": "4242"}, STEP, "python train.py",
         ("train.py", "slurm 4242 restart 0", "slurm")),
        (RANK, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "interactive"}, STEP, "python train.py",
         ("train.py", "slurm 4242 restart 0", "slurm")),
        (RANK, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "bash"}, STEP, "python -c x",
         ("slurm 4242", "slurm 4242 restart 0", "slurm")),
        # torchrun inside a Slurm job: Slurm's name and attempt
        (RANK, {"SLURM_JOB_ID": "9", "SLURM_JOB_NAME": "llama", "TORCHELASTIC_RUN_ID": "r7"},
         STEP, "python train.py", ("llama", "slurm 9 restart 0", "slurm")),
        # torchrun's run id is the attempt's; the job is the script it runs (issue 46)
        (RANK, {"TORCHELASTIC_RUN_ID": "r7", "TORCHELASTIC_RESTART_COUNT": "1"}, "/user.slice",
         "python train.py", ("train.py", "torchrun r7 restart 1", "torchrun")),
        (RANK, {"TORCHELASTIC_RUN_ID": "r7", "SLURM_JOB_NAME": "llama"}, "/", "python train.py",
         ("llama", "torchrun r7 restart 0", "torchrun")),
        # torchrun's default run id says nothing: the launcher and the script name it
        (RANK, {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}, "/",
         "/usr/bin/python3 -u /data/train.py --lr 1", ("train.py", "torchrun 4000 restart 0",
                                                       "command")),
        (RANK, {"RANK": "0"}, POD, "python -m trainer.main",
         ("-m trainer.main", "pod 1b2c3d4e-0000-1111-2222-333344445555", "kubernetes")),
        (RANK, {"TORCHELASTIC_RUN_ID": "r7", "HOSTD_JOB": "llama-70b"}, "/", "x",
         ("llama-70b", "torchrun r7 restart 0", "hostd")),
        (RANK, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama", "HOSTD_JOB": "llama-70b"},
         STEP, "python train.py", ("llama-70b", "slurm 4242 restart 0", "hostd")),
        # no script to name it (inline code): the run id, as a last resort
        (Job("torchrun 4000", "data", 0, 4100, True, "t"), {"TORCHELASTIC_RUN_ID": "r7"}, "/",
         "python", ("r7", "torchrun r7 restart 0", "torchrun")),
        (Job("torchrun 4000", "launcher", None, 0, False, "t"), {}, "/", "torchrun", None),
        (None, {"TORCHELASTIC_RUN_ID": "r7"}, "/", "python", None),
    ],
)  # fmt: skip
def test_attempt_of(job, env, cgroup, cmdline, want):
    rank_cmdline = cmdline if job is not None and job.role == "rank" else None
    got = attempt_of(job, env, cgroup, cmdline, rank_cmdline)
    assert (got and (got.job, got.attempt, got.source)) == want


def test_torchrun_launches_of_one_script_are_one_job():
    """Issue 46: each torchrun launch got its random run id as the job's name, so 11 launches of
    one script were 11 jobs of one attempt each. The script names the job; the run id keeps
    the attempts apart."""
    import uuid

    got = [
        attempt_of(RANK, {"TORCHELASTIC_RUN_ID": uuid.uuid4().hex[:12],
                          "TORCHELASTIC_RESTART_COUNT": "0"},
                   "/user.slice", "/usr/bin/python3 -u /home/ana/train.py --steps 500",
                   rank_cmdline="/usr/bin/python3 -u /home/ana/train.py --steps 500")
        for _ in range(11)
    ]  # fmt: skip
    assert {g.job for g in got} == {"train.py"}
    assert len({g.attempt for g in got}) == 11
    assert {g.source for g in got} == {"torchrun"}
    # a restart of one launch is one more attempt of the same job
    again = attempt_of(RANK, {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "1"},
                       "/", "python train.py", "python train.py")  # fmt: skip
    assert (again.job, again.attempt) == ("train.py", "torchrun abc restart 1")
    # what runs below a rank (a compiler, a data worker) is named by its rank's script
    for role, cmdline in (("compile", "/usr/lib/gcc/x86_64-linux-gnu/11/cc1plus -quiet x.cpp"),
                          ("data", "python train.py")):  # fmt: skip
        below = Job("torchrun 4000", role, 0, 4100, True, "t")
        got = attempt_of(below, {"TORCHELASTIC_RUN_ID": "abc"}, "/", cmdline, "python train.py")
        assert (got.job, got.attempt) == ("train.py", "torchrun abc restart 0")
    # no rank's command line (a caller that passes none): the run id, never the program's own
    got = attempt_of(Job("torchrun 4000", "compile", 0, 4100, True, "t"),
                     {"TORCHELASTIC_RUN_ID": "abc"}, "/", "cc1plus x.cpp")  # fmt: skip
    assert got.job == "abc"


def test_the_given_name_decides_in_order():
    """HOSTD_JOB, then the Slurm job name, then the script, then the run id."""
    env = {"TORCHELASTIC_RUN_ID": "f3a9", "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "pretrain",
           "HOSTD_JOB": "llama-ab"}  # fmt: skip
    names = []
    for drop in ("", "HOSTD_JOB", "SLURM_JOB_NAME", "SLURM_JOB_ID"):
        env.pop(drop, None)
        names.append(attempt_of(RANK, env, "/", "python train.py", "python train.py").job)
    names.append(attempt_of(RANK, env, "/", "python -c pass", "python -c pass").job)
    assert names == ["llama-ab", "pretrain", "train.py", "train.py", "f3a9"]


@pytest.mark.parametrize(
    ("cmdline", "want"),
    [
        ("python3 train.py --lr 1", "train.py"),
        ("/opt/conda/bin/python3.11 -u /w/pretrain.py", "pretrain.py"),
        ("python -m torch_xla.run x", "-m torch_xla.run"),
        ("/usr/local/bin/megatron-train --cfg a", "megatron-train"),
        ("", "unnamed"),
        # through a launcher: its script, not an option's value
        ("torchrun --nnodes 1 --nproc_per_node 8 train.py --lr 1", "train.py"),
        ("python -u -m torch.distributed.run --nproc-per-node=8 /w/train.py", "train.py"),
        ("torchrun --standalone -m trainer.main", "-m trainer.main"),
        ("env OMP_NUM_THREADS=4 python3 -W ignore train.py", "train.py"),
        # inline code has no script: the program names it
        ("python3 -c import os; os.sleep(1)", "python3"),
    ],
)
def test_command_name(cmdline, want):
    assert command_name(cmdline) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("12.5 steps/s\n", (12.5, "steps/s")),
        ("3000\n", (3000.0, "")),
        ("7 tokens/s extra words\nsecond line", (7.0, "tokens/s")),
        ("7 <script>\n", (7.0, "")),  # a unit that is no unit is dropped
        ("", None),
        ("fast\n", None),
        ("nan steps/s", None),
        ("-1 steps/s", None),
    ],
)
def test_parse_throughput(text, want):
    assert parse_throughput(text) == want


def test_halving_a_record_keeps_its_sums():
    samples = [
        {"t": float(i), "seconds": 1.0, "gpu_utilization": 0.5 if i % 2 else None,
         "throughput": float(i),
         "layers": {"trainer": {"cpu_seconds": 1.0, "wait_seconds": 0.1, "timeslices": 10,
                                "threads": 3}}}
        for i in range(5)
    ]  # fmt: skip
    out = halve(samples)
    assert [s["t"] for s in out] == [1.0, 3.0, 4.0]
    assert sum(s["seconds"] for s in out) == 5.0
    assert sum(s["layers"]["trainer"]["cpu_seconds"] for s in out) == 5.0
    assert sum(s["layers"]["trainer"]["timeslices"] for s in out) == 50
    assert out[0]["throughput"] == 0.5 and out[0]["gpu_utilization"] == 0.5
    assert out[0]["layers"]["trainer"]["threads"] == 3


def test_the_agent_records_an_attempt_and_labels_its_gpus(tmp_path):
    """Two samples of the fixture's torchrun job: one record, its GPUs as DCGM labels them, its
    CPU and wait per layer; the exporter shows it with job and attempt labels."""
    tree = host_copy(tmp_path)
    nvml = json.loads((tree / "nvml.json").read_text())
    nvml["utilization"] = {str(g["index"]): 0.5 + g["index"] / 100 for g in nvml["gpus"]}
    (tree / "nvml.json").write_text(json.dumps(nvml))
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), str(policy), state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe", allow_insecure_policy=True)  # fmt: skip
    agent.exporter.start()
    try:
        agent.pass_once()

        def write(run: int, wait: int, slices: int) -> None:
            for tid, item in agent.inc.classified.items():
                path = tree / "proc" / str(item.task.pid) / "task" / str(tid) / "schedstat"
                path.write_text(f"{run} {wait} {slices}\n")

        write(1_000_000, 0, 10)
        agent.layer_stats.sample()
        write(3_000_000, 400_000, 14)
        agent.layer_stats.sample()
        folder = tmp_path / "s" / "attempts"
        # the fixture's two ranks run as uid 1000 (GPU 0) and root (GPU 4): an attempt is its
        # user's (the environment that names it is the user's to write), so two records
        records = {}
        for path in folder.glob("u*-train.py-*.json"):
            rec = json.loads(path.read_text())
            records[rec["uid"]] = rec
        assert sorted(records) == [0, 1000]
        by_minor = {g["minor"]: g for g in nvml["gpus"]}
        job_threads = [
            c for c in agent.inc.classified.values()
            if c.task.process.job and c.task.process.job.role != "launcher"
        ]  # fmt: skip
        for uid, minor in ((1000, 0), (0, 4)):
            rec = records[uid]
            # the job is the script the ranks run (train.py), the attempt torchrun's run id
            assert (rec["job"], rec["attempt"], rec["source"]) == (
                "train.py", "torchrun dgx-job-17 restart 0", "torchrun",
            )  # fmt: skip
            assert rec["protected"] is False and "observe" in rec["why"]  # observe: no change
            assert rec["ranks"] == 1 and rec["end"] is None
            g = by_minor[minor]
            assert [(x["device"], x["UUID"], x["modelName"]) for x in rec["gpus"]] == [
                (f"nvidia{minor}", g["uuid"], g["name"])
            ]
            (sample,) = rec["samples"]
            mine = [c for c in job_threads if c.task.uid == uid]
            assert sum(v["threads"] for v in sample["layers"].values()) == len(mine)
            cpu = sum(v["cpu_seconds"] for v in sample["layers"].values())
            assert cpu == pytest.approx(0.002 * len(mine))
            util = nvml["utilization"][str(g["index"])]
            assert sample["gpu_utilization"] == pytest.approx(util)
            assert sample["throughput"] is None  # the fixture's job writes none
        agent.write_status(PassReport(), None, "running")
        got = scrape(agent.status.last["metrics"])
        for uid in (0, 1000):
            labels = (("attempt", "torchrun dgx-job-17 restart 0"), ("training_job", "train.py"),
                      ("uid", str(uid)))  # fmt: skip
            cpu = sum(v["cpu_seconds"] for v in records[uid]["samples"][0]["layers"].values())
            assert got[("hostd_job_cpu_seconds_total", labels)] == pytest.approx(cpu)
        infos = [dict(k[1]) for k in got if k[0] == "hostd_job_attempt_info"]
        assert len(infos) == 2
        assert all(i["protected"] == "false" and i["source"] == "torchrun" for i in infos)
        gpus = [dict(k[1]) for k in got if k[0] == "hostd_job_gpu_info"]
        assert {(g["device"], g["uid"]) for g in gpus} == {("nvidia0", "1000"), ("nvidia4", "0")}
        assert all(g["UUID"].startswith("GPU-") and g["Hostname"] for g in gpus)
    finally:
        agent.exporter.stop()
        agent.journal.close()
        agent.status.close()


POLICY = """version = 1
[metrics]
address = "127.0.0.1"
port = 0
[[layer]]
name = "trainer"
comment = "the ranks"
match = [[{ job_role = "rank" }]]
sched = { nice = -5 }
[[layer]]
name = "rest"
comment = "the rest"
match = [[]]
"""


def test_a_throughput_file_is_read_only_when_the_job_owns_it(tmp_path):
    """Read as the job sees it (/proc/PID/root, /proc/PID/cwd): a link or a FIFO named by the
    job, or a file its user does not own, are never read."""
    host, me = Host(), os.getpid()
    mine = tmp_path / "rate"
    mine.write_text("12.5 steps/s\n")
    text, mtime = host.job_file(me, str(mine))
    assert text == "12.5 steps/s\n" and mtime == pytest.approx(mine.stat().st_mtime)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert host.job_file(me, str(link)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert host.job_file(me, str(fifo)) is None  # never blocks on it
    rel = os.path.relpath(mine, os.getcwd())
    assert host.job_file(me, rel)[0] == "12.5 steps/s\n"  # relative: its working folder
    assert host.job_file(me, "") is None
    assert host.job_file(me, str(tmp_path / "missing")) is None
    if os.geteuid() == 0:
        os.chown(mine, 12345, 12345)
        assert host.job_file(me, str(mine)) is None  # owned by another user


def _opens(path) -> callable:
    """A probe of whether ``path`` is opened from now on: inotify's IN_OPEN (which a lookup with
    O_PATH never raises); calling it says whether an open came since the last call."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(path), 0x20) >= 0  # IN_OPEN

    def opened() -> bool:
        try:
            return len(os.read(fd, 4096)) > 0
        except BlockingIOError:
            return False

    return opened


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a device node, files of root's")
def test_a_device_or_fifo_a_job_names_is_never_opened(tmp_path):
    """Issue 44.1: a job names a root-owned FIFO or device node (``/dev/watchdog`` arms a hardware
    watchdog when opened, a tape rewinds, a serial line toggles its modem lines). The agent, as
    root, must not open it at all, not open it and refuse it after: the kernel's IN_OPEN on the
    node says whether it was opened. A regular file of the same owner is opened and read."""
    host, me = Host(), os.getpid()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    dev = tmp_path / "null"
    os.mknod(dev, 0o600 | 0o020000, os.makedev(1, 3))  # a character device, /dev/null's numbers
    link = tmp_path / "link"
    link.symlink_to(dev)
    for node in (fifo, dev):
        opened = _opens(node)
        for name in (str(node), str(link)):
            assert host.job_file(me, name) is None
        assert not opened(), f"{node.name} was opened"
    rate = tmp_path / "rate"
    rate.write_text("7 steps/s\n")
    opened = _opens(rate)
    assert host.job_file(me, str(rate))[0] == "7 steps/s\n"
    assert opened()  # the probe sees an open: the check above could fail


@pytest.mark.parametrize(
    ("uids", "owner_is_user", "read"),
    [
        ("U U U U", True, True),
        ("U U U U", False, False),  # the file is another user's
        ("U O O O", True, False),  # a set-uid program started with the user's environment
        ("U U U O", True, False),  # a filesystem uid of its own
    ],
)
def test_whose_file_the_kernel_says(tmp_path, uids, owner_is_user, read):
    """On a tree: the process's four uids (/proc/PID/status) must agree and own the file."""
    root = os.geteuid() == 0
    user = 1000 if root else os.geteuid()  # the file's owner
    proc = tmp_path / "proc" / "77"
    (proc / "root" / "job").mkdir(parents=True)
    status = uids.replace("U", str(user)).replace("O", str(user + 1)).replace(" ", "\t")
    (proc / "status").write_text(f"Name:\tpython3\nUid:\t{status}\nGid:\t0\t0\t0\t0\n")
    rate = proc / "root" / "job" / "rate"
    rate.write_text("3 steps/s\n")
    if root:
        os.chown(rate, user if owner_is_user else user + 1, 0)
    elif not owner_is_user:
        pytest.skip("needs root to give the file to another user")
    got = Host(tmp_path).job_file(77, "/job/rate")
    assert (got is not None and got[0] == "3 steps/s\n") == read


def test_old_records_make_room_for_new_ones(tmp_path, monkeypatch):
    """At most MAX_FILES records: each new one removes those written longest ago."""
    import hostd.agent.attempts as attempts_mod

    monkeypatch.setattr(attempts_mod, "MAX_FILES", 3)
    old = {f"old-{i}.json": 1_000_000 + i for i in range(5)}
    names = _records_after_one_sample(tmp_path, old)  # the fixture's job: two new records
    assert len(names) == 3, names
    assert sum("-train.py-" in n for n in names) == 2
    assert "old-4.json" in names  # the newest old one stays


def _records_after_one_sample(tmp_path, files: dict[str, float]) -> list[str]:
    """The record files after the fixture's job made its two (uid 0 and 1000), the folder
    holding ``files`` (name: mtime) before."""
    tree = host_copy(tmp_path)
    folder = tmp_path / "s" / "attempts"
    folder.mkdir(parents=True, mode=0o700)
    for name, mtime in files.items():
        (folder / name).write_text("{}")
        os.utime(folder / name, (mtime, mtime))
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
        for tid, item in agent.inc.classified.items():
            path = tree / "proc" / str(item.task.pid) / "task" / str(tid) / "schedstat"
            path.write_text("1000 0 1\n")
        agent.layer_stats.sample()
        agent.layer_stats.sample()
    finally:
        agent.journal.close()
        agent.status.close()
    return sorted(p.name for p in folder.glob("*.json"))


def test_one_users_many_jobs_never_evict_another_users_history(tmp_path, monkeypatch):
    """Issue 44.12: one user's 300 short "jobs" deleted other users' records (one cap for all,
    oldest first). Now a new record makes room among its own user's records; another user's,
    however old, stay."""
    import hostd.agent.attempts as attempts_mod

    monkeypatch.setattr(attempts_mod, "PER_USER", 3)
    files = {f"u1000-flood-{i}.json": 2_000_000 + i for i in range(6)}
    files |= {f"u77-history-{i}.json": 1_000_000 + i for i in range(2)}  # the oldest of all
    names = _records_after_one_sample(tmp_path, files)
    assert [n for n in names if n.startswith("u77-")] == ["u77-history-0.json",
                                                          "u77-history-1.json"]  # fmt: skip
    mine = [n for n in names if n.startswith("u1000-")]
    assert len(mine) == 3 and sum("-train.py-" in n for n in mine) == 1
    assert "u1000-flood-5.json" in mine and "u1000-flood-4.json" in mine


def test_live_attempts_of_one_user_are_bounded(tmp_path, monkeypatch):
    """A user's live attempts in memory stop at LIVE_PER_USER: more are not recorded."""
    import hostd.agent.attempts as attempts_mod

    monkeypatch.setattr(attempts_mod, "LIVE_PER_USER", 0)
    names = _records_after_one_sample(tmp_path, {})
    assert names == []

"""hostd.model.jobs: which job a process belongs to and its role, table by table."""

from __future__ import annotations

import pytest

from hostd.model.jobs import Job, environ_vars, job_of, launcher_kind, slurm_step

LAUNCHER = Job("torchrun 40", "launcher", None, 0, False, "torchrun")
RANK = Job("torchrun 40", "rank", 3, 41, True, "rank 3")


def of(comm="python3", *, cmdline="", cgroup="/", env=None, gpu=False, parent=None, pid=50):
    return job_of(
        pid=pid, comm=comm, cmdline=cmdline or comm, cgroup=cgroup, env=env or {}, gpu=gpu,
        parent=parent, parent_comm="x", rank_gpu=False,
    )  # fmt: skip


def test_environ_keeps_the_job_variables_only():
    raw = b"PATH=/bin\0RANK=3\0SECRET=x\0WORLD_SIZE=8\0RANK=9\0broken\0NCCL_SET_THREAD_NAME=1\0"
    assert environ_vars(raw) == (("NCCL_SET_THREAD_NAME", "1"), ("RANK", "3"), ("WORLD_SIZE", "8"))
    assert environ_vars("") == ()


@pytest.mark.parametrize(
    ("comm", "cmdline", "kind"),
    [
        ("pt_elastic", "", "torchrun"),
        ("python3", "/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 8 t.py", "torchrun"),
        ("python3", "/usr/bin/python3 -m torch.distributed.run t.py", "torchrun"),
        ("python3", "/usr/bin/python3 -m torch.distributed.launch t.py", "torchrun"),
        ("deepspeed", "", "deepspeed"),
        ("python3", "python3 -m deepspeed.launcher.launch --world_info=x", "deepspeed"),
        ("python3", "/usr/bin/python3 /usr/bin/accelerate launch t.py", "accelerate"),
        ("mpirun", "", "mpirun"),
        ("prted", "", "mpirun"),
        ("srun", "", "srun"),
        ("python3", "python3 train.py --torchrun-like", None),
        ("python3", "vim torchrun.md", None),
    ],
)
def test_launchers(comm, cmdline, kind):
    assert launcher_kind(comm, cmdline) == kind


@pytest.mark.parametrize(
    ("cgroup", "step"),
    [
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", ("4242", "0")),
        ("/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0", ("4242", "batch")),
        ("/slurm/uid_1000/job_77/step_extern/task_0", ("77", "extern")),
        ("/user.slice/job_1/step_2", None),  # no Slurm in the path: a user's own naming
        # a delegated subtree a user named like a step: not below slurmd's roots
        ("/user.slice/user-1000.slice/user@1000.service/slurm/uid_1/job_1/step_0", None),
        ("/slurm_node07/uid_1000/job_5/step_1/task_0", ("5", "1")),
        ("/system.slice/ssh.service", None),
    ],
)
def test_slurm_steps(cgroup, step):
    assert slurm_step(cgroup) == step


def test_roles():
    launcher = of("pt_elastic", pid=40)
    assert (launcher.role, launcher.id) == ("launcher", "torchrun 40")
    rank = of(env={"RANK": "3", "TORCHELASTIC_RUN_ID": "r"}, parent=LAUNCHER, pid=41, gpu=True)
    assert (rank.role, rank.rank, rank.rank_pid, rank.gpu) == ("rank", 3, 41, True)
    stray = of(parent=LAUNCHER)  # started by the launcher without a rank
    assert (stray.role, stray.rank) == ("other", None)
    # below a rank, whatever the depth and the route (forked, forkserver)
    assert of("pt_data_worker", parent=RANK).role == "data"
    forkserver = of("python3", parent=RANK)
    assert (forkserver.role, forkserver.rank, forkserver.gpu) == ("helper", 3, True)
    assert of("pt_data_worker", parent=forkserver).role == "data"
    worker = of("python3", cmdline="python3 .../torch/_inductor/compile_worker/__main__.py",
                parent=RANK)  # fmt: skip
    assert worker.role == "compile"
    assert of("sh", parent=worker).role == "compile"  # a compile worker's child
    assert of("ptxas", parent=RANK).role == "compile"
    assert of("wandb-core", parent=RANK).role == "helper"


def test_what_makes_no_job():
    assert of() is None
    assert of("slurmstepd", cgroup="/system.slice/slurmstepd.scope/job_1/step_0/slurm") is None
    # a shell that exports RANK and WORLD_SIZE is no job without MASTER_ADDR
    assert of("bash", env={"RANK": "0", "WORLD_SIZE": "1"}) is None
    pod = of(env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-0"})
    assert pod is not None and (pod.id, pod.role) == ("of job-0", "rank")
    # SLURM_PROCID counts only inside a step
    assert of(env={"SLURM_PROCID": "0"}) is None
    step = "/system.slice/slurmstepd.scope/job_9/step_0/user/task_0"
    task = of(env={"SLURM_PROCID": "2"}, cgroup=step)
    assert (task.id, task.role, task.rank) == ("slurm 9.0", "rank", 2)
    batch = of("bash", cgroup=step)
    assert (batch.id, batch.role) == ("slurm 9.0", "other")


def test_describe():
    assert RANK.describe() == "rank 3 of job torchrun 40"
    assert Job("j", "data", 3, 41, True, "w").describe() == "data process of rank 3 of job j"
    assert LAUNCHER.describe() == "launcher of job torchrun 40"


def test_the_agents_cache_gives_a_new_process_its_job(tmp_path):
    """A process that appears between passes (a fork event) gets its job from its parent as
    the cache knows it; a renamed leader gets its role again."""
    import shutil

    from hostd.host import Host
    from hostd.tasks import TaskCache
    from tests.fakes import host_copy

    tree = host_copy(tmp_path)
    cache = TaskCache(Host(tree))
    cache.rescan()
    assert cache.procs[4150].job.role == "data" and cache.procs[4150].job.rank == 0
    assert cache.procs[4100].job.role == "rank" and cache.procs[4100].job.gpu
    assert cache.procs[4000].job.role == "launcher"
    assert cache.procs[1300].job is None  # nvidia-persistenced: no job
    # rank 0 forks a worker (a copy of 4150 as 4170), not yet renamed
    new = tree / "proc" / "4170"
    shutil.copytree(tree / "proc" / "4150", new, symlinks=True)
    (new / "task" / "4150").rename(new / "task" / "4170")
    for stat in (new / "stat", new / "task" / "4170" / "stat"):
        stat.write_text(stat.read_text().replace("4150 (pt_data_worker)", "4170 (python3)", 1))
    for extra in (new / "task").iterdir():
        if extra.name != "4170":
            shutil.rmtree(extra)
    (task,) = cache.refresh([(4170, 4170)], exec_pids=set())
    assert task.process.job.role == "helper" and task.process.job.rank == 0
    renamed = cache.renamed_leader(4170, "pt_data_worker")
    assert [t.tid for t in renamed] == [4170]
    assert cache.procs[4170].job.role == "data"

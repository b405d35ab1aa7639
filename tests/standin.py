"""Stand-in nodes of real GPU training jobs, as hostd's classifier sees them: every process's
name, parentage, uid, cgroup, job environment and accelerator fds, every thread's name, and
for each thread the layer an expert would choose, with the reason.

Built from how real nodes look (FACTS.md; issue 17): NCCL's threads carry their rank's name
unless ``NCCL_SET_THREAD_NAME=1``; DataLoader workers are forked by the rank (Python 3.11) or
by a forkserver that never opened the GPU (Python 3.14's default start method); Python 3.14
names its threads (``QueueFeederThre``, ``Thread-2 (_serv``); Slurm runs steps under
``/system.slice/slurmstepd.scope/job_N/step_M``; GPU services hold the GPUs' device files.
``build(node)`` turns a node into ``Task`` values whose jobs are derived exactly as
``hostd.tasks`` derives them from /proc (``hostd.tasks.joined``), parents before children.

Used by ``tests/unit/test_standin_nodes.py`` (goals per node) and ``bench/classify_nodes.py``
(accuracy per layer, in BENCHMARKS.md).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hostd.model.node import place
from hostd.model.tasks import Process, Task
from hostd.tasks import joined

CUDA = ("/dev/nvidiactl", "/dev/nvidia-uvm")


@dataclass
class Proc:
    """One process of a node: its leader's name is ``comm``; ``threads`` are the others, each
    (name or None for the process's own name, count, expert layer, reason[, activity]): the
    activity (``hostd.model.tasks.ACTIVITIES``) is what the real thread does when idle, the
    system call it waits in, as ``/proc/PID/task/TID/syscall`` shows it ("waits" if not given)."""

    key: str
    comm: str
    parent: str | None
    expert: str  # the leader thread's expert layer
    reason: str
    uid: int = 1000
    cgroup: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    fds: tuple[str, ...] = ()
    cmdline: str = ""
    nvml: bool = False
    threads: list[tuple] = field(default_factory=list)
    session: str | None = None  # the key of the process that leads its session (None: itself)


@dataclass(frozen=True)
class Thread:
    task: Task
    expert: str
    reason: str
    kind: str  # "process comm / thread comm": the row of the report


def build(procs: list[Proc]) -> list[Thread]:
    pids = {p.key: 1000 + 10 * i for i, p in enumerate(procs)}
    values: dict[int, Process] = {}
    for p in procs:
        pid = pids[p.key]
        ppid = pids[p.parent] if p.parent else 1
        parent = next((q for q in procs if q.key == p.parent), None)
        values[pid] = Process(
            pid=pid,
            start_time=pid,
            comm=p.comm,
            ppid=ppid,
            parent_comm=parent.comm if parent else "systemd",
            cgroup=p.cgroup,
            cpuset="/",
            cmdline=p.cmdline or p.comm,
            exe="/usr/bin/python3",
            gpu_devices=tuple(sorted(p.fds)),
            nvml=p.nvml,
            is_kthread=False,
            session=pids[p.session] if p.session else pid,
            env=tuple(sorted(p.env.items())),
            node=place(p.cgroup).with_pod(*NAMESPACES[p.cgroup])
            if p.cgroup in NAMESPACES
            else place(p.cgroup),
        )
    for pid in sorted(values):  # parents have smaller pids here
        values[pid] = joined(values[pid], values)
    tids = itertools.count(100_000)
    out: list[Thread] = []
    for p in procs:
        proc = values[pids[p.key]]

        def task(tid: int, comm: str, does: str = "", proc: Process = proc, uid: int = p.uid):
            t = Task(tid, tid, comm, "S", uid, uid, 0, 0, 0, frozenset(range(8)), 0, 0, 0, proc)
            # hostd looks at what the unnamed threads of a job do (hostd.tasks.scan)
            t.activity = does if proc.job is not None and t.unnamed else ""
            return t

        kind = p.comm
        out.append(Thread(task(proc.pid, p.comm), p.expert, p.reason, f"{kind} (main)"))
        for name, count, expert, reason, *does in p.threads:
            for _ in range(count):
                comm = name or p.comm
                t = task(next(tids), comm, activity(does))
                out.append(Thread(t, expert, reason, f"{kind} / {comm}"))
    return out


def activity(does: list[str]) -> str:
    """A thread spec's activity: what it does when idle ("waits" on a lock if not said)."""
    return does[0] if does else "waits"


# -- the pieces of a node -------------------------------------------------------------------
SLURM = "/system.slice/slurmstepd.scope/job_4242/step_0"
SLURM_V1 = "/slurm/uid_1000/job_4242/step_0"  # cgroup v1 (proctrack/cgroup, task/cgroup)
# Real ids: a container's is 64 hex digits, a pod's a UUID (dashes as "_" in systemd's names).
JOB_POD, JOB_CTR = "6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "9a8b" * 16
POD = (  # systemd driver
    f"/kubepods.slice/kubepods-pod{JOB_POD.replace('-', '_')}.slice/cri-containerd-{JOB_CTR}.scope"
)
POD_CGROUPFS = f"/kubepods/burstable/pod{JOB_POD}/{JOB_CTR}"  # the cgroupfs driver
DOCKER = f"/system.slice/docker-{'3c4d5e' * 10}3c4d.scope"  # docker run, systemd driver
SERVICES_POD = (  # the GPU operator's daemon set pod (namespace from containerd's record)
    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod77aa0000_1111_2222_3333_"
    f"444455556666.slice/cri-containerd-{'77aa' * 16}.scope"
)
NAMESPACES = {SERVICES_POD: ("gpu-operator", "nvidia-dcgm-exporter-x7k2p")}


def services(k8s: bool = False) -> list[Proc]:
    """What a GPU node runs besides the job: GPU services, a daemon, an operator's shell."""
    gpus = (*(f"/dev/nvidia{i}" for i in range(8)), "/dev/nvidiactl")
    why = "a GPU service: holds the GPUs, is no job"
    out = [
        Proc(
            "persistenced",
            "nvidia-persiste",
            None,
            "gpu-services",
            why,
            uid=118,
            cgroup="/system.slice/nvidia-persistenced.service",
            fds=gpus,
        ),
        Proc(
            "hostengine",
            "nv-hostengine",
            None,
            "gpu-services",
            why,
            uid=0,
            cgroup="/system.slice/nvidia-dcgm.service",
            fds=gpus,
            threads=[(None, 6, "gpu-services", why)],
        ),
        Proc(
            "fabricmanager",
            "nv-fabricmanage",
            None,
            "gpu-services",
            why,
            uid=0,
            cgroup="/system.slice/nvidia-fabricmanager.service",
            fds=("/dev/nvidiactl",),
            threads=[(None, 3, "gpu-services", why)],
        ),
        Proc(
            "sshd",
            "sshd",
            None,
            "system",
            "a system service",
            uid=0,
            cgroup="/system.slice/ssh.service",
        ),
        Proc(
            "shell",
            "bash",
            "sshd",
            "rest",
            "an operator's login shell",
            uid=1001,
            cgroup="/user.slice/user-1001.slice/session-4.scope",
        ),
        Proc(
            "smi",
            "nvidia-smi",
            "shell",
            "rest",
            "another user's GPU tool, no job: their work, like any (preempted if busy)",
            uid=1001,
            cgroup="/user.slice/user-1001.slice/session-4.scope",
            fds=gpus,
        ),
    ]
    if k8s:
        out += [
            Proc(
                "kubelet",
                "kubelet",
                None,
                "system",
                "a system service",
                uid=0,
                cgroup="/system.slice/kubelet.service",
                threads=[(None, 20, "system", "a system service")],
            ),
            Proc(
                "exporter",
                "dcgm-exporter",
                None,
                "gpu-services",
                why,
                uid=0,
                cgroup=SERVICES_POD,
                fds=gpus,
                nvml=True,
                threads=[(None, 8, "gpu-services", why)],
            ),
            Proc(
                "plugin",
                "nvidia-device-p",
                None,
                "gpu-services",
                why,
                uid=0,
                cgroup=SERVICES_POD,
                fds=("/dev/nvidiactl",),
                threads=[(None, 5, "gpu-services", why)],
            ),
        ]
    else:
        out.append(
            Proc(
                "slurmd",
                "slurmd",
                None,
                "system",
                "Slurm's node daemon",
                uid=0,
                cgroup="/system.slice/slurmd.service",
            ),
        )
    return out  # fmt: skip


def pytorch_job(
    *,
    python: str = "3.11",
    nccl_names: bool = False,
    layout: str = "slurm",
    ranks: int = 8,
    workers: int = 4,
    launcher: str = "torchrun",
) -> list[Proc]:
    """One node of a torchrun (or DeepSpeed) DDP/FSDP job: ``ranks`` ranks, each with its
    CUDA threads, PyTorch's named threads, NCCL's threads, ``workers`` DataLoader workers, an
    Inductor compile worker pool; rank 0 runs a wandb agent."""
    cgroup = {
        "slurm": SLURM + "/user/task_0",
        "slurm-v1": SLURM_V1 + "/task_0",
        "k8s": POD,
        "k8s-cgroupfs": POD_CGROUPFS,
        "docker": DOCKER,
        "ssh": "/user.slice/user-1000.slice/session-7.scope",
    }[layout]
    env_job = {"NCCL_SET_THREAD_NAME": "1"} if nccl_names else {}
    if layout.startswith("slurm"):
        env_job |= {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    out: list[Proc] = []
    top = None
    if layout.startswith("slurm"):
        where = SLURM + "/slurm" if layout == "slurm" else "/system.slice/slurmd.service"
        out.append(Proc("stepd", "slurmstepd", None, "system", "Slurm's step daemon (root)",
                        uid=0, cgroup=where))  # fmt: skip
        top = "stepd"
    elif layout.startswith(("k8s", "docker")):
        out.append(Proc("shim", "containerd-shim", None, "system", "the container runtime",
                        uid=0, cgroup="/system.slice/containerd.service"))  # fmt: skip
        top = "shim"
    helper = "the job's launcher: rarely busy"
    if launcher == "deepspeed":
        out.append(
            Proc(
                "runner",
                "deepspeed",
                top,
                "helpers",
                helper,
                cgroup=cgroup,
                env=env_job,
                cmdline="/usr/bin/python3 /usr/local/bin/deepspeed train.py",
            )
        )
        out.append(
            Proc(
                "launch",
                "python3",
                "runner",
                "helpers",
                helper,
                cgroup=cgroup,
                env=env_job,
                cmdline="/usr/bin/python3 -m deepspeed.launcher.launch --world_info=x",
            )
        )
        parent = "launch"
    else:
        out.append(
            Proc(
                "launcher",
                "pt_elastic",
                top,
                "helpers",
                helper,
                cgroup=cgroup,
                env=env_job,
                threads=[("pt_tcpstore_uv", 1, "helpers", helper)],
                cmdline="/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 8 t.py",
            )
        )
        parent = "launcher"  # fmt: skip
    py314 = python == "3.14"
    for r in range(ranks):
        env = env_job | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks),
                         "TORCHELASTIC_RUN_ID": "job-17"}  # fmt: skip
        fds = (*CUDA, f"/dev/nvidia{r}")
        # NCCL's threads as they idle (src/proxy.cc, src/transport/net_ib.cc, src/ras):
        # the proxy progress thread waits on a condition variable (it spins while it has work),
        # the proxy service, UDS and RAS threads sit in poll(2) with a 500 ms timeout, the IB
        # thread reads the device's async events (ibv_get_async_event).
        nccl = [
            ("NCCL Progress 0", "an NCCL thread: proxy progress", "waits"),
            ("NCCL Service 0", "an NCCL thread: proxy service", "polls"),
            ("NCCL UDS Service", "an NCCL thread: UDS proxy service", "polls"),
            ("NCCL IbAsync 0", "an NCCL thread: InfiniBand events", "rdma-events"),
            ("NCCL RAS", "an NCCL thread: RAS", "polls"),
        ]
        feeder = "QueueFeederThre" if py314 else None
        feeds = "a queue feeder thread: sends batch indices to a worker"
        threads = [
            ("pt_autograd_0", 1, "trainer", "autograd's device thread: the step"),
            ("cuda-EvtHandlr", 1, "trainer", "the CUDA driver's thread of the rank", "polls"),
            ("cuda0000400007e", 1, "trainer", "the CUDA driver's thread of the rank"),
            ("pt_nccl_watchdg", 1, "comms", "PyTorch's NCCL watchdog"),
            ("pt_nccl_heartbt", 1, "comms", "PyTorch's NCCL heartbeat monitor"),
            *[(name if nccl_names else None, 1, "comms", why, does) for name, why, does in nccl],
            ("pt_data_pin", 1, "data", "the pin-memory thread: feeds the step"),
            (feeder, workers, "data", feeds, "feeds"),
        ]
        if py314:
            threads.append(("Thread-2 (_serv", 1, "helpers", "multiprocessing's fd sharer"))
        key = f"rank{r}"
        out.append(Proc(key, "python3", parent, "trainer", "the rank's main thread: the step",
                        cgroup=cgroup, env=env, fds=fds, nvml=True, threads=threads,
                        cmdline="/usr/bin/python3 -u train.py"))  # fmt: skip
        wparent = key
        if py314:
            out.append(
                Proc(
                    f"fs{r}",
                    "python3",
                    key,
                    "helpers",
                    "the rank's forkserver",
                    cgroup=cgroup,
                    env=env,
                    session=key,
                    cmdline="/usr/bin/python3 -c from multiprocessing.forkserver",
                )
            )
            wparent = f"fs{r}"  # fmt: skip
        for w in range(workers):
            wfds = () if py314 else fds  # forked from the rank, a worker inherits its fds
            out.append(
                Proc(
                    f"w{r}.{w}",
                    "pt_data_worker",
                    wparent,
                    "data",
                    "a DataLoader worker",
                    cgroup=cgroup,
                    env=env,
                    fds=wfds,
                    session=key,
                    threads=[(feeder, 1, "data", "a worker's result-queue feeder", "feeds")],
                )
            )
        out.append(
            Proc(
                f"cw{r}",
                "python3",
                key,
                "compile",
                "an Inductor compile worker",
                cgroup=cgroup,
                env=env,
                session=key,
                cmdline="/usr/bin/python3 .../torch/_inductor/compile_worker/__main__.py",
                threads=[(None, 2, "compile", "its pool's threads")],
            )
        )
        out.append(Proc(f"ptxas{r}", "ptxas", key, "compile", "NVIDIA's assembler, run by "
                        "Triton", cgroup=cgroup, env=env, session=key))  # fmt: skip
    out.append(Proc("wandb", "wandb-core", "rank0", "helpers", "the run's logger", cgroup=cgroup,
                    env=env_job, session="rank0",
                    threads=[(None, 7, "helpers", "the logger's threads")]))  # fmt: skip
    return out


def jax_job() -> list[Proc]:
    """One node of a JAX job under srun: one process drives all 8 GPUs; its XLA threads have
    no names of their own (Slurm gives each task SLURM_PROCID in its step)."""
    env = {"SLURM_JOB_ID": "5151", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}
    cg = "/system.slice/slurmstepd.scope/job_5151/step_0"
    gpus = (*CUDA, *(f"/dev/nvidia{i}" for i in range(8)))
    return [
        Proc("stepd", "slurmstepd", None, "system", "Slurm's step daemon (root)", uid=0,
             cgroup=cg + "/slurm"),
        Proc("jax", "python3", "stepd", "trainer", "the JAX process's main thread", cgroup=cg +
             "/user/task_0", env=env, fds=gpus,
             threads=[(None, 24, "trainer", "XLA's compute and host threads"),
                      ("cuda-EvtHandlr", 1, "trainer", "the CUDA driver's thread")]),
    ]  # fmt: skip


NODES = {
    "ddp-py311-slurm": lambda: pytorch_job() + services(),
    "ddp-py311-slurm-nccl-named": lambda: pytorch_job(nccl_names=True) + services(),
    "ddp-py314-slurm": lambda: pytorch_job(python="3.14") + services(),
    "fsdp-py311-k8s": lambda: pytorch_job(layout="k8s") + services(k8s=True),
    "fsdp-py314-k8s-nccl-named": lambda: (
        pytorch_job(python="3.14", layout="k8s", nccl_names=True) + services(k8s=True)
    ),
    "deepspeed-ssh": lambda: pytorch_job(launcher="deepspeed", layout="ssh") + services(),
    "jax-slurm": lambda: jax_job() + services(),
    # the same job in the other layouts: it must land alike in each
    "ddp-py311-slurm-v1": lambda: pytorch_job(layout="slurm-v1", nccl_names=True) + services(),
    "ddp-py311-k8s-cgroupfs": lambda: (
        pytorch_job(layout="k8s-cgroupfs", nccl_names=True) + services(k8s=True)
    ),
    "ddp-py311-docker": lambda: pytorch_job(layout="docker", nccl_names=True) + services(),
    "ddp-py311-ssh": lambda: pytorch_job(layout="ssh", nccl_names=True) + services(),
}


# -- scoring --------------------------------------------------------------------------------
def protection(layer) -> int:
    """2: protected (busy work yields to it), 1: left alone, 0: preemptible."""
    return 2 if layer.preempt else 0 if layer.preemptible else 1


@dataclass
class Score:
    node: str
    threads: int
    strict: float  # share of threads in their expert's layer
    weaker: int  # threads in a layer with weaker protection than their expert's
    per_layer: dict[str, tuple[int, int, int]]  # expert layer -> (threads, strict, weaker)
    misses: dict[tuple[str, str, str], int]  # (kind, expert, got) -> threads
    outsiders_protected: int  # services' and other users' threads in protected layers
    job_in_system: int  # job threads in the system layer


def score(name: str, threads: list[Thread], classifier) -> Score:
    policy = classifier.policy
    per: dict[str, list[int]] = {}
    misses: dict[tuple[str, str, str], int] = {}
    weaker = outsiders = in_system = 0
    for t in threads:
        got = classifier.classify(t.task)
        names = {layer.name for layer in policy.layers}
        # a policy without the expert's layer (an older one): judged as "left alone"
        want_level = protection(policy.layer(t.expert)) if t.expert in names else 1
        row = per.setdefault(t.expert, [0, 0, 0])
        row[0] += 1
        if got.name == t.expert:
            row[1] += 1
        else:
            misses[(t.kind, t.expert, got.name)] = misses.get((t.kind, t.expert, got.name), 0) + 1
        if protection(got) < want_level:
            row[2] += 1
            weaker += 1
        if t.task.process.job is None and got.preempt:
            outsiders += 1
        if t.task.process.job is not None and got.name == "system":
            in_system += 1
    total = len(threads)
    strict = sum(r[1] for r in per.values()) / total
    return Score(name, total, strict, weaker, {k: tuple(v) for k, v in per.items()}, misses,
                 outsiders, in_system)  # fmt: skip

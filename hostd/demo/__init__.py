"""``hostd demo``: a one-minute version of the trainer benchmark, with nothing to install.

It runs a stand-in training job four times: alone, under CPU contention, under the same
contention with ``hostd run`` on the embedded default policy with preemption switched off
(``[preempt] enabled = false``: the ranks' session weight and weighted comm threads only), and
with the default policy as shipped (the contention's session is demoted: SCHED_IDLE, session
nice 19); the agent is scoped to the job and the contention. Then it prints steps/s relative to
the job alone and, per arm, which layers of the job waited for a CPU (``hostd.stats``).
Everything it starts is killed and the agent restores what it changed when the demo ends, on an
error and on Ctrl-C (the agent's own SIGTERM path).

The stand-in job is a process tree shaped and named like ``torchrun`` running PyTorch DDP
(FACTS.md): a launcher renamed ``pt_elastic`` with a (here idle) ``pt_tcpstore_uv`` thread;
ranks started each in a session of its own (as torchrun does), whose main thread computes a
"step" (pure-Python arithmetic) on a "batch" from its ``pt_data_worker`` process and then waits
for the other ranks through a ``gloo_tcp_loop`` thread; the ranks talk to each other directly,
as gloo's do, and rank 0 counts the steps.
The real benchmark, ``bench/trainer/run.py``, runs PyTorch itself and imports the helpers
below (``Contention``, ``AgentProc``, ``layer_summary``).

Roles run as ``python -m hostd.demo ROLE ...`` child processes and use the standard library
only, so they start in a fraction of a second.

The parts: ``job`` (the stand-in job's roles, run by ``__main__``), ``agentproc`` (``AgentProc``,
``HOSTD``), ``processes`` (``Contention``, ``session_pids``, ``kill_session``) and ``arms`` (the
four arms, ``run_job``, ``layer_summary``, ``demo``).
"""

from __future__ import annotations

from hostd.demo.agentproc import HOSTD, AgentProc
from hostd.demo.arms import ARMS, demo, layer_summary, run_job, share_only
from hostd.demo.job import JOB_LAYERS, busy, calibrate, main, rename
from hostd.demo.processes import Contention, kill_session, session_pids

__all__ = [
    "ARMS",
    "HOSTD",
    "JOB_LAYERS",
    "AgentProc",
    "Contention",
    "busy",
    "calibrate",
    "demo",
    "kill_session",
    "layer_summary",
    "main",
    "rename",
    "run_job",
    "session_pids",
    "share_only",
]

"""Preemptible work and the starvation guard: the decisions, pure (no I/O).

A policy marks layers ``preempt = true`` (protected: the job's threads) and ``preemptible =
true`` (work that yields). While a protected layer has threads, the agent measures, every
``[preempt] interval`` seconds, what each thread of the host wanted from the scheduler: its run
time plus its run-queue wait (``/proc/PID/task/TID/schedstat``), as a share of one CPU. A
*session* (setsid(2); with autogroups on, also the kernel's CPU-sharing group) whose preemptible
threads together want ``busy`` CPUs or more is **demoted** (work in processes that live less than
an interval, a build's compilers, is counted by the CPU time of the session's processes: their
own, and that of the children they waited for): each of its preemptible threads
becomes SCHED_IDLE, which a waking thread of any other policy preempts at once (sched(7)), and
the session's autogroup nice goes to ``session_nice`` (19), because CFS first shares the CPUs
between autogroups by their weight and a SCHED_IDLE thread does not lower its session's
(BENCHMARKS.md, "Preemptible work"). Autogroups act only in the root cpu cgroup: a demoted
session that lives in a cgroup of its own (a scope, a container, a Slurm step) has that
cgroup weighed down as a whole (``cpu.idle``, else the least weight: ``hostd.sched.group``),
when everything in the cgroup is demoted work (``why_group_kept``), for as long as it is.
A session is the unit because work comes in sessions: a build's compilers live a second each,
a stress test forks its workers, and what a demoted thread creates is born SCHED_IDLE in the
same session.

Never demoted (``why_kept``): the kernel's and init's sessions (0 and 1), hostd's own, the node's
infrastructure (``why_place_kept``: ``[preempt] keep_*`` over the node model), and a session
holding a thread of a protected layer (the job's own sessions) or of a layer that weighs its
sessions itself (``sched.group_nice``, such as the default policy's system services). A
session's CPU counts if its threads are in a preemptible layer or in any other unprotected layer
a user can land in by what they set (``counted_layers``: a name does not hide a busy loop). An
interactive session (a login logind gave a terminal; without logind, a controlling terminal,
which any user may open) has an allowance: a user's interactive sessions together keep
``[preempt] interactive_cpus`` while a job runs, the least busy first; past it, they are demoted
like any other. In a demoted session, another user's processes that are not busy themselves
are spared (``hostd.agent.watch``: a root ``runuser`` around a user's busy command).
A demoted session is released when no protected layer has threads, or when its preemptible
threads have wanted less than ``busy / 4`` CPUs for ``release_after`` seconds.

The **starvation guard** (``[guard]``), on the same measurements: a thread that was runnable
(state 'R' at every sample) for ``starve_after`` seconds and ran less than 10 % of it (the
kernel's RT throttling leaves a thread under a real-time spinner 5 %) gets a boost: SCHED_FIFO one
priority above every real-time layer of the policy, for ``boost_ms`` (a demoted thread too, so
nothing starves for good), the longest-starving first, within 5 % of one CPU in all; a thread
hostd made real-time that kept ``rt_runaway_share`` of a CPU busy for ``rt_runaway_after``
seconds is a runaway and goes back to normal scheduling (nice -20) for the rest of its life.

``Watch.update`` takes the samples and returns what changes; the agent (``hostd.agent.watch``)
reads the samples, applies the decisions through the planner and the journal, and reports them.

The package, each concern in a module of its own: ``values`` (``Key``, ``Sample``, ``Demotion``,
``Decisions``), ``kept`` (which sessions and cgroups are kept: ``why_kept``, ``why_place_kept``,
``why_group_kept``; which layers count: ``counted_layers``, ``shielding_layers``), ``watch``
(``Watch``, the state machine, and the guard's thresholds) and ``report`` (``explain``,
``demoted_summary``). Everything is re-exported here.
"""

from __future__ import annotations

from hostd.preempt.kept import (
    counted_layers,
    shielding_layers,
    why_group_kept,
    why_kept,
    why_place_kept,
)
from hostd.preempt.report import demoted_summary, explain
from hostd.preempt.values import Decisions, Demotion, Key, Sample
from hostd.preempt.watch import Watch

__all__ = [
    "Decisions",
    "Demotion",
    "Key",
    "Sample",
    "Watch",
    "counted_layers",
    "demoted_summary",
    "explain",
    "shielding_layers",
    "why_group_kept",
    "why_kept",
    "why_place_kept",
]

"""Desired state: a Plan turned into ``{knob key: value}`` (``hostd.reconcile.prepare`` sorts
it into apply order, ``Spec.apply_order``).

``desired_state`` for a whole plan (``hostd.agent.incremental``'s re-layer, the CLI);
``desired_pieces`` the same in pieces (the agent's full pass: at 100,000 threads, every thread's
knobs, their reads and results at once were the agent's peak memory); ``desired_for_tasks`` for
some threads' plans alone (the event pass, the watch).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import replace

from hostd import knobs
from hostd.cpuset.cgroup import cpuset_key, group_key, subtree_key
from hostd.model.cpus import CPUSET_ROOT, format_cpulist
from hostd.model.tasks import Task
from hostd.plan import NumaPlan, Plan, TaskPlan

# Host knobs that wait for the threads: a full pass writes them last (``desired_pieces``), a
# re-layer leaves them to its redo (``hostd.agent.incremental``).
HOST_PREFIXES = ("irq/", "cpu/")


def desired_state(plan: Plan, tasks: Iterable[Task]) -> dict[str, object]:
    """Every knob value the plan asks for, keyed by knob key."""
    want: dict[str, object] = {}
    v1 = [cs for cs in plan.cpusets if cs.path.startswith(CPUSET_ROOT + "/")]
    if v1:  # v1: the layers' cgroups sit in hostd's own /hostd
        want[group_key()] = {
            "cpus": format_cpulist(plan.online),
            "mems": format_cpulist(sorted({m for c in v1 for m in c.mems})),
        }
    # v2: the cpuset controller enabled from the root down to each threaded cgroup's home, the
    # shallowest first (so restoring, in reverse, disables it from the deepest up).
    homes = {os.path.dirname(cs.path) for cs in plan.cpusets if cs not in v1}
    for path in sorted({a for home in homes for a in _ancestors(home)}, key=_depth):
        want[subtree_key(path)] = True
    for cs in plan.cpusets:
        want[cpuset_key(cs.path)] = {
            "cpus": format_cpulist(cs.cpus),
            "mems": format_cpulist(cs.mems),
        }
    want.update(desired_for_tasks(plan.tasks, plan.numa))
    for ip in plan.irqs:
        want[f"irq/{ip.irq}/smp_affinity_list"] = format_cpulist(ip.affinity)
    for cp in plan.cpufreq:
        if cp.governor:
            want[f"cpu/{cp.cpu}/scaling_governor"] = cp.governor
        if cp.min_freq:
            want[f"cpu/{cp.cpu}/scaling_min_freq"] = cp.min_freq
        if cp.epp:
            want[f"cpu/{cp.cpu}/energy_performance_preference"] = cp.epp
    return want


def desired_pieces(
    plan: Plan, tasks: Iterable[Task], size: int
) -> Iterator[tuple[dict[str, object], list[tuple[int, int]] | None]]:
    """``desired_state(plan, tasks)`` in pieces to apply one after the other, each as (knobs,
    the threads it stands for): hostd's cgroups first (no thread); then ``tasks`` by whole
    processes, about ``size`` threads a piece (a process's threads and its memory placement
    always in one piece), each with those threads' knobs (a thread's records that its piece
    does not want are given back with it); then the IRQ and cpufreq knobs (None: every thread
    was done; what nothing wants any more is given back with it). So the order of
    ``Spec.apply_order`` holds for each thread and process: its cgroup, its membership,
    affinity, policy and nice, then its process's memory."""
    host = desired_state(replace(plan, tasks=(), numa=()), ())
    yield {k: v for k, v in host.items() if not k.startswith(HOST_PREFIXES)}, []
    plans = sorted(plan.tasks, key=lambda tp: tp.pid)  # (stable: by tid within a process)
    numa, at, at_numa = plan.numa, 0, 0  # (sorted by pid)
    chunk: list[tuple[int, int]] = []
    threads = sorted(tasks, key=lambda t: t.pid)
    for i, t in enumerate(threads):
        chunk.append((t.tid, t.start_time))
        if i + 1 < len(threads) and (len(chunk) < size or threads[i + 1].pid == t.pid):
            continue  # (a piece ends with a whole process, at ``size`` threads or more)
        end, end_numa = at, at_numa
        while end < len(plans) and plans[end].pid <= t.pid:
            end += 1
        while end_numa < len(numa) and numa[end_numa].pid <= t.pid:
            end_numa += 1
        yield desired_for_tasks(plans[at:end], numa[at_numa:end_numa]), chunk
        at, at_numa, chunk = end, end_numa, []
    late = {k: v for k, v in host.items() if k.startswith(HOST_PREFIXES)}
    late.update(desired_for_tasks(plans[at:], numa[at_numa:]))  # (not of ``tasks``: none)
    yield late, None


def _ancestors(path: str) -> list[str]:
    """ "/a/b" -> ["/", "/a", "/a/b"]."""
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: n + 1]) for n in range(len(parts))]


def _depth(path: str) -> tuple[int, str]:
    return len([p for p in path.split("/") if p]), path


def desired_for_tasks(
    task_plans: Iterable[TaskPlan],
    numa_plans: Iterable[NumaPlan] = (),
    held: frozenset[int] | set[int] = frozenset(),
) -> dict[str, object]:
    """The knob values of these threads' plans (and their processes' NUMA placement), less the
    cpuset of the threads in ``held`` (tids: a join that waits, ``hostd.agent.incremental``)."""
    want: dict[str, object] = {}
    for tp in task_plans:
        if tp.cpuset is not None and tp.tid not in held:
            want[knobs.task_key(tp.tid, tp.start_time, "cpuset")] = tp.cpuset
        if tp.affinity is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "affinity")] = format_cpulist(tp.affinity)
        if tp.policy is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "sched")] = [
                tp.policy,
                tp.priority or 0,
                tp.reset_on_fork,
            ]
        if tp.nice is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "nice")] = tp.nice
        if tp.group_nice is not None:
            want[knobs.task_key(tp.tid, tp.start_time, "autogroup")] = tp.group_nice
    for np_ in numa_plans:
        want[knobs.task_key(np_.pid, np_.start_time, "numa")] = [np_.node, np_.method]
    return want

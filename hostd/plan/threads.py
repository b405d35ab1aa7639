"""Per-thread decisions, given the CPUs each layer got: affinity, cpuset, policy, nice, NUMA
node. ``TaskPlanner`` serves the full plan and the agent's event passes alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from hostd.classify import Classified
from hostd.model.cpus import home_of, v2_group
from hostd.model.tasks import Process
from hostd.model.topology import Topology
from hostd.plan.numa import _target_node
from hostd.plan.values import NORMAL_POLICIES, CpusetPlan, NumaPlan, Plan, TaskPlan
from hostd.policy import Layer, Policy

_MISSING = object()
# At most this many twins' decisions are kept (``TaskPlanner.decide``; a planner lives as long as
# its plan): a few hundred bytes each.
TWINS = 16384


def may_touch(item: Classified, layers: Mapping[str, Layer], exclude_pids: frozenset[int]) -> bool:
    """Whether hostd may change this thread: never itself, and a kernel thread only when the
    AND-group that matched it says ``is_kthread = true``."""
    task = item.task
    if task.pid in exclude_pids:
        return False
    if task.is_kthread:
        group = layers[item.layer].match[item.group]
        return any(p.name == "is_kthread" and p.value is True and not p.negate for p in group)
    return True


class TaskPlanner:
    """Per-thread decisions, given the CPUs each layer got.

    ``plan()`` runs it over every thread; the agent keeps one per full plan (``for_plan``) and
    runs it over just the threads an event concerns, so a new or renamed thread is decided in
    microseconds without re-planning the host. It remembers which threads hold a real-time slot
    (the per-layer cap) and which processes already have a NUMA target.
    """

    def __init__(
        self,
        topo: Topology,
        policy: Policy,
        layer_cpus: Mapping[str, frozenset[int]],
        pool: frozenset[int],
        cpusets: Iterable[CpusetPlan],
        *,
        allow_rt: bool,
        exclude_pids: frozenset[int] = frozenset(),
        demoted: frozenset[int] | set[int] = frozenset(),
        runaways: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
        spared: frozenset[int] | set[int] = frozenset(),
        weighted: bool = True,
    ) -> None:
        self.topo = topo
        self.layers = {ly.name: ly for ly in policy.layers}
        self.preemptible = policy.preemptible
        self.session_nice = policy.preempt.session_nice
        self.demoted = set(demoted)  # sessions whose preemptible threads are SCHED_IDLE
        self.spared = set(spared)  # ... but for these processes' (another user's bystanders)
        self.runaways = set(runaways)  # real-time threads that kept a CPU busy too long
        # A layer's session weight above the default (group_nice < 0) is given only while it
        # is needed: while demoted work sits where hostd cannot put it below everything.
        self.weighted = weighted
        self.layer_cpus = dict(layer_cpus)
        self.pool = pool
        self.v2 = topo.cgroup.cpuset == "v2"
        self.groups = {cs.path: cs for cs in cpusets}  # hostd's cpuset cgroups by path
        self.cpusets = {cs.layer: cs for cs in self.groups.values()}  # a layer's (any one)
        self.allow_rt = allow_rt
        self.exclude_pids = exclude_pids
        self.multi_node = len(topo.nodes) > 1
        self.node_cpus = {nid: node.cpus for nid, node in topo.nodes.items()}
        self.targets: dict[int, int | None] = {}  # pid -> NUMA node of its GPUs
        self.numa_done: set[int] = set()  # pids that have their NumaPlan
        self.cpuset_pids: set[int] = set()  # processes with threads in hostd's cpusets
        self.rt_holders: dict[str, set[tuple[int, int]]] = {}
        self.rt_capped: Counter[str] = Counter()
        # The affinity depends only on (layer, node, base affinity): memoized, since at 100k
        # threads most share all three.
        self._memo: dict[tuple, frozenset[int] | None] = {}
        self._twins: dict[tuple, tuple[Process, TaskPlan | None]] = {}  # ``decide``
        self._realtime = {ly.name for ly in policy.layers if ly.sched.realtime}

    @classmethod
    def for_plan(
        cls,
        the_plan: Plan,
        topo: Topology,
        policy: Policy,
        *,
        allow_rt: bool,
        exclude_pids: frozenset[int] = frozenset(),
        runaways: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
    ) -> TaskPlanner:
        """The planner that made ``the_plan``, rebuilt from it (with its RT slots taken)."""
        planner = cls(
            topo,
            policy,
            {lp.name: lp.cpus for lp in the_plan.layers},
            the_plan.pool,
            the_plan.cpusets,
            allow_rt=allow_rt,
            exclude_pids=exclude_pids,
            demoted=frozenset(the_plan.demoted),
            runaways=runaways,
            spared=frozenset(the_plan.spared),
            weighted=the_plan.weighted,
        )
        for tp in the_plan.tasks:
            if tp.cpuset is not None:
                planner.cpuset_pids.add(tp.pid)
            if tp.policy in ("fifo", "rr"):
                planner.rt_holders.setdefault(tp.layer, set()).add((tp.tid, tp.start_time))
        for np_ in the_plan.numa:
            planner.targets[np_.pid] = np_.node
            planner.numa_done.add(np_.pid)
        return planner

    def forget(self, key: tuple[int, int], pid: int | None = None) -> None:
        """A thread exited (and, with ``pid``, its whole process): free what it held."""
        for holders in self.rt_holders.values():
            holders.discard(key)
        if pid is not None:
            self.targets.pop(pid, None)
            self.numa_done.discard(pid)
            self.cpuset_pids.discard(pid)

    def decide(
        self, item: Classified, base: frozenset[int] | None = None
    ) -> tuple[TaskPlan | None, NumaPlan | None]:
        """The thread's plan (None: nothing to decide) and, the first time its process is seen
        with a NUMA target, the process's NumaPlan. ``base``: its affinity before hostd.

        A thread that is not its process's leader, of a layer without real-time slots, on a
        host of one NUMA node is decided as its twin was: a thread of the same process object
        and layer, with the same base affinity and policy, seen in the same demotion and cpuset
        state (nothing else of it is read). At 100k threads most threads are such twins."""
        task = item.task
        pid = task.pid
        if task.tid == pid or self.multi_node or item.layer in self._realtime:
            return self._decide(item, base)
        key = (
            pid, item.layer, task.affinity if base is None else base, task.policy,
            task.process.session in self.demoted and pid not in self.spared,
            pid in self.cpuset_pids,
        )  # fmt: skip
        twin = self._twins.get(key)
        if twin is not None and twin[0] is task.process:
            tp = twin[1]
            if tp is not None:
                tp = tp._replace(tid=task.tid, start_time=task.start_time, comm=task.comm)
            return tp, None
        tp, numa = self._decide(item, base)
        if len(self._twins) >= TWINS:
            self._twins.clear()
        self._twins[key] = (task.process, tp)
        return tp, numa

    def _decide(
        self, item: Classified, base: frozenset[int] | None
    ) -> tuple[TaskPlan | None, NumaPlan | None]:
        task, layer = item.task, self.layers[item.layer]
        own = self.layer_cpus.get(layer.name, frozenset())
        pool = self.pool
        if layer.kind == "open" or not own:
            allowed = pool
        elif layer.kind == "confined":
            allowed = own
        else:
            allowed = own | pool
        # A process with a thread in a gpu-local layer has a target node, and all its threads
        # (its comm threads too, whatever their layer) follow it there.
        node = numa = None
        pid = task.pid
        if self.multi_node:
            if pid not in self.targets and layer.numa == "gpu-local":
                self.targets[pid] = _target_node(self.topo, task.process)
            node = self.targets.get(pid)
            if node is not None and pid not in self.numa_done:
                self.numa_done.add(pid)
                numa = NumaPlan(
                    pid, task.process.start_time, task.process.comm, layer.name, node,
                    layer.numa_migrate,
                )  # fmt: skip
        if base is None:
            base = task.affinity
        memo_key = (layer.name, node, base)
        affinity = self._memo.get(memo_key, _MISSING)
        if affinity is _MISSING:
            if node is not None:
                allowed = (allowed & self.node_cpus[node]) or allowed
            desired = (allowed & base) or allowed
            affinity = self._memo[memo_key] = None if desired == base else desired
        # cpusets: v1, only threads in the root cpuset or in one of hostd's (never steal from
        # docker/k8s); v2, the layer's threaded child of the thread's own cgroup, once the full
        # plan made it. A thread is created in its creator's cpuset, so in a process hostd
        # placed in a cpuset, a thread whose layer has none is explicitly wanted back home.
        current = task.process.cpuset
        home = home_of(current)
        cs = self.cpusets.get(layer.name)
        cpuset = None
        if cs is not None and self.v2 and current:
            path = v2_group(home, layer.name)
            cpuset = path if path in self.groups else None
        elif cs is not None and home == "/":
            cpuset = cs.path
        if cpuset is not None:
            self.cpuset_pids.add(pid)
        elif current != home or (pid in self.cpuset_pids and (self.v2 or home == "/")):
            cpuset = home
            self.cpuset_pids.add(pid)
        sched = layer.sched
        sched_policy, priority, nice = sched.policy, sched.priority, sched.nice
        reset = sched.reset_on_fork if sched.realtime else False
        if sched.realtime:
            holders = self.rt_holders.setdefault(layer.name, set())
            cap = sched.max_rt_threads or 16 * len(allowed)
            if task.key in holders:
                pass
            elif not self.allow_rt or len(holders) >= cap:
                if self.allow_rt:
                    self.rt_capped[layer.name] += 1
                sched_policy, priority, nice, reset = "other", None, -20, False
            else:
                holders.add(task.key)
        if sched.realtime and task.key in self.runaways:
            # It kept a CPU busy as real-time for too long (hostd.preempt): normal scheduling.
            sched_policy, priority, nice, reset = "other", None, -20, False
        demoted = task.process.session in self.demoted and task.pid not in self.spared
        if demoted and layer.name in self.preemptible and task.policy in NORMAL_POLICIES:
            # Only threads of the normal classes yield: another's real-time or deadline thread
            # keeps what its owner chose.
            sched_policy, priority, reset = "idle", None, False
        group_nice = None
        if self.topo.autogroup and task.tid == task.pid == task.process.session:
            if demoted and self.session_nice is not None:
                group_nice = self.session_nice
            elif sched.group_nice is not None and (sched.group_nice >= 0 or self.weighted):
                group_nice = sched.group_nice
        if (
            affinity is None
            and node is None
            and cpuset is None
            and group_nice is None
            and not (sched_policy or nice)
        ):
            return None, numa  # nothing to decide for this thread: small plans at 100k threads
        return (
            TaskPlan(
                tid=task.tid,
                start_time=task.start_time,
                pid=task.pid,
                comm=task.comm,
                layer=layer.name,
                affinity=affinity,
                policy=sched_policy,
                priority=priority,
                nice=nice,
                reset_on_fork=reset,
                node=node,
                cpuset=cpuset,
                group_nice=group_nice,
            ),
            numa,
        )

"""The ordered first-match classifier, and its explanations.

``Classifier(policy)`` compiles each layer's OR-of-AND predicates into plain Python tests once;
``classify(task)`` returns the first matching layer (the last layer always matches) and
``explain(task)`` says which AND-group of which layer matched and, for every earlier layer, the
first predicate of each group that failed, with the thread's actual value. Pure: it reads only
the ``Task`` values from ``hostd.tasks``. Called by the planner's callers and the CLI.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hostd.model.tasks import GPU_DEVICE_PREFIXES, Task
from hostd.policy import MATCH_CHARS, Layer, Policy, Predicate

Test = Callable[[Task], bool]


def _actual(name: str, task: Task) -> object:
    """The value of the thread that predicate ``name`` looks at (for explanations)."""
    proc = task.process
    return {
        "comm_prefix": task.comm,
        "comm_regex": task.comm,
        "pcomm_prefix": proc.comm,
        "parent_comm_prefix": proc.parent_comm,
        "cgroup_prefix": proc.cgroup,
        "cgroup_suffix": proc.cgroup,
        "cgroup_contains": proc.cgroup,
        "cgroup_regex": proc.cgroup,
        "cmdline_regex": proc.cmdline,
        "exe": proc.exe,
        "uid": task.uid,
        "gid": task.gid,
        "nice_above": task.nice,
        "nice_below": task.nice,
        "is_group_leader": task.is_leader,
        "is_kthread": task.is_kthread,
        "gpu": [d for d in proc.gpu_devices if d.startswith(GPU_DEVICE_PREFIXES)] or False,
        "nvml_gpu_process": proc.nvml,
        "session_leader": proc.session_leader,
    }[name]


_ACTUAL_LABEL = {
    "comm_prefix": "comm",
    "comm_regex": "comm",
    "pcomm_prefix": "leader comm",
    "parent_comm_prefix": "parent comm",
    "cgroup_prefix": "cgroup",
    "cgroup_suffix": "cgroup",
    "cgroup_contains": "cgroup",
    "cgroup_regex": "cgroup",
    "cmdline_regex": "cmdline",
    "exe": "exe",
    "uid": "uid",
    "gid": "gid",
    "nice_above": "nice",
    "nice_below": "nice",
    "is_group_leader": "is group leader",
    "is_kthread": "is kernel thread",
    "gpu": "GPU devices open",
    "nvml_gpu_process": "in NVML's GPU process list",
    "session_leader": "its process leads its session",
}


def _compile(pred: Predicate) -> Test:
    name, value = pred.name, pred.value
    test: Test
    if name in ("comm_prefix", "pcomm_prefix", "parent_comm_prefix"):
        prefixes = tuple(value)  # type: ignore[arg-type]
        if name == "comm_prefix":
            test = lambda t: t.comm.startswith(prefixes)  # noqa: E731
        elif name == "pcomm_prefix":
            test = lambda t: t.process.comm.startswith(prefixes)  # noqa: E731
        else:
            test = lambda t: t.process.parent_comm.startswith(prefixes)  # noqa: E731
    elif name == "cgroup_prefix":
        prefixes = tuple(value)  # type: ignore[arg-type]
        test = lambda t: t.process.cgroup.startswith(prefixes)  # noqa: E731
    elif name == "cgroup_suffix":
        suffixes = tuple(value)  # type: ignore[arg-type]
        test = lambda t: t.process.cgroup.endswith(suffixes)  # noqa: E731
    elif name == "cgroup_contains":
        parts = tuple(value)  # type: ignore[arg-type]
        test = lambda t: any(p in t.process.cgroup for p in parts)  # noqa: E731
    elif name in ("comm_regex", "cgroup_regex", "cmdline_regex"):
        search = re.compile(value).search  # type: ignore[arg-type]
        if name == "comm_regex":
            test = lambda t: search(t.comm) is not None  # noqa: E731
        elif name == "cgroup_regex":
            test = lambda t: search(t.process.cgroup) is not None  # noqa: E731
        else:
            # A user's cmdline can be long: the match sees its start (MATCH_CHARS), bounded.
            test = lambda t: search(t.process.cmdline[:MATCH_CHARS]) is not None  # noqa: E731
    elif name == "exe":
        exes = frozenset(value)  # type: ignore[arg-type]
        test = lambda t: t.process.exe in exes  # noqa: E731
    elif name == "uid":
        uids = frozenset(value)  # type: ignore[arg-type]
        test = lambda t: t.uid in uids  # noqa: E731
    elif name == "gid":
        gids = frozenset(value)  # type: ignore[arg-type]
        test = lambda t: t.gid in gids  # noqa: E731
    elif name == "nice_above":
        test = lambda t: t.nice > value  # noqa: E731
    elif name == "nice_below":
        test = lambda t: t.nice < value  # noqa: E731
    elif name == "is_group_leader":
        test = lambda t: t.is_leader is value  # noqa: E731
    elif name == "is_kthread":
        test = lambda t: t.is_kthread is value  # noqa: E731
    elif name == "gpu":
        test = lambda t: t.process.gpu is value  # noqa: E731
    elif name == "nvml_gpu_process":
        test = lambda t: t.process.nvml is value  # noqa: E731
    elif name == "session_leader":
        test = lambda t: t.process.session_leader is value  # noqa: E731
    else:  # the policy validator admits only the names above
        raise ValueError(f"unknown predicate {name!r}")
    if pred.negate:
        inner = test
        return lambda t: not inner(t)
    return test


@dataclass(frozen=True, slots=True)
class Classified:
    """A task, the layer it falls in, and which AND-group of that layer matched it."""

    task: Task
    layer: str
    group: int


@dataclass(frozen=True, slots=True)
class GroupResult:
    index: int
    matched: bool
    failed: Predicate | None  # the first predicate that failed, when not matched
    actual: object = None  # the thread's value for it


@dataclass(frozen=True, slots=True)
class LayerResult:
    layer: str
    matched: bool
    groups: tuple[GroupResult, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    task: Task
    layer: str
    group: int  # index of the AND-group that matched in ``layer``
    layers: tuple[LayerResult, ...]  # the layers tried, in order, ending with the winner

    def lines(self) -> list[str]:
        out = []
        for res in self.layers:
            if res.matched:
                group = next(g for g in res.groups if g.matched)
                out.append(f"layer {res.layer!r}: MATCHED by group {group.index}")
                continue
            out.append(f"layer {res.layer!r}: no match")
            for g in res.groups:
                label = _ACTUAL_LABEL[g.failed.name] if g.failed else ""
                out.append(
                    f"  group {g.index}: {g.failed.describe() if g.failed else '?'} failed "
                    f"({label} is {g.actual!r})"
                )
        return out


class Classifier:
    """First-match classification of threads into a policy's layers."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._layers: list[tuple[Layer, list[list[tuple[Predicate, Test]]]]] = [
            (layer, [[(p, _compile(p)) for p in group] for group in layer.match])
            for layer in policy.layers
        ]

    def classify(self, task: Task) -> Layer:
        for layer, groups in self._layers:
            for group in groups:
                if all(test(task) for _, test in group):
                    return layer
        return self.policy.layers[-1]  # unreachable: the validator requires a catch-all

    def classify_all(self, tasks: Iterable[Task]) -> list[Classified]:
        """Every task with its layer and the index of the AND-group that matched.

        Threads of one process that agree on everything a predicate can see of a thread (comm,
        credentials, nice, leadership) share one decision: at 100k threads most are such twins.
        """
        out = []
        seen: dict[tuple, tuple[str, int]] = {}
        for task in tasks:
            key = (id(task.process), task.comm, task.uid, task.gid, task.nice, task.is_leader)
            hit = seen.get(key)
            if hit is None:
                layer, group = self.matched_group(task)
                hit = seen[key] = (layer.name, group)
            out.append(Classified(task, hit[0], hit[1]))
        return out

    def matched_group(self, task: Task) -> tuple[Layer, int]:
        for layer, groups in self._layers:
            for index, group in enumerate(groups):
                if all(test(task) for _, test in group):
                    return layer, index
        return self.policy.layers[-1], 0

    def explain(self, task: Task) -> Explanation:
        results: list[LayerResult] = []
        for layer, groups in self._layers:
            group_results = []
            for index, group in enumerate(groups):
                failed = next(((p, t) for p, t in group if not t(task)), None)
                if failed is None:
                    group_results.append(GroupResult(index, True, None))
                else:
                    pred = failed[0]
                    group_results.append(GroupResult(index, False, pred, _actual(pred.name, task)))
            matched = any(g.matched for g in group_results)
            results.append(LayerResult(layer.name, matched, tuple(group_results)))
            if matched:
                first = next(g.index for g in group_results if g.matched)
                return Explanation(task, layer.name, first, tuple(results))
        last = self.policy.layers[-1].name
        return Explanation(task, last, 0, tuple(results))

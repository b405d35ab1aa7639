"""The ordered first-match classifier, and its explanations.

``Classifier(policy)`` compiles each layer's OR-of-AND predicates into plain Python tests once;
``classify(task)`` returns the first matching layer (the last layer always matches) and
``explain(task)`` says which AND-group of which layer matched and, for every earlier layer, the
first predicate of each group that failed, with the thread's actual value. A thread whose job
refuses protection (``HOSTD_PROTECT=0``, or says nothing under ``[jobs] protect = false``)
skips the layers that protect (``hostd.policy.elevation``). Pure: it reads only
the ``Task`` values from ``hostd.tasks``. Called by the planner's callers and the CLI.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from hostd.model.jobs import protect_choice
from hostd.model.predicates import PREDICATES
from hostd.model.tasks import Process, Task
from hostd.policy import Layer, Policy, Predicate, elevation

Test = Callable[[Task], bool]


def _actual(name: str, task: Task) -> object:
    """The value of the thread that predicate ``name`` looks at (for explanations)."""
    spec = PREDICATES[name]
    return (spec.shown or spec.fact)(task)


def _compile(pred: Predicate) -> Test:
    """A plain test of a thread for the predicate (``hostd.model.predicates`` says what it
    reads and how it tests)."""
    spec, value = PREDICATES[pred.name], pred.value
    fact, how = spec.fact, spec.test
    test: Test
    if how == "prefix":
        prefixes = tuple(value)  # type: ignore[arg-type]
        test = lambda t: fact(t).startswith(prefixes)  # type: ignore[attr-defined] # noqa: E731
    elif how == "suffix":
        suffixes = tuple(value)  # type: ignore[arg-type]
        test = lambda t: fact(t).endswith(suffixes)  # type: ignore[attr-defined] # noqa: E731
    elif how == "contains":
        parts = tuple(value)  # type: ignore[arg-type]
        test = lambda t: any(p in fact(t) for p in parts)  # type: ignore[operator] # noqa: E731
    elif how == "regex":
        search = re.compile(value).search  # type: ignore[arg-type]
        test = lambda t: search(fact(t)) is not None  # type: ignore[arg-type] # noqa: E731
    elif how == "in":
        members = frozenset(value)  # type: ignore[arg-type]
        test = lambda t: fact(t) in members  # noqa: E731
    elif how == "above":
        test = lambda t: fact(t) > value  # type: ignore[operator] # noqa: E731
    elif how == "below":
        test = lambda t: fact(t) < value  # type: ignore[operator] # noqa: E731
    else:  # "is": the policy validator admits only true or false
        test = lambda t: fact(t) is value  # noqa: E731
    if pred.negate:
        inner = test
        return lambda t: not inner(t)
    return test


# Decisions the event path keeps for twins (``Classifier.twin``): each holds its process object
# (a kilobyte or so) alive until the memo is full and forgotten at once.
TWINS = 1024


def _twin_key(task: Task) -> tuple:
    """What a predicate can see of a thread: twins (the same key) share a decision. The
    process by identity: the cache makes a new object when anything of it changes."""
    return (
        id(task.process), task.comm, task.uid, task.gid, task.nice, task.tid == task.process.pid,
        task.activity,
    )  # fmt: skip


class Classified(NamedTuple):
    """A task, the layer it falls in, and which AND-group of that layer matched it (a
    NamedTuple: built once per thread per pass, a third of a frozen dataclass's cost)."""

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
    skipped: str = ""  # why the layer was not tried (its job does not want protection)


@dataclass(frozen=True, slots=True)
class Explanation:
    task: Task
    layer: str
    group: int  # index of the AND-group that matched in ``layer``
    layers: tuple[LayerResult, ...]  # the layers tried, in order, ending with the winner

    def lines(self, groups: bool = True) -> list[str]:
        """A line per layer up to the one that matched; ``groups``: under each that did not,
        each AND-group and the predicate that failed it (else the layers that did not match
        in one line)."""
        out = []
        if not groups:
            missed = [r.layer for r in self.layers if not r.matched and not r.skipped]
            if missed:
                out.append(f"layers before it, no match: {', '.join(missed)} (--why-not: why)")
        for res in self.layers:
            if res.skipped:
                out.append(f"layer {res.layer!r}: skipped: {res.skipped}")
                continue
            if res.matched:
                group = next(g for g in res.groups if g.matched)
                out.append(f"layer {res.layer!r}: MATCHED by group {group.index}")
                continue
            if not groups:
                continue
            out.append(f"layer {res.layer!r}: no match")
            for g in res.groups:
                label = PREDICATES[g.failed.name].label if g.failed else ""
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
        # Layers that protect (real-time, a negative nice, a heavier session, preemption): a
        # job that refuses protection (HOSTD_PROTECT=0), or says nothing under [jobs]
        # protect = false, is not placed in them.
        self.protects = frozenset(ly.name for ly in policy.layers if elevation(ly))
        # The event path's twins (``twin``): a thread storm's threads are twins of each other.
        self._twins: dict[tuple, tuple[Process, Layer, int]] = {}

    def unwanted(self, task: Task) -> str:
        """Why the thread's job does not get protected layers ("" where it does)."""
        job = task.process.job
        if job is None:
            return ""
        choice = protect_choice(task.process.env)
        if choice is False:
            return "its job refuses protection (HOSTD_PROTECT)"
        if choice is None and not self.policy.jobs_protect:
            return "its job did not ask for protection ([jobs] protect = false; HOSTD_PROTECT=1)"
        return ""

    def classify(self, task: Task) -> Layer:
        return self.matched_group(task)[0]

    def classify_all(self, tasks: Iterable[Task]) -> list[Classified]:
        """Every task with its layer and the index of the AND-group that matched.

        Threads of one process that agree on everything a predicate can see of a thread (comm,
        credentials, nice, leadership, what it does) share one decision: at 100k threads most
        are such twins.
        """
        out = []
        seen: dict[tuple, tuple[str, int]] = {}
        for task in tasks:
            key = _twin_key(task)
            hit = seen.get(key)
            if hit is None:
                layer, group = self.matched_group(task)
                hit = seen[key] = (layer.name, group)
            out.append(Classified(task, hit[0], hit[1]))
        return out

    def twin(self, task: Task) -> tuple[Layer, int]:
        """``matched_group``, shared with the thread's twins seen before (``classify_all``): a
        storm's new threads cost a look-up each. Kept while the twin's process object is the
        same one (a changed process is a new object), up to ``TWINS`` of them."""
        key = _twin_key(task)
        hit = self._twins.get(key)
        if hit is not None and hit[0] is task.process:
            return hit[1], hit[2]
        layer, group = self.matched_group(task)
        if len(self._twins) >= TWINS:
            self._twins.clear()
        self._twins[key] = (task.process, layer, group)
        return layer, group

    def matched_group(self, task: Task) -> tuple[Layer, int]:
        refused = self.protects and self.unwanted(task)
        for layer, groups in self._layers:
            if refused and layer.name in self.protects:
                continue
            for index, group in enumerate(groups):
                if all(test(task) for _, test in group):
                    return layer, index
        return self.policy.layers[-1], 0

    def explain(self, task: Task) -> Explanation:
        results: list[LayerResult] = []
        refused = self.protects and self.unwanted(task)
        for layer, groups in self._layers:
            if refused and layer.name in self.protects:
                results.append(LayerResult(layer.name, False, (), skipped=refused))
                continue
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

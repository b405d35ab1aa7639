"""A layer's checks that no declaration can say: its name, its ``match`` predicates, ``cpus``,
``sched``, ``min_freq`` and ``util``, the rules between its keys, and the warning for a layer
that elevates its threads behind what any user controls (``gated``, ``elevation``).

Pure. ``LayerChecks`` is a part of ``hostd.policy.check.Checker`` (``fail``, ``attempt``,
``table``, ``values`` and the scalar checks are there); ``gated`` is read by ``hostd.preempt``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from hostd.model.predicates import PREDICATES as PREDICATE_SPECS
from hostd.policy.errors import NOTHING, key_name
from hostd.policy.errors import did_you_mean as _did_you_mean
from hostd.policy.regex import regex_problem
from hostd.policy.schema import RT_POLICIES, RULE_CHOICES, SCHED_POLICIES, allowed, keys_of
from hostd.policy.values import CpuAmount, Layer, Predicate, Sched

if TYPE_CHECKING:
    from hostd.policy.errors import PolicyError


# The predicates (hostd.model.predicates), grouped by the argument they take.
def _taking(arg: str) -> tuple[str, ...]:
    return tuple(name for name, spec in PREDICATE_SPECS.items() if spec.arg == arg)


STRING_PREDICATES = _taking("strings")
REGEX_PREDICATES = _taking("regex")
ID_PREDICATES = _taking("ids")
NICE_PREDICATES = _taking("nice")
BOOL_PREDICATES = _taking("bool")
PREDICATES = tuple(PREDICATE_SPECS)
# Predicates any unprivileged user controls for their own threads (see the table).
USER_CONTROLLED = frozenset(name for name, s in PREDICATE_SPECS.items() if s.user_controlled)
_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_CPUS = 'a CPU count (integer >= 0), a fraction in (0, 1] or a percentage like "50%"'
_ON_OWN_CPUS = ("governor", "min_freq", "epp")


class Skip(Exception):
    """A part of the policy had errors (already in the checker's ``errors``): left out."""


def _is_gate(pred: Predicate) -> bool:
    """Whether a predicate holds back an unprivileged user who renames a thread.

    uid/gid, an anchored cgroup path, and the GPU signals when they must be true. (The GPU
    device files are often open to every local user: on a GPU host, GPU users are trusted.)
    """
    if pred.negate or pred.name in USER_CONTROLLED:
        return False
    if pred.name in BOOL_PREDICATES:
        return pred.value is True
    if pred.name == "cgroup_regex":
        return str(pred.value).startswith("^/")
    return True


def gated(layer: Layer) -> bool:
    """Whether every AND-group of the layer holds a gate (``_is_gate``): no user lands in it
    by what they set (a name, an argument, an environment)."""
    return all(any(_is_gate(pred) for pred in group) for group in layer.match)


def elevation(layer: Layer) -> str | None:
    """What a layer gives its threads beyond what any user may take for themselves, in words
    (None: nothing): real-time, a negative nice, a heavier session, precedence over other
    work. (A catch-all group gives it to everything, which is the policy's choice, not a
    user's: it is not warned about.)"""
    sched = layer.sched
    if sched.realtime:
        return f"is real-time ({sched.policy})"
    if sched.nice is not None and sched.nice < 0:
        return f"gives nice {sched.nice}"
    if sched.group_nice is not None and sched.group_nice < 0:
        return f"gives its sessions nice {sched.group_nice}"
    if layer.preempt:
        return "preempts other work (preempt = true)"
    return None


def _range(name: str) -> tuple[int, int]:
    k = next(k for k in keys_of(Sched) if k.attr == name)
    return int(k.lo), int(k.hi)  # type: ignore[arg-type]


class LayerChecks:
    """The checks of a ``[[layer]]``'s keys (a mixin of ``Checker``)."""

    source: str
    errors: list[PolicyError]
    warnings: list[str]
    fail: Any
    attempt: Any
    table: Any
    values: Any
    integer: Any
    choice: Any

    def layer(self, value: object, key: str) -> Layer:
        before = len(self.errors)
        data = self.table(value, key, allowed(Layer))
        for k in keys_of(Layer):
            if k.required and k.name not in data:
                self.errors.append(
                    self.fail(f"{key}.{k.name}", NOTHING, "this key (it is required)")
                )
        got = self.values(Layer, data, key)
        kind = got.get("kind", "open")
        preempt, preemptible = got.get("preempt") is True, got.get("preemptible") is True
        sched = got.get("sched", Sched())
        if preempt and preemptible:
            self.errors.append(
                self.fail(
                    f"{key}.preemptible",
                    True,
                    "not both: a layer that preempts others (preempt = true) cannot yield to them",
                )
            )
        if preemptible and isinstance(sched, Sched) and sched.realtime:
            self.errors.append(
                self.fail(
                    f"{key}.preemptible",
                    True,
                    f"no preemptible real-time layer (sched.policy = {sched.policy!r})",
                )
            )
        own = any(isinstance(got.get(name), str) for name in _ON_OWN_CPUS)
        if kind == "open" and (own or got.get("irqs") == "avoid"):
            self.errors.append(
                self.fail(
                    key,
                    NOTHING,
                    'governor, min_freq, epp and irqs = "avoid" only on a "confined" or '
                    '"grouped" layer (they act on the layer\'s own CPUs)',
                )
            )
        if len(self.errors) > before:
            raise Skip
        layer = Layer(**got)
        gives = elevation(layer)
        if gives:
            for i, group in enumerate(layer.match):
                if group and not any(_is_gate(p) for p in group):
                    self.warnings.append(
                        f"{self.source}: {key}.match[{i}]: layer {layer.name!r} {gives} "
                        "but this group tests only what any user controls "
                        "(comm, cmdline, ...); any user could enter it by renaming a thread: "
                        "add a uid, cgroup or gpu condition"
                    )
        return layer

    def layer_name(self, value: object, key: str, got: dict) -> str:
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            raise self.fail(key, value, "a name of 1-32 lowercase letters, digits, '-' or '_'")
        return value

    def _kind(self, got: dict) -> str:
        kind = got.get("kind", "open")
        if not isinstance(kind, str):  # its own error is already said
            raise Skip
        return kind

    def cpu_amount(self, value: object, key: str) -> CpuAmount:
        if isinstance(value, bool):
            raise self.fail(key, value, _CPUS)
        if isinstance(value, int):
            if value < 0:
                raise self.fail(key, value, _CPUS)
            return CpuAmount(count=value)
        if isinstance(value, float):
            if not 0 < value <= 1:
                raise self.fail(key, value, _CPUS)
            return CpuAmount(fraction=value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", value)
            if match and 0 < float(match.group(1)) <= 100:
                return CpuAmount(fraction=float(match.group(1)) / 100)
        raise self.fail(key, value, _CPUS)

    def cpus(self, value: object, key: str, got: dict) -> tuple[CpuAmount, CpuAmount]:
        if self._kind(got) == "open":
            raise self.fail(key, value, 'no cpus on an "open" layer (it uses what is left)')
        cpus = self.table(value, key, ("min", "max"))
        cpus_min, cpus_max = CpuAmount(count=0), CpuAmount(fraction=1.0)
        if "min" in cpus:
            cpus_min = self.cpu_amount(cpus["min"], f"{key}.min")
        if "max" in cpus:
            cpus_max = self.cpu_amount(cpus["max"], f"{key}.max")
        if cpus_max.count == 0:
            raise self.fail(f"{key}.max", 0, "at least 1 CPU")
        same_unit = (cpus_min.count is None) == (cpus_max.count is None)
        if same_unit and cpus_min.resolve(1000) > cpus_max.resolve(1000):
            raise self.fail(key, value, "min no larger than max")
        return cpus_min, cpus_max

    def util(self, value: object, key: str, got: dict) -> tuple[float, float]:
        """``util = { low, high }``: 0 < low < high <= 1 (fractions of the layer's CPUs' time)."""
        if self._kind(got) == "open":
            raise self.fail(
                key, value, 'no util on an "open" layer (it has no CPUs of its own to size)'
            )
        data = self.table(value, key, ("low", "high"))
        low = self.attempt(
            self.fraction, data.get("low", 0.5), f"{key}.low", False,
            "the busy share of its CPUs below which it shrinks",
        )  # fmt: skip
        high = self.attempt(
            self.fraction, data.get("high", 0.8), f"{key}.high", True,
            "the busy share of its CPUs above which it grows",
        )  # fmt: skip
        if low is None or high is None:
            raise Skip
        if low >= high:
            raise self.fail(key, value, "low below high (a band to stay in, not a point)")
        return low, high

    def fraction(self, value: object, key: str, one_ok: bool, what: str) -> float:
        """A fraction above 0 and below 1 (up to 1 with ``one_ok``)."""
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value != value  # NaN
            or not (0 < value < 1 or (one_ok and value == 1))
        ):
            raise self.fail(key, value, f"a fraction in (0, {'1]' if one_ok else '1)'}: {what}")
        return float(value)

    def min_freq(self, value: object, key: str, got: dict) -> str:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return str(value)
        if isinstance(value, str):
            if value == "max":
                return value
            match = re.fullmatch(r"(\d+)%", value)
            if match and 0 < int(match.group(1)) <= 100:
                return value
        raise self.fail(key, value, 'a frequency in kHz (integer > 0), "max" or a percentage')

    def sched(self, value: object, key: str, got: dict) -> Sched:
        data = self.table(value, key, allowed(Sched))
        policy = None
        if "policy" in data:
            policy = self.choice(data["policy"], f"{key}.policy", SCHED_POLICIES)
        out: dict[str, Any] = {"policy": policy}
        if policy in RT_POLICIES:
            if "priority" not in data:
                raise self.fail(f"{key}.priority", NOTHING, f"a priority 1-99 for {policy}")
            out["priority"] = self.integer(data["priority"], f"{key}.priority", *_range("priority"))
        elif "priority" in data:
            raise self.fail(
                f"{key}.priority", data["priority"], 'no priority unless policy is "fifo" or "rr"'
            )
        if "nice" in data:
            if policy in (*RT_POLICIES, "idle"):
                raise self.fail(
                    f"{key}.nice",
                    data["nice"],
                    f"no nice with policy {policy!r} (it has no effect)",
                )
            out["nice"] = self.integer(data["nice"], f"{key}.nice", *_range("nice"))
        if "reset_on_fork" in data:
            out["reset_on_fork"] = data["reset_on_fork"]
            if not isinstance(data["reset_on_fork"], bool):
                raise self.fail(f"{key}.reset_on_fork", data["reset_on_fork"], "true or false")
        if "max_rt_threads" in data:
            if policy not in RT_POLICIES:
                raise self.fail(
                    f"{key}.max_rt_threads", data["max_rt_threads"], 'only with "fifo" or "rr"'
                )
            out["max_rt_threads"] = self.integer(
                data["max_rt_threads"], f"{key}.max_rt_threads", *_range("max_rt_threads")
            )
        if "group_nice" in data:
            out["group_nice"] = self.integer(
                data["group_nice"], f"{key}.group_nice", *_range("group_nice")
            )
        return Sched(**out)

    def match(self, value: object, key: str, got: dict) -> tuple[tuple[Predicate, ...], ...]:
        expected = "a list of AND-groups, each a list of predicate tables ([[]] matches all)"
        if not isinstance(value, list) or not value:
            raise self.fail(key, value, expected)
        groups = []
        before = len(self.errors)
        for i, group in enumerate(value):
            if not isinstance(group, list):
                self.errors.append(self.fail(f"{key}[{i}]", group, expected))
                continue
            preds = [
                self.attempt(self.predicate, p, f"{key}[{i}][{j}]") for j, p in enumerate(group)
            ]
            groups.append(tuple(p for p in preds if p is not None))
        if len(self.errors) > before:
            raise Skip
        return tuple(groups)

    def predicate(self, value: object, key: str) -> Predicate:
        if not isinstance(value, dict) or len(value) != 1:
            raise self.fail(
                key, value, 'a table with exactly one predicate, e.g. { comm_prefix = "pt_" }'
            )
        ((name, arg),) = value.items()
        sub = f"{key}.{key_name(name)}"
        if name == "not":
            inner = self.predicate(arg, sub)
            if inner.negate:
                raise self.fail(sub, arg, "a predicate (not inside not is not allowed)")
            return Predicate(inner.name, inner.value, negate=True)
        if name in STRING_PREDICATES:
            return Predicate(name, self._strings(name, arg, sub))
        if name in REGEX_PREDICATES:
            if not isinstance(arg, str) or not arg:
                raise self.fail(sub, arg, "a regular expression as a non-empty string")
            why = regex_problem(arg)
            if why:
                raise self.fail(sub, arg, f"a regular expression that {why}")
            return Predicate(name, arg)
        if name in ID_PREDICATES:
            items = [arg] if isinstance(arg, int) and not isinstance(arg, bool) else arg
            if (
                not isinstance(items, list)
                or not items
                or not all(
                    isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in items
                )
            ):
                raise self.fail(sub, arg, "an id (integer >= 0) or a list of ids")
            return Predicate(name, tuple(items))
        if name in NICE_PREDICATES:
            return Predicate(name, self.integer(arg, sub, -20, 19))
        if name in BOOL_PREDICATES:
            if not isinstance(arg, bool):
                raise self.fail(sub, arg, "true or false")
            return Predicate(name, arg)
        raise self.fail(
            sub,
            NOTHING,
            "one of " + ", ".join((*PREDICATES, "not")),
            problem="unknown predicate",
            hint=_did_you_mean(name, (*PREDICATES, "not")),
        )

    def _strings(self, name: str, arg: object, sub: str) -> tuple[str, ...]:
        items = [arg] if isinstance(arg, str) else arg
        if (
            not isinstance(items, list)
            or not items
            or not all(isinstance(s, str) and s for s in items)
        ):
            raise self.fail(sub, arg, "a non-empty string or a list of non-empty strings")
        rule = PREDICATE_SPECS[name].rule
        for s in items:
            if rule == "comm" and len(s.encode()) > 15:
                raise self.fail(sub, s, "at most 15 bytes of UTF-8 (the kernel keeps 15 of a comm)")
            if rule in RULE_CHOICES:
                what, choices = RULE_CHOICES[rule]
                if s not in choices:
                    expected = f"{what}: " + ", ".join(choices)
                    raise self.fail(sub, s, expected, hint=_did_you_mean(s, choices))
            if rule == "path" and not s.startswith("/"):
                raise self.fail(
                    sub, s, "an absolute path starting with '/' (the kernel shows no other)"
                )
        return tuple(items)

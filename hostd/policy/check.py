"""The checker: walks a parsed policy and collects every problem, each with its key path and
its position in the text (``hostd.policy.positions``); one part's error does not hide another's.

Driven by the declarations (``hostd.policy.values``, ``hostd.policy.tables``): a table's keys,
their types, ranges, choices, defaults and lower bounds set by another key are read from them
(``Checker.values``), and a table's frozen value is built from what they gave, by keyword.
What no declaration can say is a method here or in ``hostd.policy.layers`` named by its key's
``parse``: the version, ``pool_min``, the metrics address, and a layer's name, match, cpus,
sched, min_freq and util; and the rules between keys and layers (``Checker.policy``).

Pure. Called by ``hostd.policy.parse_policy``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from pathlib import Path
from typing import Any

from hostd.policy.errors import NOTHING, PolicyError, did_you_mean, key_name
from hostd.policy.layers import LayerChecks, Skip
from hostd.policy.positions import position
from hostd.policy.schema import Key, allowed, keys_of
from hostd.policy.tables import Policy
from hostd.policy.values import CpuAmount

_FAILED = object()  # a key whose value had errors (in ``errors``)
# The order in which the top level is checked, so errors come in the order they always did.
_TOP_ORDER = (
    "version", "agent", "layer", "name", "description", "preempt", "guard", "metrics",
    "sizing", "jobs", "cgroups", "pool_min",
)  # fmt: skip


class Checker(LayerChecks):
    """Collects ``errors`` and ``warnings`` of one policy text (``source`` names it)."""

    def __init__(self, source: str, text: str = "") -> None:
        self.source, self.text = source, text
        self.warnings: list[str] = []
        self.errors: list[PolicyError] = []

    def fail(
        self, key: str, value: object, expected: str, problem: str = "", hint: str = ""
    ) -> PolicyError:
        where = position(self.text, key) if self.text and key else None
        return PolicyError(
            self.source, key, value, expected, problem, position=where, hint=hint
        )  # fmt: skip

    def attempt(self, fn, *args, default=None):  # type: ignore[no-untyped-def]
        """``fn(*args)``, or ``default`` when it raised a PolicyError (kept in ``errors``)."""
        try:
            return fn(*args)
        except PolicyError as exc:
            self.errors.append(exc)
        except Skip:
            pass
        return default

    # -- the declared keys ---------------------------------------------------------------------
    def table(self, value: object, key: str, names: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, value, f"a table with keys {', '.join(names)}")
        for name in value:
            if name not in names:
                self.errors.append(
                    self.fail(
                        f"{key}.{key_name(name)}" if key else key_name(name),
                        NOTHING,
                        f"one of {', '.join(names)}",
                        problem="unknown key (a typo?)",
                        hint=did_you_mean(name, names),
                    )
                )
        return value

    def values(
        self, cls: type, data: dict, prefix: str, only: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """Each declared key of ``cls`` (those named in ``only``, in that order) checked:
        ``{attribute: value}`` for those ``data`` sets (``_FAILED`` for a bad one), what
        another key's bound reads included."""
        keys = {k.name: k for k in keys_of(cls)}
        got: dict[str, Any] = {}
        for name in only if only is not None else tuple(keys):
            k = keys[name]
            path = f"{prefix}.{name}" if prefix else name
            if name not in data and not k.lo_key:
                continue
            raw = data.get(name, k.default)
            value = self.attempt(self.value, k, raw, path, got, cls, default=_FAILED)
            if k.fields and value is not _FAILED:
                got.update(zip(k.fields, value, strict=True))
            else:
                got[k.attr] = value
        return got

    def value(self, k: Key, raw: object, path: str, got: dict, cls: type) -> object:
        """One key's value, by its declared type (a custom one: its ``parse`` method)."""
        if k.parse:
            return getattr(self, k.parse)(raw, path, got)
        if k.type == "table":
            return self.table_value(k.value, raw, path)
        if k.type == "bool":
            return self.boolean(raw, path)
        if k.type == "int":
            if k.keep and raw == "keep":
                return None
            assert k.lo is not None and k.hi is not None
            return self.integer(raw, path, int(k.lo), int(k.hi), ', or "keep"' if k.keep else "")
        if k.type == "number":
            lo = k.lo
            if k.lo_key:
                bound = got.get(k.lo_key, _default(cls, k.lo_key))
                if bound is _FAILED:
                    raise Skip
                lo = bound * k.lo_factor
            return self.number(raw, path, lo, k.hi, k.what)  # type: ignore[arg-type]
        if k.type == "string":
            return self.string(raw, path)
        if k.type == "text":
            if not isinstance(raw, str):
                raise self.fail(path, raw, "a string")
            return raw
        if k.type == "choice":
            return self.choice(raw, path, k.choices)
        if k.type == "words":
            return self.words(raw, path, (k.choices_what, k.choices) if k.choices else None)
        if k.type == "ids":
            return self.ids(raw, path)
        raise AssertionError(f"{path}: no check for type {k.type!r}")  # pragma: no cover

    def table_value(self, cls: type, raw: object, path: str) -> Any:
        """A nested table (``[preempt]``): its keys checked, its value built by keyword."""
        data = self.table(raw, path, allowed(cls))
        got = self.values(cls, data, path)
        if _FAILED in got.values():
            raise Skip
        return cls(**got)

    # -- scalars -------------------------------------------------------------------------------
    def choice(self, value: object, key: str, choices: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            expected = "one of " + ", ".join(f'"{c}"' for c in choices)
            raise self.fail(key, value, expected, hint=did_you_mean(value, choices))
        return value

    def string(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, value, "a non-empty string")
        return value

    def integer(self, value: object, key: str, lo: int, hi: int, also: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(key, value, f"an integer from {lo} to {hi}{also}")
        return value

    def number(self, value: object, key: str, lo: float, hi: float, what: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not lo <= value <= hi
        ):
            raise self.fail(key, value, f"{what}, {lo:g} to {hi:g}")
        return float(value)

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "true or false")
        return value

    def words(
        self, value: object, key: str, choices: tuple[str, tuple[str, ...]] | None = None
    ) -> tuple[str, ...]:
        """A list of non-empty strings (possibly empty), each one of ``choices`` if given."""
        if isinstance(value, tuple):
            value = list(value)  # a default
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise self.fail(key, value, "a list of non-empty strings")
        if choices is not None:
            what, words = choices
            for i, s in enumerate(value):
                if s not in words:
                    raise self.fail(
                        f"{key}[{i}]", s, f"{what}: " + ", ".join(words),
                        hint=did_you_mean(s, words),
                    )  # fmt: skip
        return tuple(value)

    def ids(self, value: object, key: str) -> tuple[int, ...]:
        """A list of user or group ids (possibly empty)."""
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in value
        ):
            raise self.fail(key, value, "a list of ids (integers >= 0)")
        return tuple(value)

    # -- the keys no declaration can say -------------------------------------------------------
    def version(self, value: object, key: str, got: dict) -> int:
        if type(value) is not int or value != 1:
            raise self.fail(key, value, "1 (the only policy version)")
        return value

    def address(self, value: object, key: str, got: dict) -> str:
        try:
            ipaddress.ip_address(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise self.fail(key, value, 'an IP address to listen on, e.g. "127.0.0.1"') from None
        return str(value)

    def pool_min(self, value: object, key: str, got: dict) -> CpuAmount:
        amount = self.cpu_amount(value, key)
        if amount.count == 0:
            raise self.fail(key, 0, "at least 1: the catch-all layer needs a CPU")
        return amount

    # -- the policy ----------------------------------------------------------------------------
    def policy(self, data: dict, raw: bytes) -> Policy:
        self.table(data, "", allowed(Policy))
        if "version" not in data:
            self.errors.append(self.fail("version", NOTHING, "version = 1"))
        if "name" not in data:
            data = {**data, "name": Path(self.source).stem if self.source else "policy"}
        got = self.values(Policy, data, "", only=_TOP_ORDER[:3])
        if "layer" not in data:
            self.errors.append(
                self.fail("layer", NOTHING, "at least one [[layer]], the last one a catch-all")
            )
        got.update(self.values(Policy, data, "", only=_TOP_ORDER[3:5]))
        layers = got.get("layers", ())
        valid = () if layers is _FAILED else tuple(ly for ly in layers if ly is not None)
        if any(ly.preemptible for ly in valid) and not any(ly.preempt for ly in valid):
            first = next(i for i, ly in enumerate(layers) if ly is not None and ly.preemptible)
            self.errors.append(
                self.fail(
                    f"layer[{first}].preemptible",
                    True,
                    "a layer with preempt = true for it to yield to (none has it)",
                )
            )
        got.update(self.values(Policy, data, "", only=_TOP_ORDER[5:]))
        if self.errors:
            raise PolicyError.all_of(self.errors)
        got["layers"] = valid
        return Policy(
            source=self.source,
            sha256=hashlib.sha256(raw).hexdigest(),
            warnings=tuple(self.warnings),
            **got,
        )

    def layers(self, value: object, key: str, got: dict) -> tuple:
        """``[[layer]]``: each layer checked (a bad one is None), then the rules between them:
        unique names, one catch-all and that one last."""
        if not isinstance(value, list) or not value:
            raise self.fail(key, value, "at least one [[layer]], the last one a catch-all")
        layers = [self.attempt(self.layer, ly, f"{key}[{i}]") for i, ly in enumerate(value)]
        names: set[str] = set()
        for i, layer in enumerate(layers):
            if layer is None:
                continue
            if layer.name in names:
                self.errors.append(
                    self.fail(f"layer[{i}].name", layer.name, "a name no other layer has")
                )
            names.add(layer.name)
            if layer.catch_all and i != len(layers) - 1:
                self.errors.append(
                    self.fail(
                        f"layer[{i}].match",
                        NOTHING,
                        "no empty AND-group before the last layer (it would match every thread "
                        "and leave the layers after it unreachable)",
                    )
                )
        last = layers[-1]
        if last is not None and not last.catch_all:
            self.errors.append(
                self.fail(
                    f"layer[{len(layers) - 1}].match",
                    NOTHING,
                    f"the last layer ({last.name!r}) to be a catch-all: match = [[]]",
                )
            )
        return tuple(layers)


def _default(cls: type, attr: str) -> object:
    return next(k.default for k in keys_of(cls) if k.attr == attr)

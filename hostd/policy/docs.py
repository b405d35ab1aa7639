"""What the key declarations (``hostd.policy.values``) are also made into: the policy reference
(``docs/policy.md``), the JSON Schema editors check policy files with
(``docs/json/policy.schema.json``, draft 2020-12), and every effective value of a policy
(``hostd policy show``, ``--json``).

Pure. ``python -m hostd.policy.docs reference > docs/policy.md`` and ``python -m
hostd.policy.docs schema > docs/json/policy.schema.json`` regenerate the files;
``tests/unit/test_policy_schema.py`` fails when they differ from what the declarations make.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from hostd.model.predicates import PREDICATES as PREDICATE_SPECS
from hostd.policy.schema import RT_POLICIES, RULE_CHOICES, Key, keys_of, toml_value
from hostd.policy.tables import Policy
from hostd.policy.values import Predicate, Sched

_ON_OWN_CPUS = ("cpus", "util", "governor", "min_freq", "epp")  # not on an open layer
_PARTS = {"cpus": ("min", "max"), "util": ("low", "high")}  # a key that sets two fields
SCHEMA_ID = "https://hostd.invalid/docs/json/policy.schema.json"


# -- the tables, walked ------------------------------------------------------------------------
def tables() -> list[tuple[str, type, str]]:
    """Every table a policy has: (its header, its value class, its doc), top level first."""
    out = [("", Policy, "The top level of a policy file.")]
    for k in keys_of(Policy):
        if k.type == "table":
            header = f"[[{k.name}]]" if k.many else f"[{k.name}]"
            out.append((header, k.value, k.doc))
    out.append(("[[layer]] sched", Sched, " ".join((Sched.__doc__ or "").split())))
    return out


def _own(cls: type) -> list[Key]:
    """A table's keys that are values, not tables of their own (``sched`` is both)."""
    return [k for k in keys_of(cls) if k.type != "table" or k.value is Sched]


# -- the reference -----------------------------------------------------------------------------
def _doc(doc: str) -> str:
    """A doc on one line, without a table docstring's "``[agent]``: "."""
    doc = " ".join(doc.split())
    return doc.split(": ", 1)[1] if doc.startswith("``[") else doc


def default_text(k: Key) -> str:
    if k.shown_default:
        return k.shown_default
    if k.required and k.default is None:
        return "(required)"
    if k.type == "table" and k.value is Sched:
        return "{}"
    value = toml_value(k.default)
    return "(unset)" if value is None else json.dumps(value)


def range_text(k: Key) -> str:
    keep = ', or "keep"' if k.keep else ""
    if k.type == "int":
        return f"{_num(k.lo)} to {_num(k.hi)}{keep}"
    if k.type == "number":
        low = f"{k.lo_factor:g} times {k.lo_key}" if k.lo_key else _num(k.lo)
        return f"{low.removeprefix('1 times ')} to {_num(k.hi)}"
    if k.type == "choice":
        return " \\| ".join(f'"{c}"' for c in k.choices)
    if k.type == "words" and k.choices:
        return "each one of " + ", ".join(f'"{c}"' for c in k.choices)
    if k.type == "ids":
        return "each 0 to 4294967295"
    if k.type == "string":
        return "non-empty"
    return ""


def _num(x: float | None) -> str:
    assert x is not None
    return str(int(x)) if x == int(x) else f"{x:g}"


def _type_text(k: Key) -> str:
    if k.shown_type:
        return k.shown_type
    names = {"int": "integer", "number": "number", "bool": "boolean", "string": "string",
             "text": "string", "choice": "string", "words": "list of strings",
             "ids": "list of integers", "table": "table"}  # fmt: skip
    return names.get(k.type, "see doc")


def reference() -> str:
    """``docs/policy.md``: every table and key with its type, default, range or choices, doc."""
    lines = [
        "# Policy reference",
        "",
        "<!-- Generated from hostd/policy/values.py and tables.py by",
        "     `python -m hostd.policy.docs reference`;",
        "     do not edit (tests/unit/test_policy_schema.py fails when it drifts). -->",
        "",
        "A policy is a TOML file: the top-level keys, the tables below (each optional) and one",
        "or more `[[layer]]`s, the last one a catch-all (`match = [[]]`). Unknown keys are errors.",
        "Editors check and complete policy files with the JSON Schema",
        "[`docs/json/policy.schema.json`](json/policy.schema.json) (taplo / Even Better TOML:",
        "a first line `#:schema PATH/TO/policy.schema.json`, relative to the policy file, or a",
        "`[[rule]]` with `schema.path` in `.taplo.toml`). `hostd policy show --policy FILE",
        "[--json]` prints every effective value.",
        'docs/policies.md, "Policies", says what layers and their predicates are for.',
        "",
    ]
    for header, cls, doc in tables():
        doc = _doc(doc)
        doc = doc[:1].upper() + doc[1:]
        lines += [f"## {f'`{header}`' if header else 'Top level'}", "", doc, ""]
        lines += [
            "| key | type | default | range / choices | since | doc |",
            "|---|---|---|---|---|---|",
        ]
        for k in _own(cls):
            cells = (f"`{k.name}`", _type_text(k), f"`{default_text(k)}`", range_text(k),
                     k.since, k.doc.replace("|", "\\|"))  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Predicates of `match`", "",
              "Each element of an AND-group is a table with one predicate; "
              "`{ not = { ... } }` negates one.", "",
              "| predicate | takes | tests | user-controlled |", "|---|---|---|---|"]  # fmt: skip
    for name, spec in PREDICATE_SPECS.items():
        takes = {"strings": "a string or a list of strings", "regex": "a regular expression",
                 "ids": "an id or a list of ids", "nice": "a nice value, -20 to 19",
                 "bool": "true or false"}[spec.arg]  # fmt: skip
        if spec.rule in RULE_CHOICES:
            what, words = RULE_CHOICES[spec.rule]
            takes += f" ({what}: {', '.join(words)})"
        controlled = "yes" if spec.user_controlled else "no"
        lines.append(f"| `{name}` | {takes} | {spec.label} ({spec.test}) | {controlled} |")
    return "\n".join(lines) + "\n"


# -- the JSON Schema ---------------------------------------------------------------------------
def _key_schema(k: Key) -> dict[str, Any]:
    if k.schema is not None:
        out = dict(k.schema)
    elif k.type == "bool":
        out = {"type": "boolean"}
    elif k.type == "int":
        out = {"type": "integer", "minimum": k.lo, "maximum": k.hi}
        if k.keep:
            out = {"anyOf": [out, {"const": "keep"}]}
    elif k.type == "number":
        out = {"type": "number", "maximum": k.hi}
        if not k.lo_key:  # a bound set by another key: no JSON Schema says it
            out["minimum"] = k.lo
    elif k.type == "string":
        out = {"type": "string", "pattern": r"\S"}
    elif k.type == "text":
        out = {"type": "string"}
    elif k.type == "choice":
        out = {"enum": list(k.choices)}
    elif k.type == "words":
        item: dict[str, Any] = {"type": "string", "minLength": 1}
        if k.choices:
            item["enum"] = list(k.choices)
        out = {"type": "array", "items": item}
    elif k.type == "ids":
        out = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}}
    elif k.type == "table" and k.many:
        out = {"type": "array", "minItems": 1, "items": {"$ref": f"#/$defs/{k.name}"}}
    elif k.type == "table":
        out = {"$ref": f"#/$defs/{k.name}"}
    else:  # pragma: no cover - a custom key declares its schema
        raise AssertionError(f"{k.name}: a custom key without a schema")
    out = {"description": _doc(k.doc), **out}
    default = toml_value(k.default)
    if default is not None and k.type not in ("table", "custom") and not k.shown_default:
        out["default"] = default
    return out


def _object(cls: type) -> dict[str, Any]:
    keys = keys_of(cls)
    out: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {k.name: _key_schema(k) for k in keys},
    }
    required = [k.name for k in keys if k.required]
    if required:
        out["required"] = required
    return out


def _predicate_schemas() -> dict[str, Any]:
    tests: dict[str, Any] = {}
    for name, spec in PREDICATE_SPECS.items():
        if spec.arg == "strings":
            one: dict[str, Any] = {"type": "string", "minLength": 1}
            if spec.rule == "comm":
                one["maxLength"] = 15
            if spec.rule == "path":
                one["pattern"] = "^/"
            if spec.rule in RULE_CHOICES:
                one["enum"] = list(RULE_CHOICES[spec.rule][1])
            tests[name] = {"anyOf": [one, {"type": "array", "minItems": 1, "items": one}]}
        elif spec.arg == "regex":
            tests[name] = {"type": "string", "minLength": 1}
        elif spec.arg == "ids":
            one = {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}
            tests[name] = {"anyOf": [one, {"type": "array", "minItems": 1, "items": one}]}
        elif spec.arg == "nice":
            tests[name] = {"type": "integer", "minimum": -20, "maximum": 19}
        else:
            tests[name] = {"type": "boolean"}
    one_of = {"type": "object", "minProperties": 1, "maxProperties": 1}
    return {
        "test": {**one_of, "additionalProperties": False, "properties": tests},
        "predicate": {
            "anyOf": [
                {"$ref": "#/$defs/test"},
                {**one_of, "required": ["not"], "properties": {"not": {"$ref": "#/$defs/test"}}},
            ]
        },
    }


def _absent(*names: str) -> dict[str, Any]:
    return {"not": {"anyOf": [{"required": [n]} for n in names]}}


def _is(**values: Any) -> dict[str, Any]:
    return {"required": list(values), "properties": {n: {"const": v} for n, v in values.items()}}


def json_schema() -> dict[str, Any]:
    """``docs/json/policy.schema.json``: the declarations, and the rules between keys that a
    JSON Schema can say (a rule it cannot: tests/unit/test_policy_schema.py lists them)."""
    defs: dict[str, Any] = {}
    for header, cls, _doc in tables()[1:]:
        defs[header.strip("[]").replace("layer]] ", "")] = _object(cls)
    rt = {"enum": list(RT_POLICIES)}
    sched = defs["sched"]
    sched["allOf"] = [
        {  # a real-time policy needs its priority; nothing else takes one, or a thread cap
            "if": {"required": ["policy"], "properties": {"policy": rt}},
            "then": {**_absent("nice"), "required": ["priority"]},
            "else": _absent("priority", "max_rt_threads"),
        },
        {"if": _is(policy="idle"), "then": _absent("nice")},
    ]
    layer = defs["layer"]
    defs["match"] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "array", "items": {"$ref": "#/$defs/predicate"}},
    }
    pool_min = next(k for k in keys_of(Policy) if k.name == "pool_min")
    amount = {n: v for n, v in _key_schema(pool_min).items() if n != "description"}
    defs["cpus"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"min": amount, "max": {**amount, "not": {"const": 0}}},
    }
    layer["allOf"] = [
        {  # an open layer has no CPUs of its own: nothing that acts on them
            "if": {"properties": {"kind": {"const": "open"}}},
            "then": {"not": {"anyOf": [*({"required": [n]} for n in _ON_OWN_CPUS),
                                        _is(irqs="avoid")]}},
        },
        {"not": _is(preempt=True, preemptible=True)},
        {"not": {"required": ["preemptible", "sched"],
                 "properties": {"preemptible": {"const": True},
                                "sched": {"required": ["policy"], "properties": {"policy": rt}}}}},
    ]  # fmt: skip
    defs.update(_predicate_schemas())
    top = _object(Policy)
    top["properties"]["pool_min"]["not"] = {"const": 0}
    top["allOf"] = [  # a preemptible layer needs a layer to yield to
        {
            "if": {"properties": {"layer": {"contains": _is(preemptible=True)}}},
            "then": {"properties": {"layer": {"contains": _is(preempt=True)}}},
        }
    ]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "hostd policy",
        "description": "A hostd policy file (TOML). Generated by hostd.policy.docs: do not edit.",
        **top,
        "$defs": defs,
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


# -- every effective value ---------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if isinstance(value, Predicate):
        inner = value.value
        arg = list(inner) if isinstance(inner, tuple) else inner
        return {"not": {value.name: arg}} if value.negate else {value.name: arg}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return toml_value(value)


def toml_default(cls: type, k: Key) -> Any:
    """A key's default as a policy writes it (a key that sets several fields: all of theirs)."""
    if not k.fields:
        return _plain(k.default)
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    parts = []
    for name in k.fields:
        f = defaults[name]
        parts.append(f.default_factory() if f.default is dataclasses.MISSING else f.default)  # type: ignore[misc]
    return None if parts[0] is None else dict(zip(_PARTS[k.name], map(_plain, parts), strict=True))


def effective(obj: Any) -> dict[str, Any]:
    """Every key of a value (a ``Policy``, a table, a layer) as the policy would write it, its
    default where the file leaves it out; a stable shape: every declared key, in order."""
    out: dict[str, Any] = {}
    for k in keys_of(type(obj)):
        if k.fields:
            parts = [getattr(obj, f) for f in k.fields]
            names = _PARTS[k.name]
            out[k.name] = (
                None if parts[0] is None else dict(zip(names, map(_plain, parts), strict=True))
            )
        elif k.type == "table":
            value = getattr(obj, k.attr)
            out[k.name] = [effective(v) for v in value] if k.many else effective(value)
        else:
            value = getattr(obj, k.attr)
            out[k.name] = k.to_toml(value) if k.to_toml and value is not None else _plain(value)
    return out


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "reference"
    if what not in ("reference", "schema"):
        sys.stderr.write("usage: python -m hostd.policy.docs [reference|schema]\n")
        return 2
    sys.stdout.write(reference() if what == "reference" else schema_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Hypothesis: every mutant of the shipped policies either loads or is one PolicyError.

A mutant replaces one value anywhere in a shipped policy (a key of a layer, of a predicate,
of [agent] or [preempt]) with a hostile one: NaN, infinities, huge integers, deep lists, long,
non-ASCII or regex-breaking strings, tables where scalars belong. No other exception (a
RecursionError, an OverflowError, a TypeError) may come out of the validator.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostd.policy import PolicyError, parse_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {p.name: tomllib.loads(p.read_text()) for p in sorted((REPO / "policies").glob("*.toml"))}

HOSTILE_STRINGS = st.sampled_from(
    [
        "",
        "(a+)+$",
        "(" * 300,
        "a{4294967296}",
        "é" * 40,
        "x" * 5000,
        "/../../etc",
        "\x00",
        "nan",
        "50%",
        "200%",
        "-1",
        "[",
        "\\",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.5, 1e300, 0.5]),
    HOSTILE_STRINGS,
    st.text(max_size=30),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _replace(node: object, path: tuple, value: object) -> object:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in node.items()}
    return [(_replace(v, rest, value) if i == head else v) for i, v in enumerate(node)]  # type: ignore[union-attr]


def _toml(value: object) -> str:
    """A TOML rendering of ``value`` (inline tables and arrays; nan and inf as TOML has them)."""
    if value is None:
        return '"none"'  # TOML has no null: a string where none is expected
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 2**63 else f'"{value}"'
    if isinstance(value, str):
        return (
            '"'
            + "".join(
                c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in value
            )
            + '"'
        )
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"


def _document(data: dict) -> str:
    lines = []
    for key, value in data.items():
        if key == "layer" and isinstance(value, list) and all(isinstance(v, dict) for v in value):
            for layer in value:
                lines.append("[[layer]]")
                lines += [f"{_toml(str(k))} = {_toml(v)}" for k, v in layer.items()]
        elif isinstance(value, dict):
            lines.append(f"[{_toml(str(key))}]")
            lines += [f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()]
        else:
            lines.insert(0, f"{_toml(str(key))} = {_toml(value)}")
    return "\n".join(lines) + "\n"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutant_of_a_shipped_policy_loads_or_is_a_policy_error(data) -> None:
    name = data.draw(st.sampled_from(sorted(SHIPPED)))
    original = SHIPPED[name]
    path = data.draw(st.sampled_from(_paths(original)))
    mutant = _replace(original, path, data.draw(VALUES))
    text = _document(mutant)  # type: ignore[arg-type]
    source = f"<mutant of {name} at {path}>"
    try:
        parse_policy(text.encode(), source)
    except PolicyError as exc:
        lines = str(exc).split("\n")  # one line per error, each naming the source
        assert len(lines) == len(exc.errors) >= 1
        assert all(line.startswith(source) for line in lines), lines


def test_the_rendering_round_trips_so_mutants_reach_the_validator() -> None:
    for name, data in SHIPPED.items():
        assert parse_policy(_document(data).encode(), name).name == data["name"]

"""The policy's keys are declared once (hostd/policy/values.py, tables.py) and everything
else is made from them: the reference (docs/policy.md), the JSON Schema editors use
(docs/json/policy.schema.json), ``hostd policy show``'s values. These tests fail when a
generated file drifts from the declarations, when the schema and hostd disagree about a policy
(the shipped ones, the good corpus, the bad corpus wherever a JSON Schema can say the rule) and
when the effective values of a policy do not load back as the same policy.

Regenerate the files: ``python -m hostd.policy.docs reference > docs/policy.md`` and
``python -m hostd.policy.docs schema > docs/json/policy.schema.json``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from hostd.policy import Agent, Layer, Policy, Sched, load_policy
from hostd.policy.check import Checker
from hostd.policy.docs import (
    effective,
    json_schema,
    reference,
    schema_text,
    tables,
    toml_default,
)  # fmt: skip
from hostd.policy.docs import (
    main as docs_main,
)
from hostd.policy.schema import TYPES, keys_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "fixtures" / "policies" / "bad"
GOOD = REPO / "tests" / "fixtures" / "policies" / "good"
SHIPPED = [REPO / "hostd" / "policy" / "training.toml", *sorted((REPO / "policies").glob("*.toml"))]
CORPUS = sorted(p for p in BAD.glob("*.toml") if p.name != "expected.toml")
_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else shutil.which("hostd")

# Bad policies whose rule a JSON Schema cannot say: the schema accepts them, hostd does not.
NOT_EXPRESSIBLE = {
    # JSON has no NaN: a TOML nan passes every minimum and maximum
    "agent-interval-nan.toml": "NaN",
    "agent-rescan-nan.toml": "NaN",
    "preempt-busy-nan.toml": "NaN",
    "fraction-nan.toml": "NaN",
    "util-high-nan.toml": "NaN",
    # JSON numbers do not tell 1.0 from 1, nor 0.0 (a fraction: refused) from 0 (a count)
    "version-float.toml": "float as integer",
    "fraction-zero.toml": "float as integer",
    # a comm is 15 bytes of UTF-8; maxLength counts characters
    "comm-prefix-utf8-too-long.toml": "bytes, not characters",
    # regular expressions: whether they compile and run in bounded time (hostd.policy.regex)
    "regex-invalid.toml": "regex",
    "regex-invalid-cgroup.toml": "regex",
    "not-bad-inner.toml": "regex",
    "regex-catastrophic-alternation.toml": "regex",
    "regex-catastrophic-nested.toml": "regex",
    "regex-deep-groups.toml": "regex",
    "regex-nested-5000-groups.toml": "regex",
    "regex-repeat-huge.toml": "regex",
    "regex-repeat-overflow.toml": "regex",
    # rules between layers: which one comes last, names unique among them
    "catch-all-group-not-last.toml": "between layers",
    "catch-all-not-last.toml": "between layers",
    "last-not-catch-all.toml": "between layers",
    "single-layer-not-catch-all.toml": "between layers",
    "duplicate-layer-name.toml": "between layers",
    # one key's value bounded by another's
    "min-above-max.toml": "between keys",
    "min-above-max-fraction.toml": "between keys",
    "util-low-above-high.toml": "between keys",
    "util-low-equals-high.toml": "between keys",
    "preempt-release-before-interval.toml": "between keys",
    "sizing-shrink-before-interval.toml": "between keys",
}


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((REPO / "docs" / "json" / "policy.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# -- the generated files -----------------------------------------------------------------------
def test_the_reference_is_what_the_declarations_make() -> None:
    assert (REPO / "docs/policy.md").read_text() == reference(), (
        "docs/policy.md drifted: python -m hostd.policy.docs reference > docs/policy.md"
    )


def test_the_json_schema_is_what_the_declarations_make() -> None:
    assert (REPO / "docs" / "json" / "policy.schema.json").read_text() == schema_text(), (
        "docs/json/policy.schema.json drifted: "
        "python -m hostd.policy.docs schema > docs/json/policy.schema.json"
    )


def test_every_key_is_declared_whole_and_documented() -> None:
    text = reference()
    for header, cls, _doc in tables():
        assert keys_of(cls), header
        for k in keys_of(cls):
            assert k.type in TYPES and k.doc and k.since, (header, k)
            row = k.type != "table" or k.value is Sched  # a table has its own section
            assert (f"| `{k.name}` |" if row else f"[{k.name}]") in text, (header, k.name)
            if k.type in ("int", "number"):
                assert k.hi is not None and (k.lo is not None or k.lo_key), (header, k.name)
            if k.type == "choice":
                assert k.choices and (k.default is None or k.default in k.choices), k.name
            if k.type == "custom":
                assert k.parse and k.schema is not None, k.name
        assert set(json_schema()["$defs"].get(header.strip("[]"), {}).get("properties", {})) <= {
            k.name for k in keys_of(cls)
        }


# -- the schema and hostd agree ----------------------------------------------------------------
@pytest.mark.parametrize("path", [*SHIPPED, *sorted(GOOD.glob("*.toml"))], ids=lambda p: p.name)
def test_good_policies_are_valid_under_the_schema(path: Path, validator) -> None:
    load_policy(path)
    errors = [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_the_schema_refuses_what_hostd_refuses(path: Path, validator) -> None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return  # not TOML: the editor's parser refuses it before any schema
    valid = validator.is_valid(data)
    if path.name in NOT_EXPRESSIBLE:
        assert valid, f"{path.name} is refused by the schema now: take it off NOT_EXPRESSIBLE"
    else:
        assert not valid, f"{path.name}: hostd refuses it, the schema does not"


def test_not_expressible_names_corpus_files() -> None:
    assert set(NOT_EXPRESSIBLE) <= {p.name for p in CORPUS}


# -- every effective value ---------------------------------------------------------------------
def _as_file(values: dict, cls: type = Policy) -> dict:
    """Effective values as a policy file writes them: a key at its default left out (an open
    layer's CPUs are all of the pool's, but it may not say so)."""
    out = {}
    for k in keys_of(cls):
        value = values[k.name]
        if k.type == "table" and k.many:
            out[k.name] = [_as_file(v, k.value) for v in value]
        elif k.type == "table":
            out[k.name] = _as_file(value, k.value)
        elif value is not None and (k.required or value != toml_default(cls, k)):
            out[k.name] = value
    return out


@pytest.mark.parametrize("path", [*SHIPPED, *sorted(GOOD.glob("*.toml"))], ids=lambda p: p.name)
def test_effective_values_are_a_policy_that_loads_back_the_same(path: Path, validator) -> None:
    policy = load_policy(path)
    values = effective(policy)
    assert list(values) == [k.name for k in keys_of(Policy)]
    assert all(list(ly) == [k.name for k in keys_of(Layer)] for ly in values["layer"])
    again = _as_file(values)
    assert [e.message for e in validator.iter_errors(again)] == []
    back = Checker(str(path)).policy(again, path.read_bytes())  # type: ignore[arg-type]
    assert back.layers == policy.layers and back.agent == policy.agent
    assert effective(back) == values


def test_agent_values_are_a_table_and_the_flat_names_stay() -> None:
    policy = load_policy(GOOD / "minimal.toml")
    assert policy.agent == Agent()
    assert (policy.mode, policy.interval, policy.event_source, policy.agent_nice) == (
        "enforce", 5.0, "auto", -10,
    )  # fmt: skip
    assert (policy.jobs_protect, policy.jobs_record, policy.cgroups_write) == (True, True, ())


needs_cli = pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed")


def _hostd(*args: str) -> str:
    assert HOSTD is not None
    done = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_the_generator_prints_the_files(capsys) -> None:
    assert docs_main(["reference"]) == 0 and capsys.readouterr().out == reference()
    assert docs_main(["schema"]) == 0 and capsys.readouterr().out == schema_text()
    assert docs_main(["other"]) == 2


@needs_cli
def test_policy_show_prints_every_value(validator) -> None:
    path = REPO / "policies" / "inference.toml"
    doc = json.loads(_hostd("policy", "show", "--policy", str(path), "--json"))
    assert list(doc) == ["schema", "source", "sha256", "warnings", "policy"]
    assert doc["policy"] == effective(load_policy(path))
    assert validator.is_valid(_as_file(doc["policy"]))
    text = _hostd("policy", "show", "--policy", str(path))
    for k in keys_of(Policy):
        if k.type == "table" and not k.many:
            for sub in keys_of(k.value):
                assert f"[{k.name}] {sub.name} = " in text, (k.name, sub.name)
    assert "    growth = " in text and "[preempt] cap_cpus = 0.02 CPUs" in text
    default = json.loads(_hostd("policy", "show", "--json"))
    assert default["source"] == "<embedded training.toml>"

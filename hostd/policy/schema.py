"""The policy's keys as data: each key of each table is declared once, as the field of its
frozen value that holds it (``hostd.policy.values``, ``hostd.policy.tables``), with
``key(...)``: its TOML name, type, range or choices, default (the field's default), unit, a
one-line doc and the version it came in. From those declarations the checker validates
(``hostd.policy.check``), the values are built by keyword, ``hostd policy show`` prints every
effective value and the reference (``docs/policy.md``) and the JSON Schema
(``docs/json/policy.schema.json``) are generated (``hostd.policy.docs``).

Pure; imports nothing of hostd but the model's word lists. Adding a key: DESIGN.md, "Adding a
policy key".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hostd.model.jobs import ROLES
from hostd.model.node import KINDS as NODE_KINDS
from hostd.model.node import QOS
from hostd.model.tasks import ACTIVITIES

# -- the words some keys take ------------------------------------------------------------------
KINDS = ("confined", "grouped", "open")
SOURCES = ("auto", "events", "poll")
SCHED_POLICIES = ("other", "batch", "idle", "fifo", "rr")
RT_POLICIES = ("fifo", "rr")
NUMA_MODES = ("none", "gpu-local")
NUMA_MIGRATE = ("move_pages", "migrate_pages")
IRQ_MODES = ("allow", "avoid")
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
EPP_VALUES = ("default", "performance", "balance_performance", "balance_power", "power")
MODES = ("enforce", "observe")
# How a self-sizing layer's CPUs grow and shrink (hostd.plan.sizing): keep its CPUs and grow
# from its own LLC, then node ("sticky"); fill whole LLCs ("llc"); spread over NUMA nodes ("node").
GROWTH_ORDERS = ("sticky", "llc", "node")
WEIGH_JOB = ("always", "while-needed")  # [preempt] weigh_job
NODE_KIND_WORDS = tuple(NODE_KINDS)
# Node kinds whose cgroups [cgroups] write may name (the kernel's and the root's are nobody's).
WRITABLE_KINDS = tuple(k for k in NODE_KINDS if k not in ("kernel", "root"))
# A predicate's ``rule`` that admits only some words: (what they are, the words).
RULE_CHOICES = {
    "role": ("a job role", ROLES),
    "activity": ("an activity", tuple(ACTIVITIES)),
    "node": ("a node kind", NODE_KIND_WORDS),
    "qos": ("a pod QoS class", QOS),
}

# The types a key may have; "custom" keys are parsed by a checker method named by ``parse``.
TYPES = ("bool", "int", "number", "string", "text", "choice", "words", "ids", "table", "custom")
_META = "hostd.policy"


@dataclass(frozen=True)
class Key:
    """One key of a policy table. ``attr`` and ``default`` come from the field it is declared
    on (``keys_of``); the rest from ``key(...)``."""

    type: str
    doc: str
    toml: str = ""  # the key's name in the file ("" : the field's name)
    lo: float | None = None  # int and number: the range, inclusive
    hi: float | None = None
    lo_key: str = ""  # number: the lower bound is this key of the table (times lo_factor)
    lo_factor: float = 1.0
    what: str = ""  # number: what it is, in errors ("seconds between passes")
    unit: str = ""  # shown after the value by ``policy show`` ("s", "CPUs")
    choices: tuple[str, ...] = ()  # choice, words: the words allowed
    choices_what: str = ""  # words: what one word is ("a node kind")
    keep: bool = False  # int: "keep" is allowed too (the value None)
    required: bool = False
    parse: str = ""  # custom: the checker method that parses it
    fields: tuple[str, ...] = ()  # custom: the fields it sets (default: its own)
    value: Any = None  # table: the frozen value class of a nested table; table list: per item
    many: bool = False  # table: an array of tables ([[layer]])
    shown_type: str = ""  # its type in the reference where the type's name does not say it
    shown_default: str = ""  # the default in the reference where the value's is not TOML
    schema: dict | None = None  # custom: its JSON Schema (the generic ones are derived)
    to_toml: Any = None  # custom: its value as a policy writes it, where that differs
    since: str = "0.1"
    attr: str = ""
    default: Any = None

    @property
    def name(self) -> str:
        return self.toml or self.attr


def key(default: Any = None, *, factory: Any = None, **declared: Any) -> Any:
    """A field of a frozen value that is a policy key: ``default`` (or ``factory``) is what a
    policy without it gets, the rest declares it (``Key``)."""
    meta = {_META: Key(**declared)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def part_of(name: str) -> Any:
    """A field set by another key (``cpus`` sets ``cpus_min`` and ``cpus_max``), no key itself."""
    return {"hostd.policy.part_of": name}


def keys_of(cls: type) -> tuple[Key, ...]:
    """The keys a value class declares, in declaration order, with ``attr`` and ``default``."""
    cached = _KEYS.get(cls)
    if cached is not None:
        return cached
    out = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_META)
        if declared is None:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append(dataclasses.replace(declared, attr=f.name, default=default))
    _KEYS[cls] = result = tuple(out)
    return result


_KEYS: dict[type, tuple[Key, ...]] = {}


def allowed(cls: type) -> tuple[str, ...]:
    """The TOML names of a table's keys, in declaration order (for errors and docs)."""
    return tuple(k.name for k in keys_of(cls))


def toml_value(value: Any) -> Any:
    """A default as a policy would write it (tuples as lists; None stays None)."""
    if isinstance(value, tuple):
        return [toml_value(v) for v in value]
    as_toml = getattr(value, "toml", None)  # a CpuAmount
    return as_toml() if as_toml is not None else value

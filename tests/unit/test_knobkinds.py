"""The registry of knob kinds: every kind, its key shape and its order, read from the specs alone.

Adding a kind changes ``EXPECTED`` below on purpose: the table is the one place a reviewer sees
where a new kind is applied and restored among the others.
"""

from __future__ import annotations

import pytest

from hostd import knobkinds, knobs
from hostd.knobkinds import BY_KIND, KINDS, kinds, needing
from hostd.reconcile import _restore_order

# kind: (key shape, apply order, restore phase, flags)
EXPECTED = {
    "subtree": ("cgroup/subtree/PATH", -1, 3, ""),
    "cgroup": ("cgroup/cpuset/PATH", 0, 2, ""),
    "cpuset": ("task/TID@START/cpuset", 1, 0, "task"),
    "affinity": ("task/TID@START/affinity", 2, 1, "task inherit"),
    "sched": ("task/TID@START/sched", 3, 1, "task inherit"),
    "nice": ("task/TID@START/nice", 4, 1, "task inherit"),
    "autogroup": ("task/PID@START/autogroup", 4, 1, "task"),
    "irq": ("irq/N/smp_affinity_list", 5, 1, "host"),
    "scaling_governor": ("cpu/N/scaling_governor", 6, 1, "host"),
    "scaling_min_freq": ("cpu/N/scaling_min_freq", 7, 1, "host"),
    "energy_performance_preference": ("cpu/N/energy_performance_preference", 8, 1, "host"),
    "numa": ("task/PID@START/numa", 9, 1, "task"),
    "preempted": ("session/SID@SINCE/preempted", 99, -1, "agent"),
    "group_cpu": ("cgroup/cpu/PATH", 99, 1, "agent"),
    "group_max": ("cgroup/cpumax/PATH", 99, 1, "agent"),
    "demoted_home": ("cgroup/cpuhome/PATH", 99, 2, "agent host"),
}


def _flags(spec: knobs.Spec) -> str:
    named = (
        ("task", spec.per_task),
        ("inherit", spec.inheritable),
        ("agent", spec.agent_owned),
        ("host", spec.host_wide),
    )
    return " ".join(name for name, on in named if on)


def test_the_registry_lists_every_kind_with_its_key_and_order():
    listed = {s.kind: (s.shape, s.apply_order, s.restore_phase, _flags(s)) for s in KINDS}
    assert listed == EXPECTED
    assert all(s.noun for s in KINDS)  # `hostd doctor` names what it leaves out by it


_EXAMPLE_PATH = {"cgroup": "hostd/trainer", "demoted_home": "hostd.demoted"}


def _example(spec: knobs.Spec) -> str:
    """A real key of the spec's shape."""
    return (
        spec.shape.replace("TID@START", "4242@81234")
        .replace("PID@START", "4242@81234")
        .replace("SID@SINCE", "4242@81234")
        .replace("/N/", "/3/")
        .replace("PATH", _EXAMPLE_PATH.get(spec.kind, "user.slice/x.scope"))
    )


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.kind)
def test_each_kinds_key_finds_its_spec_and_passes_the_journals_key_check(spec):
    key = _example(spec)
    assert knobkinds.spec_of(key) is spec
    assert knobkinds.kind_of(key) == spec.kind
    assert knobkinds.check_key(key) is None


def test_restore_goes_by_phase_then_reverse_journal_order():
    journal_order = [_example(BY_KIND[kind]) for kind in EXPECTED]  # written in apply order
    journal_order.append("task/7@1/nice")  # a later record of the same phase as the first nice
    restored = [knobkinds.kind_of(key) for key in _restore_order(journal_order)]
    assert restored == [
        "preempted",
        "cpuset",
        "nice",  # task/7@1/nice, journaled last, restored first within its phase
        "group_max",
        "group_cpu",
        "numa",
        "energy_performance_preference",
        "scaling_min_freq",
        "scaling_governor",
        "irq",
        "autogroup",
        "nice",
        "sched",
        "affinity",
        "demoted_home",  # phase 2, journaled after the cpuset cgroup: emptied and removed first
        "cgroup",
        "subtree",
    ]


def test_the_gates_read_the_specs():
    assert kinds(agent_owned=True) == {"preempted", "group_cpu", "group_max", "demoted_home"}
    assert kinds(host_wide=True) == {
        "demoted_home",
        "irq",
        "scaling_governor",
        "scaling_min_freq",
        "energy_performance_preference",
    }
    assert needing({"sched"}) == {"sched", "nice", "autogroup"}
    assert needing({"cpuset"}) == {"cgroup", "cpuset", "subtree"}


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("task/1@2/bogus", "no knob kind 'bogus'"),
        ("task/x@2/nice", "is not a knob key"),
        ("task/1@2/x/nice", "is not a knob key"),
        ("irq/42/other", "no knob kind 'other'"),
        ("cgroup/cpu/", "never weighs the root cgroup"),
        ("cgroup/cpuset/user.slice", "not a cgroup hostd creates"),
        ("cgroup/cpu/a/../b", "not a plain cgroup path"),
        ("nothing/1/nice", "is not a knob key"),
    ],
)
def test_malformed_keys_are_named(key, problem):
    assert problem in (knobkinds.check_key(key) or "")


def test_a_key_no_kind_handles_is_an_einval_host_error():
    from hostd.host import HostError

    with pytest.raises(HostError, match="no knob kind handles this key"):
        knobkinds.spec_of("nothing/1/nice")


@pytest.mark.parametrize(
    "key",
    ["task/4242@81234/nice", "task/7@0/affinity", "session/12@345/preempted", "task/9@1/numa"],
)
def test_a_task_or_session_key_gives_its_ids_as_the_parsed_key_does(key):
    assert knobs.parse_task_key(key) == knobs.parse_key(key).task


@pytest.mark.parametrize("key", ["irq/5/smp_affinity_list", "cgroup/cpu/a/b", "task/nice"])
def test_a_key_of_no_task_gives_no_ids(key):
    with pytest.raises(KeyError):
        knobs.parse_task_key(key)


@pytest.mark.parametrize("kind", sorted(knobkinds.TASK_SPECS))
def test_a_key_task_key_made_says_what_a_key_read_back_says(kind):
    """``knobs.task_key`` keeps what it made (``knobs.MADE``): the event path's looks at a new
    key skip parsing it. They must agree with a key read back from the journal (parsed)."""
    made = knobs.task_key(4242, 81234, kind)
    assert made in knobs.MADE
    said = knobs.parse_task_key(made), knobkinds.spec_of(made)
    del knobs.MADE[made]  # now as a key read back from the journal: parsed
    assert said == (knobs.parse_task_key(made), knobkinds.spec_of(made))
    assert said == ((4242, 81234), knobkinds.BY_KIND[kind])

"""Valid policies (tests/fixtures/policies/good/ and the shipped default) load into the values
they describe; the real-time warning, the policy hash and the embedded default behave."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hostd.policy import (
    PREDICATES,
    CpuAmount,
    Guard,
    Layer,
    Policy,
    Predicate,
    Preempt,
    Sched,
    load_default,
    load_policy,
    parse_policy,
)

REPO = Path(__file__).resolve().parents[2]
GOOD = REPO / "tests" / "fixtures" / "policies" / "good"
SHIPPED = REPO / "policies" / "training.toml"


def _good(name: str) -> Policy:
    return load_policy(GOOD / name)


def _groups(layer: Layer) -> list[list[Predicate]]:
    return [list(group) for group in layer.match]


@pytest.mark.parametrize("path", sorted(GOOD.glob("*.toml")), ids=lambda p: p.stem)
def test_good_policies_load_without_warnings(path: Path) -> None:
    policy = load_policy(path)
    assert policy.version == 1
    assert policy.source == str(path)
    assert policy.warnings == ()
    assert policy.layers[-1].catch_all
    assert not any(layer.catch_all for layer in policy.layers[:-1])
    assert len({layer.name for layer in policy.layers}) == len(policy.layers)


def test_good_corpus_has_three_or_more_files() -> None:
    assert len(list(GOOD.glob("*.toml"))) >= 3


# -- predicates -----------------------------------------------------------------------------
def test_every_predicate_kind_is_used() -> None:
    policy = _good("every-predicate.toml")
    assert policy.predicates_used == frozenset(PREDICATES)
    assert policy.needs_fds  # it uses `gpu`
    assert policy.mode == "observe"
    assert policy.name == "every-predicate"
    assert policy.description == "A test policy that uses each predicate at least once."


def test_string_predicates_become_tuples() -> None:
    layer = _good("every-predicate.toml").layer("strings")
    assert layer.kind == "grouped"
    assert _groups(layer) == [
        [Predicate("comm_prefix", ("pt_nccl",)), Predicate("pcomm_prefix", ("python3", "python"))],
        [Predicate("parent_comm_prefix", ("pt_elastic",))],
        [
            Predicate("cgroup_prefix", ("/training.slice/",)),
            Predicate("cgroup_suffix", (".scope", ".service")),
        ],
        [Predicate("cgroup_contains", ("job-", "rank"))],
        [Predicate("exe", ("/usr/bin/python3", "/opt/conda/bin/python"))],
    ]


def test_regex_predicates_stay_strings() -> None:
    layer = _good("every-predicate.toml").layer("regexes")
    assert _groups(layer) == [
        [Predicate("comm_regex", "^pt_autograd_[0-9]+$")],
        [Predicate("cgroup_regex", "/job-[0-9]+/")],
        [Predicate("cmdline_regex", "torch/_inductor/compile_worker")],
    ]
    assert layer.kind == "open"  # the default


def test_id_and_nice_predicates() -> None:
    layer = _good("every-predicate.toml").layer("ids")
    assert _groups(layer) == [
        [Predicate("uid", (0,)), Predicate("gid", (0, 27))],
        [Predicate("uid", (1000, 1001)), Predicate("nice_above", 5)],
        [Predicate("nice_below", -5)],
    ]


def test_bool_predicates_and_not() -> None:
    layer = _good("every-predicate.toml").layer("flags")
    assert _groups(layer) == [
        [Predicate("is_group_leader", True), Predicate("gpu", True)],
        [Predicate("session_leader", True), Predicate("uid", (0,))],
        [
            Predicate("job", True),
            Predicate("job_role", ("rank", "data")),
            Predicate("job_gpu", True),
        ],
        [Predicate("activity", ("polls", "feeds")), Predicate("job_role", ("rank",))],
        [
            Predicate("is_kthread", True),
            Predicate("comm_prefix", ("kworker", "ksoftirqd"), negate=True),
        ],
        [Predicate("nvml_gpu_process", True), Predicate("uid", (0,), negate=True)],
        [
            Predicate("is_group_leader", False),
            Predicate("cmdline_regex", "--no-protect", negate=True),
            Predicate("gpu", False, negate=True),
        ],
    ]


@pytest.mark.parametrize(
    ("predicate", "text"),
    [
        (Predicate("comm_prefix", ("pt_nccl",)), "comm_prefix = 'pt_nccl'"),
        (Predicate("comm_prefix", ("a", "b")), "comm_prefix = ['a', 'b']"),
        (Predicate("uid", (0,), negate=True), "not (uid = 0)"),
        (Predicate("gpu", True), "gpu = true"),
        (Predicate("is_kthread", False, negate=True), "not (is_kthread = false)"),
        (Predicate("nice_above", 5), "nice_above = 5"),
        (Predicate("comm_regex", "^x$"), "comm_regex = '^x$'"),
    ],
)
def test_predicate_describe(predicate: Predicate, text: str) -> None:
    assert predicate.describe() == text


# -- CPU amounts ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layer", "kind", "cpus_min", "cpus_max", "resolved_on_16"),
    [
        ("counts", "confined", CpuAmount(count=2), CpuAmount(count=4), (2, 4)),
        ("fractions", "grouped", CpuAmount(fraction=0.25), CpuAmount(fraction=0.5), (4, 8)),
        ("percentages", "grouped", CpuAmount(fraction=0.1), CpuAmount(fraction=0.125), (1, 2)),
        ("mixed", "confined", CpuAmount(count=1), CpuAmount(fraction=1.0), (1, 16)),
        ("only-min", "grouped", CpuAmount(count=3), CpuAmount(fraction=1.0), (3, 16)),
        ("no-cpus", "grouped", CpuAmount(count=0), CpuAmount(fraction=1.0), (0, 16)),
        ("rest", "open", CpuAmount(count=0), CpuAmount(fraction=1.0), (0, 16)),
    ],
)
def test_cpu_amounts(
    layer: str,
    kind: str,
    cpus_min: CpuAmount,
    cpus_max: CpuAmount,
    resolved_on_16: tuple[int, int],
) -> None:
    got = _good("cpu-amounts.toml").layer(layer)
    assert got.kind == kind
    assert got.cpus_min == cpus_min
    assert got.cpus_max == cpus_max
    assert (got.cpus_min.resolve(16), got.cpus_max.resolve(16)) == resolved_on_16


def test_cpu_amount_describe() -> None:
    policy = _good("cpu-amounts.toml")
    assert policy.layer("percentages").cpus_max.describe() == "12.5%"
    assert policy.layer("fractions").cpus_min.describe() == "25%"
    assert policy.layer("counts").cpus_max.describe() == "4"


# -- sched and the per-layer knobs ----------------------------------------------------------
@pytest.mark.parametrize(
    ("layer", "sched"),
    [
        ("rt-fifo", Sched("fifo", 50, None, True)),
        ("rt-rr", Sched("rr", 1, None, False)),
        ("batch", Sched("batch", None, 10, True)),
        ("idle", Sched("idle", None, None, True)),
        ("other", Sched("other", None, -5, True)),
        ("nice-only", Sched(None, None, 3, True)),
        ("rest", Sched()),
    ],
)
def test_every_sched_policy(layer: str, sched: Sched) -> None:
    assert _good("sched-all.toml").layer(layer).sched == sched


def test_every_sched_policy_is_covered() -> None:
    used = {layer.sched.policy for layer in _good("sched-all.toml").layers}
    assert used == {"fifo", "rr", "batch", "idle", "other", None}


def test_layer_knobs() -> None:
    policy = _good("sched-all.toml")
    fifo = policy.layer("rt-fifo")
    assert (fifo.numa, fifo.governor, fifo.min_freq, fifo.epp, fifo.irqs) == (
        "gpu-local",
        "performance",
        "max",
        "performance",
        "avoid",
    )
    assert fifo.latency and fifo.sched.realtime
    rr = policy.layer("rt-rr")
    assert (rr.numa, rr.governor, rr.min_freq, rr.epp, rr.irqs) == (
        "none",
        "schedutil",
        "80%",
        "balance_performance",
        "allow",
    )
    assert rr.latency  # real-time, though its IRQs are allowed
    batch = policy.layer("batch")
    assert batch.min_freq == "2400000"  # kHz, kept as digits
    assert not batch.latency
    assert policy.mode == "enforce"
    assert policy.needs_fds


def test_minimal_policy_defaults() -> None:
    policy = _good("minimal.toml")
    assert policy.name == "minimal"  # the file's stem
    assert policy.description == ""
    assert policy.mode == "enforce"
    assert policy.predicates_used == frozenset()
    assert not policy.needs_fds
    (rest,) = policy.layers
    assert rest == Layer("rest", "everything", ((),))
    assert rest.catch_all and not rest.latency
    assert policy.layer("rest") is rest
    with pytest.raises(KeyError):
        policy.layer("absent")


# -- the real-time warning ------------------------------------------------------------------
def _rt_policy(groups: str, sched: str = '{ policy = "fifo", priority = 10 }') -> Policy:
    text = (
        f'version = 1\n[[layer]]\nname = "fast"\ncomment = "c"\nmatch = {groups}\n'
        f'sched = {sched}\n\n[[layer]]\nname = "rest"\ncomment = "c"\nmatch = [[]]\n'
    )
    return parse_policy(text.encode(), "<rt>")


@pytest.mark.parametrize(
    "groups",
    [
        '[[{ comm_prefix = "pt_nccl" }]]',
        '[[{ comm_regex = "^pt_" }]]',
        '[[{ comm_prefix = "pt_nccl" }, { parent_comm_prefix = "pt_elastic" }]]',
        '[[{ pcomm_prefix = "python3" }, { is_group_leader = true }]]',
        '[[{ cmdline_regex = "train.py" }]]',
        "[[{ nice_below = 0 }]]",
        '[[{ comm_prefix = "pt_nccl" }, { not = { uid = 1000 } }]]',
        '[[{ comm_prefix = "pt_nccl" }, { not = { gpu = false } }]]',
    ],
    ids=[
        "comm",
        "comm-regex",
        "comm-and-parent",
        "pcomm-and-leader",
        "cmdline",
        "nice",
        "not-uid",
        "not-gpu",
    ],
)
def test_rt_layer_on_user_controlled_values_warns(groups: str) -> None:
    policy = _rt_policy(groups)
    (warning,) = policy.warnings
    assert "\n" not in warning
    assert warning.startswith("<rt>: layer[0].match[0]: layer 'fast' is real-time (fifo)")
    assert "add a uid, cgroup or gpu condition" in warning


@pytest.mark.parametrize(
    "groups",
    [
        '[[{ comm_prefix = "pt_nccl" }, { uid = 0 }]]',
        '[[{ comm_prefix = "pt_nccl" }, { gid = [0, 27] }]]',
        '[[{ comm_prefix = "pt_nccl" }, { cgroup_prefix = "/training.slice/" }]]',
        '[[{ comm_prefix = "pt_nccl" }, { gpu = true }]]',
        '[[{ comm_prefix = "pt_nccl" }, { nvml_gpu_process = true }]]',
        "[[{ is_kthread = true }]]",
        "[[{ uid = 0 }]]",
    ],
    ids=["uid", "gid", "cgroup", "gpu", "nvml", "kthread", "uid-only"],
)
def test_rt_layer_with_a_gate_does_not_warn(groups: str) -> None:
    assert _rt_policy(groups).warnings == ()


def test_rt_warning_names_the_ungated_group_only() -> None:
    policy = _rt_policy(
        '[[{ comm_prefix = "pt_nccl" }, { uid = 0 }], [{ comm_prefix = "NCCL" }],'
        ' [{ comm_prefix = "pt_gloo" }, { gpu = true }]]',
        '{ policy = "rr", priority = 5 }',
    )
    (warning,) = policy.warnings
    assert warning.startswith("<rt>: layer[0].match[1]: layer 'fast' is real-time (rr)")


@pytest.mark.parametrize(
    "sched", ['{ policy = "batch" }', '{ policy = "idle" }', '{ policy = "other", nice = 5 }']
)
def test_a_layer_that_elevates_nothing_does_not_warn(sched: str) -> None:
    assert _rt_policy('[[{ comm_prefix = "pt_nccl" }]]', sched).warnings == ()


@pytest.mark.parametrize(
    ("sched", "words"),
    [
        ('{ policy = "other", nice = -10 }', "gives nice -10"),
        ("{ group_nice = -5 }", "gives its sessions nice -5"),
    ],
)
def test_any_elevation_behind_a_name_only_warns(sched: str, words: str) -> None:
    """Issue 15: any user got nice -5 by naming a thread pt_elastic*."""
    (warning,) = _rt_policy('[[{ comm_prefix = "pt_elastic" }]]', sched).warnings
    assert f"layer 'fast' {words} but this group tests only what any user controls" in warning


@pytest.mark.parametrize("flag", ["gpu", "nvml_gpu_process", "is_kthread"])
def test_rt_layer_gated_on_a_false_flag_warns(flag: str) -> None:
    policy = _rt_policy(f'[[{{ comm_prefix = "pt_nccl" }}, {{ {flag} = false }}]]')
    assert len(policy.warnings) == 1


def test_default_policy_has_no_warnings() -> None:
    assert load_default().warnings == ()


# -- the hash ---------------------------------------------------------------------------------
def test_hash_is_sha256_of_the_bytes() -> None:
    path = GOOD / "minimal.toml"
    assert load_policy(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_hash_changes_when_the_bytes_change(tmp_path: Path) -> None:
    raw = (GOOD / "minimal.toml").read_bytes()
    first = tmp_path / "a.toml"
    first.write_bytes(raw)
    second = tmp_path / "b.toml"
    second.write_bytes(raw + b"# only a comment differs\n")
    a, b = load_policy(first), load_policy(second)
    assert a.layers == b.layers
    assert a.sha256 != b.sha256
    assert load_policy(first).sha256 == a.sha256  # and it is stable
    assert parse_policy(raw, "elsewhere").sha256 == a.sha256  # the source is not hashed


# -- the embedded default ---------------------------------------------------------------------
def test_load_default_equals_the_shipped_file() -> None:
    embedded, shipped = load_default(), load_policy(SHIPPED)
    assert embedded.layers == shipped.layers
    assert (embedded.version, embedded.name, embedded.mode, embedded.description) == (
        shipped.version,
        shipped.name,
        shipped.mode,
        shipped.description,
    )
    assert embedded.source == "<embedded training.toml>"


def test_default_policy_bytes_are_the_shipped_bytes() -> None:
    """load_default's docstring: "the same file as policies/training.toml"."""
    assert load_default().sha256 == load_policy(SHIPPED).sha256


def test_default_policy_layers() -> None:
    policy = load_default()
    assert [layer.name for layer in policy.layers] == [
        "comms",
        "data",
        "helpers",
        "trainer",
        "compile",
        "gpu-services",
        "system",
        "rest",
    ]
    assert policy.layer("system").sched == Sched(group_nice=0)
    services = policy.layer("gpu-services")  # issue 17: no protection, never demoted
    assert (services.sched, services.preempt, services.preemptible) == (Sched(), False, False)
    # BENCHMARKS.md: comms as FIFO 20 and at nice -5 slowed the job; they weigh as their rank
    assert policy.layer("comms").sched == Sched()
    assert not any(ly.sched.realtime for ly in policy.layers)
    assert policy.layer("trainer").numa == "gpu-local"
    assert policy.layer("data").kind == "open"
    assert policy.layer("trainer").sched == Sched(group_nice=-5)
    assert policy.needs_fds
    # preemption: the job's layers preempt, compilers and the rest yield while it runs
    assert policy.protected == {"comms", "data", "trainer"}
    assert policy.preemptible == {"compile", "rest"}
    assert policy.preempt == Preempt(weigh_job="while-needed") and policy.guard == Guard()
    # a busy competing container's or workload pod's cgroup yields (the node's own pods, its
    # agents among them, are never demoted); no cpuset is made inside a job's
    assert policy.cgroups_weigh == ("container", "pod") and policy.cgroups_write == ()


@pytest.mark.parametrize(
    "gate",
    [
        '{ exe = "/usr/bin/python3" }',
        '{ cgroup_suffix = ".scope" }',
        '{ cgroup_contains = "training" }',
    ],
    ids=["exe", "cgroup-suffix", "cgroup-contains"],
)
def test_rt_layer_gated_on_what_users_choose_warns(gate: str) -> None:
    policy = _rt_policy(f'[[{{ comm_prefix = "pt_nccl" }}, {gate}]]')
    assert len(policy.warnings) == 1


@pytest.mark.parametrize("path", sorted((REPO / "policies").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_policies_elevate_nothing_behind_a_name_alone(path: Path) -> None:
    """Issue 15: no real-time, negative nice, session nice or preempt that any user could
    claim by renaming a thread."""
    assert load_policy(path).warnings == ()


def test_the_jobs_table() -> None:
    from hostd.policy import PolicyError, parse_policy

    base = 'version = 1\n[[layer]]\nname = "rest"\ncomment = "c"\nmatch = [[]]\n'
    assert parse_policy(base.encode(), "a.toml").jobs_protect is True
    off = parse_policy((base + "[jobs]\nprotect = false\n").encode(), "b.toml")
    assert off.jobs_protect is False
    try:
        parse_policy((base + '[jobs]\nprotect = "maybe"\n').encode(), "c.toml")
    except PolicyError as exc:
        assert str(exc) == "c.toml:7:1: jobs.protect: 'maybe': expected true or false"
    else:
        raise AssertionError("accepted")

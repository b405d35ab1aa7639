"""Pure parsers of /proc and /sys text, and the cpulist/mask formats."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostd.host.parsers import (
    parse_cgroup,
    parse_interrupts,
    parse_mountinfo_cgroups,
    parse_nvidia_minor,
    parse_preemption,
    parse_stat,
    parse_status,
    primary_cgroup,
)
from hostd.model.cpus import CpuListError, format_cpulist, format_mask, parse_cpulist, parse_mask

TAIL = (
    "S 1948 1948 990 0 -1 4194304 97 0 0 0 11 7 0 0 20 -5 3 0 11263 3133440 393 "
    "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 50 1 0 0 0 0 0 0 0 0 0 0 0"
)


@pytest.mark.parametrize(
    "comm", ["cat", "a b", "x) (y", "((", ")", "NCCL Progress 3", "kworker/0:1-events", ""]
)
def test_stat_comm_with_spaces_and_parentheses(comm):
    stat = parse_stat(f"1951 ({comm}) {TAIL}\n")
    assert stat.comm == comm
    assert stat.state == "S" and stat.ppid == 1948
    assert stat.utime == 11 and stat.stime == 7
    assert stat.nice == -5 and stat.num_threads == 3
    assert stat.start_time == 11263
    assert stat.processor == 1 and stat.rt_priority == 50 and stat.policy == 1
    assert not stat.is_kthread


def test_stat_kthread_flag():
    tail = TAIL.replace(" 4194304 ", f" {0x00208040} ")
    assert parse_stat(f"2 (kthreadd) {tail}").is_kthread


def test_status_fields():
    text = (
        "Name:\tpython3\nTgid:\t42\nPid:\t43\nUid:\t1000\t1001\t1001\t1001\n"
        "Gid:\t50\t51\t51\t51\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1,4\n"
        "voluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t9\n"
    )
    st_ = parse_status(text)
    assert (st_.tgid, st_.uid, st_.gid) == (42, 1001, 51)
    assert st_.cpus_allowed == frozenset({0, 1, 4})
    assert (st_.voluntary_ctxt_switches, st_.nonvoluntary_ctxt_switches) == (7, 9)


@pytest.mark.parametrize(
    ("uids", "uid"),
    [
        ("0\t0\t0\t0", 0),  # root's
        ("1000\t1000\t1000\t1000", 1000),
        ("1000\t0\t0\t0", 1000),  # a set-uid-root program a user ran (su, passwd): the user's
        ("0\t1000\t1000\t1000", 1000),  # root that took a user's identity: the user's
    ],
)
def test_status_uid_is_never_root_for_a_set_uid_program(uids: str, uid: int):
    """A uid-0 gate protects root's processes: `RANK=0 ... su` started by a user holds euid 0
    but is the user's (its real uid), and so are its session and its threads."""
    st_ = parse_status(f"Tgid:\t5\nUid:\t{uids}\nGid:\t{uids}\n")
    assert (st_.uid, st_.gid) == (uid, uid)


@pytest.mark.parametrize(
    ("text", "primary"),
    [
        ("0::/system.slice/train.service\n", "/system.slice/train.service"),  # pure v2
        (  # hybrid, systemd in both trees
            "9:name=systemd:/user.slice/a\n3:cpuset:/\n0::/user.slice/a\n",
            "/user.slice/a",
        ),
        (  # hybrid like the CI machine: v2 root, memory cgroup elsewhere
            "9:name=systemd:/\n4:memory:/process_api/x\n3:cpuset:/\n1:cpu:/\n0::/\n",
            "/process_api/x",
        ),
        ("4:cpu,cpuacct:/kubepods/pod1/c1\n3:cpuset:/kubepods/pod1/c1\n", "/kubepods/pod1/c1"),
        ("", "/"),
    ],
)
def test_cgroup_layouts(text, primary):
    assert primary_cgroup(parse_cgroup(text)) == primary


def test_cgroup_v1_comma_controllers_are_split():
    parsed = parse_cgroup("4:cpu,cpuacct:/a\n")
    assert parsed == {"cpu": "/a", "cpuacct": "/a"}


def test_mountinfo_hybrid_and_v2():
    hybrid = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    mounts = parse_mountinfo_cgroups(hybrid)
    assert [(m.mount_point, m.version) for m in mounts] == [
        ("/sys/fs/cgroup/cpuset", 1),
        ("/sys/fs/cgroup/cpu,cpuacct", 1),
        ("/sys/fs/cgroup/systemd", 1),
        ("/sys/fs/cgroup/unified", 2),
    ]
    assert mounts[0].controllers == ("cpuset",)
    assert mounts[1].controllers == ("cpu", "cpuacct")
    assert mounts[2].controllers == ("name=systemd",)
    v2 = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
    assert [(m.mount_point, m.version) for m in parse_mountinfo_cgroups(v2)] == [
        ("/sys/fs/cgroup", 2)
    ]


def test_interrupts():
    text = (
        "           CPU0       CPU1       \n"
        " 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n"
        " 36:          0       6682 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n"
        " 50:          3          4  IR-PCI-MSIX-0000:29:00.0 0-edge mlx5_comp0@pci:0000:29:00.0\n"
        "NMI:          0          0   Non-maskable interrupts\n"
        "LOC:       6580       6836   Local timer interrupts\n"
        "ERR:          0\n"
    )
    lines = parse_interrupts(text)
    assert [ln.irq for ln in lines] == [24, 36, 50]
    assert lines[1].counts == (0, 6682) and lines[1].chip == "PCI-MSIX-0000:00:02.0"
    assert lines[2].name.endswith("mlx5_comp0@pci:0000:29:00.0")


def test_nvidia_minor():
    text = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 200\nDevice Minor: \t 3\n"
    assert parse_nvidia_minor(text) == 3
    assert parse_nvidia_minor("Model: x\n") is None


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("0", {0}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("0-1,4-5\n", {0, 1, 4, 5}),
        ("0-7:2/4", {0, 1, 4, 5}),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("bad", ["x", "3-1", "1-", "-1", "0-3:0/4"])
def test_parse_cpulist_rejects(bad):
    with pytest.raises(CpuListError):
        parse_cpulist(bad)


def test_masks():
    assert parse_mask("ff,00000001") == frozenset({0, *range(32, 40)})
    assert format_mask({0, 1}, 2) == "00000003"
    assert format_mask({33}, 64) == "00000002,00000000"


@given(st.frozensets(st.integers(0, 300), max_size=60))
def test_cpulist_and_mask_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == cpus
    assert parse_mask(format_mask(cpus)) == cpus


DYN_NONE = (
    "CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT_NONE=y\n# CONFIG_PREEMPT is not set\n"
    "CONFIG_PREEMPT_DYNAMIC=y\n"
)


@pytest.mark.parametrize(
    "debugfs, cmdline, config, version, expected",
    [
        # debugfs names the current model in parentheses, whatever the rest says
        ("none voluntary (full) lazy\n", "", DYN_NONE, "#1 SMP PREEMPT_DYNAMIC", ("full", True)),
        ("(none) voluntary full lazy\n", "", None, None, ("none", True)),
        # a dynamic kernel booted with preempt= runs that model, not its config's default
        (None, "quiet preempt=full ro", DYN_NONE, "#1 SMP PREEMPT_DYNAMIC", ("full", True)),
        (None, "quiet ro", DYN_NONE, "#1 SMP PREEMPT_DYNAMIC @0", ("none", True)),
        # a kernel that is not dynamic ignores preempt=
        (None, "preempt=full", "CONFIG_PREEMPT_VOLUNTARY=y\n", "#1 SMP", ("voluntary", False)),
        (None, "", "CONFIG_PREEMPT=y\nCONFIG_PREEMPT_BUILD=y\n", "#1 SMP PREEMPT", ("full", False)),
        (None, "", "CONFIG_PREEMPT_LAZY=y\nCONFIG_PREEMPT=y\n", None, ("lazy", False)),
        (None, "", "CONFIG_PREEMPT_RT=y\nCONFIG_PREEMPT=y\n", None, ("rt", False)),
        # without a config: the version string
        (None, "", None, "#1 SMP PREEMPT_RT Tue", ("rt", False)),
        (None, "", None, "#1 SMP PREEMPT Tue", ("full", False)),
        (None, "", None, "#1 SMP Debian 6.1.0", ("none", False)),
        (None, "", None, "#1 SMP PREEMPT_DYNAMIC Debian", (None, True)),
        (None, None, None, None, (None, False)),
        ("garbage", "", None, None, (None, False)),
    ],
)
def test_preemption_model(debugfs, cmdline, config, version, expected):
    got = parse_preemption(debugfs, cmdline, config, version)
    assert (got.model, got.dynamic) == expected
    assert got.source


@pytest.mark.parametrize(
    ("config", "ok", "words"),
    [
        (DYN_NONE, False, ["model none (the kernel config)", "preempt=full", "sched/preempt"]),
        ("CONFIG_PREEMPT_VOLUNTARY=y\n", False, ["model voluntary", "preempt=full"]),
        ("CONFIG_PREEMPT=y\n", True, ["model full (the kernel config)"]),
    ],
)
def test_the_doctor_names_the_preemption_model_and_what_to_do(tmp_path, config, ok, words):
    from hostd.doctor import preemption_finding
    from hostd.host import Host

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.18.1-test\n")
    (tmp_path / "proc/sys/kernel/version").write_text("#1 SMP\n")
    (tmp_path / "proc/cmdline").write_text("quiet\n")
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot/config-6.18.1-test").write_text(config)
    finding = preemption_finding(Host(tmp_path))
    assert finding.feature == "preemption" and finding.ok is ok
    assert all(w in finding.detail for w in words), finding.detail
    assert ("sched/preempt" in finding.detail) == ("PREEMPT_DYNAMIC=y" in config)


def test_parse_cpu_times():
    from hostd.host.parsers import parse_cpu_times

    text = (
        "cpu  10 20 30 40 50 60 70 80 0 0\n"
        "cpu0 1 2 3 40 5 6 7 8 0 0\n"
        "cpu1 100 0 50 1000 10 1 2 3 0 0\n"
        "cpux 1 2 3 4 5 6 7 8\n"  # not a CPU: skipped
        "cpu2 a b c d e f g h\n"  # garbage: skipped
        "intr 1 2 3\n"
        "cpu3 1 1 1 1 1 1 1 1\n"  # after the cpu lines: not read
    )
    # busy = user + nice + system + irq + softirq; total adds idle, iowait and steal
    assert parse_cpu_times(text) == {0: (1 + 2 + 3 + 6 + 7, 19 + 40 + 5 + 8),
                                     1: (153, 153 + 1000 + 10 + 3)}  # fmt: skip
    assert parse_cpu_times("") == {}


def test_parse_involuntary_and_pressure():
    from hostd.host.parsers import parse_involuntary, parse_pressure

    status = "Name:\tx\nvoluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t12\n"
    assert parse_involuntary(status) == 12
    assert parse_involuntary("Name:\tx\n") is None
    psi = (
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=56\n"
    )
    assert parse_pressure(psi) == (1234, 56)
    assert parse_pressure("some avg10=0.00 total=9\n") == (9, 0)
    assert parse_pressure("garbage\n") is None

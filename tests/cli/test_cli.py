"""CLI tests through the installed ``hostd`` entry point (as a user runs it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workload import TrainingJob

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else shutil.which("hostd")

pytestmark = pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed")


def hostd(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version():
    from hostd import __version__

    assert hostd("--version").stdout.strip() == f"hostd {__version__}"


def test_topo_json_live():
    data = json.loads(hostd("topo", "--json").stdout)
    from hostd.model.cpus import parse_cpulist

    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    assert data["online"] == sorted(online)
    assert data["nodes"] and data["cgroup"]["mode"] in ("v1", "v2", "hybrid")


def test_topo_table_live_names_what_matters():
    text = hostd("topo").stdout
    assert "CPUs online" in text and "NUMA" in text and "IRQs:" in text


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*") if p.is_dir()))
def test_commands_run_on_every_fixture_host(name):
    root = str(FIXTURES / name)
    topo = json.loads(hostd("topo", "--json", "--root", root).stdout)
    assert topo["cpus"]
    classified = json.loads(hostd("classify", "--json", "--root", root).stdout)
    assert sum(layer["threads"] for layer in classified["layers"]) == len(classified["threads"])
    plan = json.loads(hostd("plan", "--json", "--root", root).stdout)
    assert plan["pool"]
    assert "policy training" in hostd("plan", "--root", root).stdout


AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"


def test_classify_explain_and_plan_a_live_training_job():
    with TrainingJob(ranks=2, workers=1) as job:
        rank = str(job.ranks[0])
        data = json.loads(hostd("classify", "--json", "--pid", rank).stdout)
        comms = {t["comm"]: t["layer"] for t in data["threads"]}
        pids = {t["pid"] for t in data["threads"]}  # the rank and its descendants
        assert job.ranks[0] in pids and job.launcher not in pids and pids <= set(job.pids)
        expected_rt = os.geteuid() == 0
        assert comms["gloo_tcp_loop"] == ("comms" if expected_rt else "rest")
        text = hostd("explain", rank).stdout
        if expected_rt:
            assert "-> layer trainer, group 1" in text
            assert "job_role = 'rank'" in text
            assert f"job: rank 0 of job torchrun {job.launcher} " in text
            # Earlier layers are named; asked, each says why it did not match, with the
            # thread's own value.
            assert "layers before it, no match: comms, data, helpers (--why-not: why)" in text
            assert "comm is" not in text
            assert "comm is" in hostd("explain", rank, "--why-not").stdout
        ex = json.loads(hostd("explain", rank, "--json").stdout)
        assert ex["thread"]["parent_comm"] == "pt_elastic"
        assert ex["layers"][-1]["matched"] is True
        plan = json.loads(hostd("plan", "--json", "--scope-pid", str(job.launcher)).stdout)
        layers = {layer["name"]: layer for layer in plan["layers"]}
        if expected_rt:
            assert layers["trainer"]["threads"] >= 4
            decided = {t["tid"]: t for t in plan["tasks"]}
            gloo = next(t["tid"] for t in data["threads"] if t["comm"] == "gloo_tcp_loop")
            # A comm thread weighs as its rank's threads (BENCHMARKS.md): nothing to change.
            assert gloo not in decided
            # Each rank leads its session (as under torchrun): its leader gets the session
            # weight; on a small host the trainer gets no CPUs of its own.
            assert decided[job.ranks[0]]["group_nice"] == (-5 if AUTOGROUPS else None)
        members = hostd("classify", "--members", "--layer", "helpers").stdout
        assert "pt_elastic" in members


def test_classify_unknown_layer_is_bad_input():
    proc = hostd("classify", "--layer", "nope", check=False)
    assert proc.returncode == 2
    assert "--layer 'nope'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    typo = hostd("stats", "--layer", "trainr", "--interval", "0.1", check=False)
    assert typo.returncode == 2 and '(did you mean "trainer"?)' in typo.stderr


def test_explain_and_changes_say_what_hostd_holds_changed(tmp_path):
    """From the journal: each knob hostd holds changed, its original and its value now, and
    whether someone else changed it since hostd wrote it (then ``hostd changes`` exits 4)."""
    from hostd.host import Host
    from hostd.journal import Journal, read_boot_id

    state = ("--state-dir", str(tmp_path))
    none = hostd("explain", str(os.getpid()), *state).stdout
    assert f"hostd now: no journal in {tmp_path} (no agent has changed this host)" in none
    assert hostd("changes", *state).stdout.startswith("hostd holds nothing changed: no journal")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        host = Host("/")
        key = f"task/{proc.pid}@{host.start_time(proc.pid)}/nice"
        journal = Journal(tmp_path, read_boot_id(host))
        journal.record([(key, 0)], wrote=[(key, 5)])
        journal.close()
        os.setpriority(os.PRIO_PROCESS, proc.pid, 5)
        text = hostd("explain", str(proc.pid), *state).stdout
        assert "hostd now: thread nice 5 (before hostd: 0)\n" in text, text
        assert text.index("hostd now:") < text.index("-> layer")
        listed = hostd("changes", *state).stdout.splitlines()
        assert listed[0] == "# hostd holds 1 knobs changed: 1 as hostd wrote it"
        assert listed[2].split("\t") == ["thread nice", key, "0", "5", "held"]
        os.setpriority(os.PRIO_PROCESS, proc.pid, 7)  # someone else
        doc = json.loads(hostd("explain", str(proc.pid), *state, "--json").stdout)
        knob = {"key": key, "kind": "nice", "what": "thread nice", "original": 0, "current": 7,
                "wrote": [5], "state": "changed"}  # fmt: skip
        assert doc["held"] == [knob]
        text = hostd("explain", str(proc.pid), *state).stdout
        assert "thread nice 7 (before hostd: 0); changed by someone else since hostd" in text
        changed = hostd("changes", *state, "--json", check=False)
        assert changed.returncode == 4
        assert json.loads(changed.stdout)["knobs"] == [knob]
        other = hostd("explain", str(os.getpid()), *state).stdout
        assert "hostd now: holds nothing changed on this thread" in other
    finally:
        proc.kill()
        proc.wait()
    gone = json.loads(hostd("changes", *state, "--json").stdout)
    assert gone["counts"] == {"gone": 1} and gone["knobs"][0]["current"] is None


def test_explain_unknown_thread_is_bad_input():
    proc = hostd("explain", "99999999", check=False)
    assert proc.returncode == 2
    assert "no such thread" in proc.stderr


def test_missing_root_is_bad_input(tmp_path):
    proc = hostd("topo", "--root", str(tmp_path / "absent"), check=False)
    assert proc.returncode == 2 and "expected an existing folder" in proc.stderr


def test_bad_policy_is_one_line_exit_2_and_nothing_planned(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'version = 1\n[[layer]]\nname = "x"\ncomment = "c"\nmatch = [[]]\nkind = "wide"\n'
    )
    proc = hostd("plan", "--policy", str(bad), check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        f'hostd: {bad}:6:1: layer[0].kind: \'wide\': expected one of "confined", "grouped", "open"'
    )


def test_policy_check_shipped_policies():
    files = sorted(str(p) for p in (REPO / "policies").glob("*.toml"))
    assert files
    proc = hostd("policy", "check", *files)
    assert proc.stdout.count(": ok (") == len(files)
    assert "warning" not in proc.stderr


def test_policy_check_mixed_exit_2(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text("version = 1\nlayers = []\n")
    proc = hostd("policy", "check", str(REPO / "policies" / "training.toml"), str(bad), check=False)
    assert proc.returncode == 2
    assert ": ok (" in proc.stdout
    assert proc.stderr.splitlines() == [
        f"hostd: {bad}:2:1: layers: unknown key (a typo?); expected one of version, name, "
        "description, pool_min, agent, preempt, guard, cgroups, metrics, sizing, jobs, layer "
        '(did you mean "layer"?)',
        f"hostd: {bad}: layer: expected at least one [[layer]], the last one a catch-all",
    ]


def test_policy_show_default_is_the_shipped_file():
    shown = hostd("policy", "show").stdout
    assert shown == (REPO / "policies" / "training.toml").read_text()


def test_policy_show_says_who_preempts_and_the_preemption_settings():
    shown = hostd("policy", "show", "--policy", str(REPO / "policies" / "training.toml")).stdout
    assert "trainer (grouped, preempts)" in shown and "rest (open, preemptible)" in shown
    assert "[preempt] busy = 0.5 CPUs" in shown and "session_nice = 19" in shown
    assert "[guard] starve_after = 5 s" in shown


def _status_file(run: Path, state: str, records: int) -> None:
    run.mkdir(exist_ok=True)
    doc = {
        "version": "0.1.0", "pid": 1, "state": state, "mode": "enforce",
        "policy": {"name": "training", "source": "<embedded training.toml>"},
        "journal": {"records": records}, "layers": [], "last_pass": None,
    }  # fmt: skip
    (run / "status.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("state", "records", "code", "says"),
    [
        (None, 0, 3, "not running (no agent has run here)"),
        ("stopped", 0, 3, "stopped, everything restored"),
        ("stopped", 2, 3, "its changes were kept (2 originals in the journal): `hostd restore`"),
        ("running", 7, 1, "ended without restoring (its last state: running); its journal held "
                          "7 originals: run `hostd restore`"),
        ("disabled", 0, 1, "ended without restoring (its last state: disabled)"),
    ],
)  # fmt: skip
def test_status_says_what_is_true_and_exits_by_it(tmp_path, state, records, code, says):
    """No agent runs here (its pid file is not locked): what the last status file says tells a
    clean stop from an end that left originals to restore."""
    run = tmp_path / "run"
    if state is not None:
        _status_file(run, state, records)
    proc = hostd("status", "--run-dir", str(run), check=False)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert says in proc.stdout, proc.stdout
    doc = json.loads(hostd("status", "--json", "--run-dir", str(run), check=False).stdout)
    assert doc["running"] is False
    want = "unclean" if code == 1 else "stopped"
    assert (doc["agent_state"] if state else doc["state"]) == want


def test_status_says_a_persisted_switch():
    from hostd.cli.status import agent_state

    st = {"state": "disabled", "journal": {"records": 0}}
    assert agent_state(st, 42, True)[:2] == ("disabled", 5)
    assert "persists" in agent_state(st, 42, True)[2]
    assert agent_state({"state": "running"}, 42, False)[:2] == ("running", 0)
    state, code, line = agent_state({"state": "stopped"}, None, True)
    assert (state, code) == ("stopped", 3)
    assert "an agent started later stays off until `hostd enable`" in line


def _live_status_file(run: Path, state: str, mode: str = "enforce") -> None:
    """A last status file with what only holds while the agent runs: a demoted session, a boost,
    a demoted cgroup, an attempt being recorded, a layer's thread count."""
    import time

    _status_file(run, state, 0)
    doc = json.loads((run / "status.json").read_text())
    now = time.time()
    doc.update(
        mode=mode,
        last_pass={"time": now - 2, "seconds": 0.01, "counts": {"applied": 3}},
        layers=[{"name": "trainer", "kind": "grouped", "threads": 12, "cpus": [0, 1],
                 "notes": []}],
        preempt={
            "enabled": True, "active": True, "busy_cpus": 0.5, "guard": True,
            "protected_layers": ["trainer"], "preemptible_layers": ["rest"],
            "demoted": [{"session": 4242, "seconds": 6.0, "demand_at_demotion": 3.5,
                         "demand_now": 3.4}],
            "demoted_cgroups": ["/hostd.demoted"],
            "counts": {"boosts": 2, "runaways": 0},
            "recent": [{"time": now - 6, "what": "demote", "why": "session of make(4242) "
                        "wanted 3.50 CPUs", "session": 4242}],
        },
        attempts={"live": [{"job": "llama", "attempt": "slurm 7 restart 0",
                            "protected": mode == "enforce", "throughput": None}]},
    )  # fmt: skip
    (run / "status.json").write_text(json.dumps(doc))


LIVE = ("preemption", "demoted", "session 4242", "recording job", "starvation guard",
        "yields", "trainer\t", "last pass")  # fmt: skip


@pytest.mark.parametrize("state", ["stopped", "running"])
def test_status_of_an_agent_that_ended_says_no_live_section(tmp_path, state):
    """Its last status file still holds preemption, demotions, boosts and attempts: after a stop
    ("everything restored") or a crash (its last state "running") none of them holds, and none
    is said; only the end, and what to do."""
    run = tmp_path / "run"
    _live_status_file(run, state)
    proc = hostd("status", "--run-dir", str(run), check=False)
    shown = proc.stdout
    assert proc.returncode == (3 if state == "stopped" else 1), shown + proc.stderr
    for live in LIVE:
        assert live not in shown, shown
    assert "it ran in mode enforce, policy training" in shown
    if state == "stopped":
        assert "stopped, everything restored" in shown and "`hostd run`" in shown
    else:
        assert "ended without restoring" in shown and "`hostd restore`" in shown
    doc = json.loads(hostd("status", "--json", "--run-dir", str(run), check=False).stdout)
    assert doc["running"] is False  # the JSON keeps the last file, with running false


def _hold_pid_file(run: Path) -> int:
    """As a running agent holds it (``hostd.agent.lock``): locked, with a pid in it."""
    import fcntl

    fd = os.open(run / "agent.pid", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def test_status_of_a_running_agent_in_observe_mode_says_would(tmp_path):
    """Observe mode changes nothing: status says what it would do, never "demoted"; in enforce
    mode the same file says what it did."""
    run = tmp_path / "run"
    _live_status_file(run, "running", mode="observe")
    fd = _hold_pid_file(run)
    try:
        proc = hostd("status", "--run-dir", str(run), check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        shown = proc.stdout
        assert "observe mode: hostd changes nothing" in shown
        assert "of rest would yield to trainer" in shown
        assert "session 4242 would have been demoted 6s ago" in shown
        assert "cgroup /hostd.demoted would yield as a whole" in shown
        assert "would have made 2 boosts" in shown
        assert "would demote session 4242" in shown
        assert "recording job llama attempt slurm 7 restart 0 (not protected)" in shown
        for did in ("4242 demoted", "yields as a whole", "guard: 2 boosts"):
            assert did not in shown, shown
        assert re.search(r"\d demote session", shown) is None, shown
        _live_status_file(run, "running", mode="enforce")
        shown = hostd("status", "--run-dir", str(run)).stdout
        assert "session 4242 demoted 6s ago" in shown and "would" not in shown, shown
        assert "recording job llama attempt slurm 7 restart 0 (protected)" in shown
    finally:
        os.close(fd)


def test_piped_tables_are_tab_separated_lines():
    """Piped (as here), a table is its title as "# title", a header line and one line per row,
    tab-separated, whatever their width: for grep, cut and awk, as ps(1) prints."""
    shown = hostd("classify", "--root", str(FIXTURES / "dgx-h100")).stdout.splitlines()
    title, header, *rows = shown
    assert title.startswith("# policy training: ")
    assert header.split("\t") == ["layer", "threads", "processes", "kind", "comment"]
    assert len(rows) == 8 and all(len(r.split("\t")) == 5 for r in rows)
    layers = {r.split("\t")[0]: int(r.split("\t")[1]) for r in rows}
    assert sum(layers.values()) == int(title.split()[-2])
    topo = hostd("topo", "--root", str(FIXTURES / "dgx-h100")).stdout
    assert "# NUMA nodes\nnode\tCPUs\t" in topo


def test_classify_stats_and_plan_count_the_same_threads():
    """On a fixture host (no thread comes or goes): the same threads, the same layers, whichever
    command shows them, and --pid, --tid, --layer choose alike."""
    root = str(FIXTURES / "dgx-h100")
    classified = json.loads(hostd("classify", "--json", "--root", root).stdout)
    per_layer = {ly["name"]: ly["threads"] for ly in classified["layers"]}
    assert sum(per_layer.values()) == len(classified["threads"])
    # the plan counts the threads it decides for: all but kernel threads (left alone unless a
    # layer says is_kthread = true)
    from hostd.host import Host
    from hostd.policy import load_default
    from hostd.snapshot import take

    snap = take(Host(root), load_default())
    assert {c.task.tid for c in snap.classified} == {t["tid"] for t in classified["threads"]}
    user = {}
    for c in snap.classified:
        user[c.layer] = user.get(c.layer, 0) + (not c.task.is_kthread)
    plan = json.loads(hostd("plan", "--json", "--root", root).stdout)
    assert {ly["name"]: ly["threads"] for ly in plan["layers"]} == user
    chosen = json.loads(
        hostd("classify", "--json", "--root", root, "--pid", "4000", "--layer", "trainer").stdout
    )
    tids = {t["tid"] for t in chosen["threads"]}
    assert tids and all(t["layer"] == "trainer" for t in chosen["threads"])
    # the launcher's descendants: its ranks' threads, not the launcher's own
    assert 4100 in tids and 4000 not in tids
    shown = json.loads(
        hostd("plan", "--json", "--root", root, "--pid", "4000", "--layer", "trainer").stdout
    )
    assert {t["tid"] for t in shown["tasks"]} <= tids
    one = json.loads(hostd("classify", "--json", "--root", root, "--tid", "4101").stdout)
    assert [t["tid"] for t in one["threads"]] == [4101]
    bad = hostd("stats", "--root", root, "--pid", "999999", check=False)
    assert bad.returncode == 2 and "--pid 999999: no such process" in bad.stderr


HOSTILE = "[/]\x1b[2J\x1b]0;pwn\x07"  # markup rich cannot parse; clear screen; retitle


def test_names_from_the_host_are_text_with_control_characters_shown(tmp_path):
    """Issue 44.6: a thread named "[/]" crashed classify -m, explain, stats and top (rich took it
    for markup), a job named so crashed `hostd status` for everyone, and an escape sequence in a
    name reached the operator's terminal raw. Every value of the host is text now, with its
    control characters as escapes."""
    from tests.fakes import host_copy

    tree = host_copy(tmp_path)
    task = tree / "proc" / "4100" / "task" / "4101"
    stat = (task / "stat").read_text()
    (task / "stat").write_text(stat.replace("(python3)", f"({HOSTILE})", 1))
    root = str(tree)
    shown = "[/]\\x1b[2J\\x1b]0;pwn\\x07"
    for args in (("classify", "-m"), ("explain", "4101"), ("plan",)):
        proc = hostd(*args, "--root", root, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "Traceback" not in proc.stderr, args
        assert shown in proc.stdout or args[0] == "plan", (args, proc.stdout[-500:])
    run = tmp_path / "run"
    _status_file(run, "running", 0)  # a running agent's: status says the attempts it records
    doc = json.loads((run / "status.json").read_text())
    doc["attempts"] = {"live": [{"job": HOSTILE, "attempt": "[/]x", "uid": 1000,
                                 "protected": True, "since": 0}]}  # fmt: skip
    (run / "status.json").write_text(json.dumps(doc))
    fd = _hold_pid_file(run)
    try:
        proc = hostd("status", "--run-dir", str(run), check=False)
    finally:
        os.close(fd)
    assert "Traceback" not in proc.stderr and "\x1b" not in proc.stdout, proc.stderr
    assert f"recording job {shown}" in proc.stdout, proc.stdout


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a terminal")
def test_classify_fits_an_80_column_terminal():
    """On a terminal, a layer (and a thread of --members) is one line of at most 80 columns,
    long cells cut with an ellipsis; piped, every cell is whole (for grep)."""

    def on_terminal(*args: str) -> list[str]:
        cmd = " ".join([HOSTD, "classify", *args])
        env = {**os.environ, "COLUMNS": "80", "LINES": "24", "TERM": "xterm"}
        proc = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True,
                              text=True, timeout=120, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", proc.stdout)
        return [line.rstrip("\r") for line in plain.splitlines() if line.strip()]

    from hostd.policy import load_default

    layers = [ly.name for ly in load_default().layers]
    lines = on_terminal()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    rows = [line for line in lines if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == layers  # one line each
    assert any(row.rstrip(" │").endswith("…") for row in rows)  # the comments, cut
    members = on_terminal("--members")
    assert max(len(line) for line in members) <= 80
    piped = hostd("classify").stdout.splitlines()
    comms = next(line for line in piped if line.startswith("comms\t"))
    assert comms.split("\t")[-1] == load_default().layer("comms").comment

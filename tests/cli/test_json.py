"""Every command's --json is one object with a "schema" version, valid against its JSON Schema
in docs/json/ (the shapes' documentation); CPU sets are lists of numbers everywhere."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from tests.cli.test_cli import FIXTURES, REPO, hostd

SCHEMAS = REPO / "docs" / "json"
DGX = str(FIXTURES / "dgx-h100")


def schema(name: str) -> dict:
    doc = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


def valid(name: str, *args: str, code: int = 0) -> dict:
    proc = hostd(*args, "--json", check=False)
    assert proc.returncode == code, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, schema(name), cls=jsonschema.Draft202012Validator)
    assert doc["schema"] == schema(name)["properties"]["schema"]["const"]
    return doc


def test_topo():
    doc = valid("topo", "topo", "--root", DGX)
    assert doc["online"] == list(range(64)) and doc["gpus"][0]["local_cpus"]


def test_classify_and_explain():
    doc = valid("classify", "classify", "--root", DGX)
    assert sum(ly["threads"] for ly in doc["layers"]) == len(doc["threads"])
    valid("explain", "explain", "4100", "--root", DGX)


def test_plan():
    doc = valid("plan", "plan", "--root", DGX)
    assert all(isinstance(c, int) for ly in doc["layers"] for c in ly["cpus"])


def test_stats_live():
    valid("stats", "stats", "--interval", "0.2")


def test_doctor():
    doc = valid("doctor", "doctor", "--root", DGX)
    assert {f["feature"] for f in doc["findings"]}


def test_status_where_no_agent_ran(tmp_path):
    valid("status", "status", "--run-dir", str(tmp_path / "run"), code=3)


@pytest.mark.skipif(os.geteuid() != 0, reason="hostd restore needs root")
def test_restore_of_an_empty_journal(tmp_path):
    doc = valid(
        "restore", "restore", "--state-dir", str(tmp_path / "s"), "--run-dir", str(tmp_path / "r")
    )
    assert doc["results"] == [] and doc["unreadable"] == []


def test_every_command_with_json_has_a_schema():
    import typer.main

    from hostd.cli import app
    from hostd.cli.manual import _commands, _options

    having = {
        name.split()[0]
        for name, cmd in _commands(typer.main.get_command(app))
        if any("--json" in o.opts for o in _options(cmd))
    }
    # (a subcommand's own: "policy-check"; policy.schema.json is the policy file's, for editors)
    named = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")}
    named |= {"enable", "disable"}  # both switch.schema.json
    named -= {"switch"}
    assert having == {name.split("-")[0] for name in named}


@pytest.mark.skipif(os.geteuid() != 0, reason="hostd enable and disable need root")
def test_enable_and_disable_where_no_agent_runs(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    off = valid("switch", "disable", "--run-dir", str(run))
    assert off == {"schema": 1, "disabled": True, "agent_pid": None, "run_dir": str(run)}
    assert (run / "disabled").exists()
    assert valid("switch", "enable", "--run-dir", str(run))["disabled"] is False
    assert not (run / "disabled").exists()


def test_the_status_document_of_a_running_agent(tmp_path):
    """The agent's own status file, after a full pass (an agent on a fixture tree with fake
    thread calls, as tests/unit/test_agent_parts.py runs it)."""
    from hostd.agent import Agent
    from hostd.host import Host
    from tests.fakes import FakeCalls, host_copy

    tree = host_copy(tmp_path)
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
    finally:
        agent.journal.close()
        agent.status.close()
    doc = json.loads((tmp_path / "r" / "status.json").read_text())
    doc.update(schema=1, running=True, disabled=False, agent_state="running")
    jsonschema.validate(doc, schema("status"), cls=jsonschema.Draft202012Validator)
    assert doc["layers"] and isinstance(doc["layers"][0]["cpus"], list)


def test_changes_and_explain_with_a_journal(tmp_path):
    from hostd.host import Host
    from hostd.journal import Journal, read_boot_id

    assert valid("changes", "changes", "--state-dir", str(tmp_path))["journal"] is False
    host, me = Host("/"), os.getpid()
    key = f"task/{me}@{host.start_time(me)}/nice"
    journal = Journal(tmp_path, read_boot_id(host))
    journal.record([(key, os.getpriority(os.PRIO_PROCESS, me))])
    journal.close()
    doc = valid("changes", "changes", "--state-dir", str(tmp_path))
    assert [k["key"] for k in doc["knobs"]] == [key] and doc["knobs"][0]["state"] == "original"
    held = valid("explain", "explain", str(me), "--state-dir", str(tmp_path))["held"]
    assert held == doc["knobs"]


def test_policy_check():
    bad = sorted((REPO / "tests" / "fixtures" / "policies" / "bad").glob("*.toml"))[:3]
    good = str(REPO / "policies" / "gentle.toml")
    doc = valid("policy-check", "policy", "check", good, *map(str, bad), code=2)
    assert doc["ok"] is False and [f["ok"] for f in doc["files"]] == [True, False, False, False]
    assert doc["files"][0]["name"] == "gentle" and doc["files"][0]["layers"] > 0
    for f in doc["files"][1:]:  # the same lines as without --json, as fields
        said = hostd("policy", "check", f["file"], check=False).stderr.splitlines()
        assert [f"hostd: {e['message']}" for e in f["errors"]] == said
    assert valid("policy-check", "policy", "check", good)["ok"] is True

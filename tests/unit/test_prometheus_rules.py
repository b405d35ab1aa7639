"""deploy/prometheus/hostd-rules.yml: Prometheus' own tool checks the rules and runs them on
recorded series (tests/fixtures/prometheus/rules_test.yml), where every alert fires for the
fault it names and stays quiet on a healthy fleet, and the recording rules give the values
worked out by hand; every metric the rules read is one the exporter serves (a renamed metric
fails here, not in production).

promtool comes with Debian's prometheus package, unpacked by ``python -m tests.prometheus
install`` (.ci/run does it); without it the promtool tests skip and say so, the others run.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from hostd.agent import Agent, metrics
from hostd.host import Host
from hostd.preempt import Demotion
from hostd.reconcile import PassReport
from tests.fakes import FakeCalls, host_copy
from tests.prometheus import promtool

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (pip install -e '.[test]')")

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "hostd-rules.yml"
RECORDED = REPO / "tests" / "fixtures" / "prometheus" / "rules_test.yml"
OPERATIONS = REPO / "docs/operations.md"
needs_promtool = pytest.mark.skipif(
    promtool() is None,
    reason="no promtool: `python -m tests.prometheus install` (Debian's prometheus package)",
)
# Series of other exporters the rules read: Prometheus' own `up`, NVIDIA's dcgm-exporter and
# kube-state-metrics. Labels a target gives every series it scrapes, and `node` (made from
# Hostname with label_replace to meet kube-state-metrics' series).
EXTERNAL = re.compile(r"up|DCGM_\w+|kube_\w+")
TARGET_LABELS = {"job", "instance", "Hostname", "node"}
CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
KEYWORDS = {"and", "or", "unless", "bool", "offset"}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def recorded_tests() -> list[dict]:
    return yaml.safe_load(RECORDED.read_text())["tests"]


def run_promtool(*args: str) -> str:
    found = promtool()
    assert found
    proc = subprocess.run([found, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


@needs_promtool
def test_promtool_checks_the_rules():
    out = run_promtool("check", "rules", str(RULES))
    assert f"SUCCESS: {len(rules())} rules found" in out


@needs_promtool
def test_promtool_runs_the_rules_on_recorded_series():
    assert "SUCCESS" in run_promtool("test", "rules", str(RECORDED))


def test_every_alert_fires_for_its_fault_and_not_on_a_healthy_fleet():
    """Each alert has a recorded case where it fires, and the healthy fleet's case (the first)
    expects none of them; each recording rule's values are checked there."""
    alerts = [r["alert"] for r in rules() if "alert" in r]
    tests = recorded_tests()
    fires = {a["alertname"] for t in tests for a in t.get("alert_rule_test", ()) if a["exp_alerts"]}
    assert sorted(set(alerts) - fires) == []
    healthy = tests[0]
    assert "healthy" in healthy["name"]
    quiet = {a["alertname"] for a in healthy["alert_rule_test"] if a["exp_alerts"] == []}
    assert sorted(set(alerts) - quiet) == []
    checked = {t["expr"] for t in healthy["promql_expr_test"] if t["exp_samples"]}
    records = {r["record"] for r in rules() if "record" in r}
    assert sorted(records - checked) == []


def test_every_alert_says_how_bad_and_what_to_do():
    """A severity (page or ticket), a `for`, a summary, and a description that ends with its
    section in docs/operations.md ("Alerts"), which has one per alert."""
    docs = OPERATIONS.read_text()
    alerts = docs[docs.index("\n## Alerts") : docs.index("\n## Metrics")]
    for rule in rules():
        if "alert" not in rule:
            assert re.fullmatch(r"hostd:\w+:\w+", rule["record"]), rule["record"]
            continue
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        notes = rule["annotations"]
        assert notes["summary"] and "\n" not in notes["description"], name
        assert notes["description"].endswith(f"(docs/operations.md#{name.lower()}).")
        assert f"\n### {name}\n" in alerts, f"docs/operations.md, Alerts: no ### {name}"


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (functions, clauses, matchers and strings
    left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", CLAUSE.sub(" ", text))
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if m.group() not in KEYWORDS and not text[m.end() :].lstrip().startswith("("):
            names.add(m.group())
    return names


def representative(tmp_path: Path) -> list:
    """The exporter's families over a status document that has a bit of everything: an agent's
    full pass over the fixture host (observe mode, the default policy), its two job attempts
    sampled (their GPUs, CPU and wait), two sessions demoted (a user's login, and a system
    service, which only a policy edited badly demotes)."""
    tree = host_copy(tmp_path)
    nvml = json.loads((tree / "nvml.json").read_text())
    nvml["utilization"] = {str(g["index"]): 0.5 for g in nvml["gpus"]}
    (tree / "nvml.json").write_text(json.dumps(nvml))
    agent = Agent(Host(tree, calls=FakeCalls(tree)), None, state_dir=tmp_path / "s",
                  run_dir=tmp_path / "r", mode="observe")  # fmt: skip
    try:
        agent.pass_once()
        for run, wait in ((1_000_000, 0), (3_000_000, 400_000)):
            for tid, item in agent.inc.classified.items():
                path = tree / "proc" / str(item.task.pid) / "task" / str(tid) / "schedstat"
                path.write_text(f"{run} {wait} 10\n")
            agent.layer_stats.sample()
        procs = agent.cache.procs
        sessions: dict[int, list[int]] = {}
        for proc in procs.values():
            sessions.setdefault(proc.session, []).append(proc.pid)
        for sid in (procs[1210].session, procs[5000].session):  # sshd's, a user's login
            agent.watcher.watch.demoted[sid] = Demotion(sid, 0.0, 2.0)
            agent.watcher.demotions.demote(sid, 2.0, sessions)
        agent.write_status(PassReport(), None, "running")
        assert agent.status.last["attempts"]["live"]
        return list(metrics.Collector(agent.status, agent.exporter).collect())
    finally:
        agent.journal.close()
        agent.status.close()


def test_the_rules_read_only_what_the_exporter_serves(tmp_path):
    """Every hostd_* series the rules read is served under that name (a counter with _total,
    an info with _info, a histogram's _bucket, _sum, _count), with the labels the rules match,
    group or join on and, for an equality matcher, a value it serves; every hostd:* one is
    recorded in the file; anything else is another exporter's (EXTERNAL)."""
    suffixes = {"counter": ("_total",), "info": ("_info",), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count")}  # fmt: skip
    served: dict[str, set[str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for family in representative(tmp_path):
        declared = set(getattr(family, "_labelnames", ()))
        for suffix in suffixes[family.type]:
            served[family.name + suffix] = set(declared)
        for s in family.samples:
            served.setdefault(s.name, set()).update(s.labels)
            for label, value in s.labels.items():
                values.setdefault((s.name, label), set()).add(value)
    hostd_labels = set().union(*served.values())
    records = {r["record"] for r in rules() if "record" in r}
    for rule in rules():
        expr = rule["expr"]
        for name in metric_names(expr):
            if name.startswith("hostd:"):
                assert name in records, f"{name}: recorded by no rule"
            elif name.startswith("hostd_"):
                assert name in served, f"{name}: the exporter serves no such series"
            else:
                assert EXTERNAL.fullmatch(name), f"{name}: neither hostd's nor a known exporter's"
        for m in re.finditer(r"\b(hostd_\w+)\{([^}]*)\}", expr):
            name = m.group(1)
            for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', m.group(2)):
                assert label in served[name], f"{name}: no label {label}"
                if op == "=" and (name, label) in values:
                    assert value in values[name, label], f"{name}{{{label}={value!r}}}: never"
        for m in CLAUSE.finditer(expr):
            for label in filter(None, (w.strip() for w in m.group(2).split(","))):
                assert label in hostd_labels | TARGET_LABELS, f"{rule}: no label {label}"

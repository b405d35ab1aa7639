"""Every shipped policy validates and plans on every fixture host, and equals its golden plan.

Regenerate with ``python3 tools/golden_plans.py`` and review the diff when a change is meant.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("golden_plans", REPO / "tools" / "golden_plans.py")
golden_plans = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden_plans)

CASES = golden_plans.cases()


def test_there_are_hosts_and_policies():
    hosts = {h.name for h, _, _ in CASES}
    assert len(hosts) >= 3, hosts
    assert {p.stem for _, p, _ in CASES} >= {"training", "inference"}


@pytest.mark.parametrize(
    ("host_dir", "policy_file", "golden"), CASES, ids=[g.stem for _, _, g in CASES]
)
def test_plan_matches_golden(host_dir, policy_file, golden):
    text = golden_plans.render(host_dir, policy_file)
    assert golden.exists(), f"no golden plan {golden.name}: run python3 tools/golden_plans.py"
    old = golden.read_text()
    if text != old:
        diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), n=1))
        pytest.fail(f"plan changed; if meant, run python3 tools/golden_plans.py\n{diff[:4000]}")


def test_no_stale_golden_files():
    expected = {g.name for _, _, g in CASES}
    present = {p.name for p in golden_plans.GOLDEN.glob("*.json")}
    assert present <= expected, f"stale: {sorted(present - expected)}"

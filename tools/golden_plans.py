"""Regenerate (or check) the golden plan files: every fixture host x every shipped policy.

    python3 tools/golden_plans.py          # rewrite tests/golden/plans/*.json; review `git diff`
    python3 tools/golden_plans.py --check  # exit 1 and show a diff if any plan changed

A golden file is ``hostd plan --json --root tests/fixtures/hosts/HOST --policy policies/P.toml``
minus the policy hash (so a comment edit in a policy does not churn every file).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hostd.host import Host  # noqa: E402
from hostd.policy import load_policy  # noqa: E402
from hostd.snapshot import take  # noqa: E402

HOSTS = REPO / "tests" / "fixtures" / "hosts"
POLICIES = REPO / "policies"
GOLDEN = REPO / "tests" / "golden" / "plans"


def cases() -> list[tuple[Path, Path, Path]]:
    """(host dir, policy file, golden file) for every combination."""
    hosts = sorted(p for p in HOSTS.iterdir() if p.is_dir())
    policies = sorted(POLICIES.glob("*.toml"))
    return [(h, p, GOLDEN / f"{h.name}--{p.stem}.json") for h in hosts for p in policies]


def render(host_dir: Path, policy_file: Path) -> str:
    snap = take(Host(host_dir), load_policy(policy_file))
    data = snap.plan().to_json()
    data.pop("policy_sha256")
    # one line per list of numbers (a CPU set), so that a diff shows which set changed
    text = json.dumps(data, indent=1)
    text = re.sub(
        r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
        lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]",
        text,
    )
    return text + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    changed = 0
    expected = set()
    for host_dir, policy_file, golden in cases():
        expected.add(golden.name)
        text = render(host_dir, policy_file)
        old = golden.read_text() if golden.exists() else ""
        if text == old:
            continue
        changed += 1
        if args.check:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True), text.splitlines(True), str(golden), "now", n=2
                )
            )
        else:
            golden.write_text(text)
            print(f"wrote {golden.relative_to(REPO)}")
    stale = sorted(p for p in GOLDEN.glob("*.json") if p.name not in expected)
    for path in stale:
        changed += 1
        if args.check:
            print(f"stale golden file: {path.relative_to(REPO)}")
        else:
            path.unlink()
            print(f"removed {path.relative_to(REPO)}")
    if args.check and changed:
        print(f"{changed} golden plan(s) differ: run python3 tools/golden_plans.py and review")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

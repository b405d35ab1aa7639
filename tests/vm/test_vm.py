"""The VM tier as the outer pytest run sees it: each inner test's outcome is an outer test's.

One outer test per test function of ``tests/vm/inside`` (found by reading the files, so
collecting boots nothing): it passes, fails (showing the inner failure, its output and the
inner log's summary), skips or xfails as every inner case of that function (its parameters)
did in the VM's single boot. ``test_inner_session`` fails when the inner run as a whole did
not succeed (a collection error, a crash, the VM stopping early), showing the inner output and
the VM's console.
"""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET

import pytest

from tests.vm.vm import INSIDE, REPO, TierRun, extra_args

pytestmark = [pytest.mark.vm, pytest.mark.slow]
_HEADER = re.compile(r"^-+ Captured \w+ -+$")


def inner_tests() -> list[str]:
    """``file::function`` (or ``file::Class::method``) for every test in tests/vm/inside."""
    ids = []
    for path in sorted((REPO / INSIDE).glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("test"):
                    ids.append(f"{path.name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [
                    f"{path.name}::{node.name}::{sub.name}"
                    for sub in node.body
                    if isinstance(sub, ast.FunctionDef) and sub.name.startswith("test")
                ]
    return ids


def _key(case: ET.Element) -> str:
    """The inner id of a junit testcase: classname "tests.vm.inside.test_x[.Class]"."""
    module, *cls = case.get("classname", "").removeprefix(INSIDE.replace("/", ".") + ".").split(".")
    return "::".join([f"{module}.py", *cls, case.get("name", "").split("[")[0]])


def _cases(run: TierRun) -> dict[str, list[ET.Element]]:
    if not run.junit.exists():
        return {}
    by_key: dict[str, list[ET.Element]] = {}
    for case in ET.parse(run.junit).iter("testcase"):
        by_key.setdefault(_key(case), []).append(case)
    return by_key


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _describe(case: ET.Element, outcome: ET.Element) -> str:
    parts = [
        f"--- inner {case.get('name')}: {outcome.tag}: {outcome.get('message', '')}",
        (outcome.text or "").rstrip(),
    ]
    for stream in ("system-out", "system-err"):
        for node in case.iter(stream):
            # junit_logging=all heads each section with a "--- Captured ... ---" line.
            lines = [ln for ln in (node.text or "").splitlines() if not _HEADER.match(ln)]
            if "".join(lines).strip():
                parts += [f"--- inner {stream}", "\n".join(lines).strip()]
    return "\n".join(parts)


@pytest.mark.parametrize("inner", inner_tests())
def test_inside_vm(vm_tier: TierRun, inner: str) -> None:
    cases = _cases(vm_tier).get(inner)
    if not cases and extra_args():
        pytest.skip(f"not run inside (HOSTD_VM_PYTEST_ARGS={' '.join(extra_args())})")
    if not cases:
        pytest.fail(
            f"{inner} did not run inside the VM (inner exit status {vm_tier.rc}):\n"
            + _tail(vm_tier.log or vm_tier.console),
            pytrace=False,
        )
    failures, skips, xfails = [], [], []
    for case in cases:
        for outcome in case:
            if outcome.tag in ("failure", "error"):
                failures.append(_describe(case, outcome))
            elif outcome.tag == "skipped":
                reason = f"{case.get('name')}: {outcome.get('message', '')}"
                (xfails if outcome.get("type") == "pytest.xfail" else skips).append(reason)
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
    if len(xfails) == len(cases):
        pytest.xfail("; ".join(xfails))
    if len(skips) + len(xfails) == len(cases):
        pytest.skip("; ".join(skips + xfails))


def test_inner_session(vm_tier: TierRun) -> None:
    if vm_tier.rc != 0:
        status = (
            f"exited {vm_tier.rc}"
            if vm_tier.rc is not None
            else f"never finished (QEMU exit status {vm_tier.qemu_rc}; None: killed at the timeout)"
        )
        pytest.fail(
            f"the inner pytest {status}.\n--- inner output\n{vm_tier.log}\n"
            f"--- VM console (last lines)\n{_tail(vm_tier.console)}",
            pytrace=False,
        )
    unknown = sorted(set(_cases(vm_tier)) - set(inner_tests()))
    assert not unknown, f"inner tests no outer test reports: {unknown}"

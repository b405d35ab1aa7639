"""``hostd policy list`` names the policies installed in the package (so a pip install has them
all), exactly one of them the embedded default; ``hostd policy show`` takes their names as well
as files (an existing file wins)."""

from __future__ import annotations

import json
import os

from hostd.policy import DEFAULT_POLICY, installed_policies
from tests.cli.test_cli import REPO, hostd

NAMES = {"training", "gentle", "inference"}


def test_the_three_policies_are_installed_in_the_package_and_policies_links_to_them():
    installed = installed_policies()
    assert set(installed) == NAMES
    assert next(iter(installed)) == DEFAULT_POLICY.removesuffix(".toml")
    for name in NAMES:
        linked = REPO / "policies" / f"{name}.toml"
        assert linked.is_symlink(), linked
        assert linked.resolve() == (REPO / "hostd" / "policy" / f"{name}.toml").resolve()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"hostd.policy" = ["*.toml"]' in pyproject


def test_policy_list_text():
    lines = hostd("policy", "list").stdout.splitlines()
    assert lines[0].startswith("# installed policies")
    assert lines[1].split("\t") == ["policy", "default", "layers", "file", "description"]
    rows = [line.split("\t") for line in lines[2:]]
    assert {row[0] for row in rows} == NAMES
    assert [row[0] for row in rows if row[1] == "yes"] == ["training"]
    for name, _, layers, file, description in rows:
        assert file == f"{name}.toml" and int(layers) > 0 and description


def test_policy_list_json():
    doc = json.loads(hostd("policy", "list", "--json").stdout)
    assert doc["schema"] == 1
    policies = {p["name"]: p for p in doc["policies"]}
    assert set(policies) == NAMES
    assert [name for name, p in policies.items() if p["default"]] == ["training"]
    for name, p in policies.items():
        assert os.path.isfile(p["path"]) and p["path"].endswith(f"{name}.toml")
        assert p["description"] and p["layers"][-1] == "rest" and len(p["sha256"]) == 64
    check = hostd("policy", "check", *(p["path"] for p in policies.values())).stdout
    assert check.count(": ok (") == 3


def test_policy_show_by_name_is_the_same_as_by_file():
    for name in NAMES:
        by_name = hostd("policy", "show", name).stdout
        by_file = hostd("policy", "show", str(REPO / "hostd" / "policy" / f"{name}.toml")).stdout
        assert by_name == by_file and by_name
        assert hostd("policy", "show", "--policy", name).stdout == by_name
    shown = json.loads(hostd("policy", "show", "gentle", "--json").stdout)
    assert shown["policy"]["name"] == "gentle"


def test_policy_show_an_existing_file_wins_over_a_name(tmp_path):
    (tmp_path / "gentle").write_text((REPO / "policies" / "inference.toml").read_text())
    proc = subprocess_in(tmp_path, "policy", "show", "gentle", "--json")
    assert json.loads(proc.stdout)["policy"]["name"] == "inference"


def test_policy_show_an_unknown_name_says_the_installed_ones():
    proc = hostd("policy", "show", "traning", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "hostd: traning: expected a policy file or an installed policy's name "
        '(training, gentle, inference) (did you mean "training"?)\n'
    )
    proc = hostd("policy", "show", "gentle", "--policy", "training", check=False)
    assert proc.returncode == 2 and "two policies given" in proc.stderr


def subprocess_in(cwd, *args: str):
    import subprocess

    from tests.cli.test_cli import HOSTD

    proc = subprocess.run([HOSTD, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_every_command_takes_an_installed_policys_name():
    """``--policy NAME`` is the installed policy for plan, classify, explain and run too."""
    assert hostd("plan", "--policy", "gentle").stdout.startswith("policy gentle ")
    doc = json.loads(hostd("classify", "--policy", "inference", "--json").stdout)
    assert doc["policy"] == "inference", doc.keys()
    proc = hostd("plan", "--policy", "gentl", check=False)
    assert proc.returncode == 2 and '(did you mean "gentle"?)' in proc.stderr, proc.stderr


def test_run_takes_an_installed_policys_name(tmp_path):
    if os.geteuid() != 0:
        import pytest

        pytest.skip("hostd run needs root")
    proc = hostd("run", "--once", "--mode", "observe", "--policy", "gentle",
                 "--state-dir", str(tmp_path / "state"), "--run-dir", str(tmp_path / "run"),
                 check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the file of the package the command runs from (in CI: installed, not this checkout)
    listed = json.loads(hostd("policy", "list", "--json").stdout)["policies"]
    gentle = next(p["path"] for p in listed if p["name"] == "gentle")
    assert f"policy={gentle} " in proc.stderr, proc.stderr

"""deploy/k8s: the DaemonSets and the sidecar example, validated against Kubernetes' schemas.

``kubernetes-validate`` (the test extra) carries the OpenAPI schemas of each Kubernetes release,
so this runs offline. Validation is strict (an unknown field is an error), against the oldest
release the manifests need (1.30: ``appArmorProfile``) and the newest the validator knows. The
assertions pin what hostd needs from each manifest and that both stay in step with the unit
(capabilities), the default policy (the ConfigMaps) and hostd's version (the image tags).

daemonset.yaml is a canary by node: one DaemonSet per mode, each on the nodes labelled
``hostd.io/mode`` with its mode, whose pods differ from the other's in the mode only, and whose
init container waits for the previous pod's agent (``hostd restore --wait``) when a node moves
from one to the other.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO, VERSION
from tests.packaging.test_unit import CAPABILITIES

pytestmark = [pytest.mark.slow, pytest.mark.packaging]
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (pip install -e '.[test]')")

K8S = REPO / "deploy" / "k8s"
OLDEST = "1.30.0"
POLICY = (REPO / "hostd" / "policy" / "training.toml").read_text()


MODES = ("enforce", "observe")
MODE_LABEL = "hostd.io/mode"


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def documents(name: str) -> dict[str, dict]:
    """The file's documents by kind (the last of a kind: see ``daemonsets`` for DaemonSets)."""
    return {d["kind"]: d for d in load(name)}


def daemonsets() -> dict[str, dict]:
    """daemonset.yaml's DaemonSets by the mode their pods carry."""
    found = [d for d in load("daemonset.yaml") if d["kind"] == "DaemonSet"]
    by_mode = {d["spec"]["template"]["metadata"]["labels"][MODE_LABEL]: d for d in found}
    assert len(by_mode) == len(found), "two DaemonSets of one mode"
    return by_mode


@pytest.fixture(scope="module")
def validator():
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[test]')")
    import kubernetes_validate

    return kubernetes_validate


@pytest.mark.parametrize("name", ["daemonset.yaml", "sidecar.yaml"])
def test_manifest_is_valid(validator, name):
    docs = load(name)
    assert docs
    for version in (OLDEST, validator.latest_version()):
        for doc in docs:
            try:
                validator.validate(doc, version, strict=True)
            except validator.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']} invalid for Kubernetes {version}: {exc}")


def test_validator_catches_a_bad_manifest(validator):
    """Strict validation is not a formality: an unknown field is refused."""
    ds = daemonsets()["enforce"]
    ds["spec"]["template"]["spec"]["containers"][0]["capabilites"] = {}
    with pytest.raises(validator.ValidationError):
        validator.validate(ds, OLDEST, strict=True)


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def test_one_daemonset_per_mode():
    """Exactly one DaemonSet per mode, each on the nodes labelled with its mode and only there (a
    node without the label runs none), each owning its own pods only."""
    docs = load("daemonset.yaml")
    kinds = [d["kind"] for d in docs]
    assert sorted(kinds) == sorted(["Namespace", "ServiceAccount", "ConfigMap", *["DaemonSet"] * 2])
    by_mode = daemonsets()
    assert set(by_mode) == set(MODES)
    assert len({ds["metadata"]["name"] for ds in by_mode.values()}) == len(MODES)
    for mode, ds in by_mode.items():
        assert ds["metadata"]["labels"][MODE_LABEL] == mode
        # Selectors that do not overlap: neither DaemonSet claims the other's pods.
        assert ds["spec"]["selector"]["matchLabels"][MODE_LABEL] == mode
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
        spec = ds["spec"]["template"]["spec"]
        assert "nodeSelector" not in spec
        affinity = spec["affinity"]["nodeAffinity"]
        assert set(affinity) == {"requiredDuringSchedulingIgnoredDuringExecution"}
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [
            {"matchExpressions": [{"key": MODE_LABEL, "operator": "In", "values": [mode]}]}
        ]


def leaves(value: object, path: str = "") -> dict[str, object]:
    """Every scalar of a document by its path ("spec.template.spec.containers.0.image")."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return {path.lstrip("."): value}
    return {k: v for key, item in items for k, v in leaves(item, f"{path}.{key}").items()}


def test_the_daemonsets_differ_in_the_mode_only():
    """Same image, capabilities, volumes, grace period, resources, everything: an arm of the
    canary differs from the other by what its agent is told, nothing else."""
    enforce, observe = (leaves(daemonsets()[mode]) for mode in MODES)
    assert enforce.keys() == observe.keys()
    differ = {path for path in enforce if enforce[path] != observe[path]}
    command = "spec.template.spec.containers.0.command"
    assert differ == {
        "metadata.name",
        f"metadata.labels.{MODE_LABEL}",
        f"spec.selector.matchLabels.{MODE_LABEL}",
        f"spec.template.metadata.labels.{MODE_LABEL}",
        "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms.0.matchExpressions.0.values.0",
        f"{command}.5",  # hostd run --policy FILE --mode MODE
    }, differ
    assert enforce["metadata.name"] == "hostd-enforce"
    assert observe["metadata.name"] == "hostd-observe"


@pytest.mark.parametrize("mode", MODES)
def test_daemonset(mode):
    docs = documents("daemonset.yaml")
    namespace = docs["Namespace"]["metadata"]["name"]
    ds = daemonsets()[mode]
    assert ds["metadata"]["namespace"] == namespace
    assert docs["ServiceAccount"]["metadata"]["namespace"] == namespace
    template = ds["spec"]["template"]
    assert template["metadata"]["labels"][MODE_LABEL] == mode  # kubernetes_sd: the arm
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    spec = template["spec"]
    assert spec["hostPID"] is True
    assert spec["hostNetwork"] is True  # the proc connector: initial network namespace only
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= 30  # the agent restores everything before it exits

    # The observe pod too: its init container replays a journal a killed enforce pod left.
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["sys"]["hostPath"]["path"] == "/sys"
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/hostd"
    assert volumes["run"]["hostPath"]["path"] == "/run/hostd"
    assert volumes["policy"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]

    hostd = container(spec, "hostd")
    assert hostd["command"] == [
        "hostd", "run", "--policy", "/etc/hostd/policy.toml", "--mode", mode
    ]  # fmt: skip
    assert hostd["image"].endswith(f":{VERSION}")
    mounts = {m["mountPath"]: m for m in hostd["volumeMounts"]}
    assert mounts["/sys"].get("readOnly") is not True  # cgroupfs and cpufreq writes
    assert mounts["/etc/hostd"]["readOnly"] is True
    assert {"/var/lib/hostd", "/run/hostd"} <= set(mounts)
    assert hostd["resources"]["requests"] and hostd["resources"]["limits"]
    restore = spec["initContainers"][0]
    assert restore["image"] == hostd["image"]
    assert {"/var/lib/hostd", "/run/hostd"} <= {m["mountPath"] for m in restore["volumeMounts"]}
    # A node moving from the other DaemonSet: the old pod may still be restoring. The init
    # container waits for it (beyond the grace period, after which the kubelet kills it).
    waits = re.search(r"\bhostd restore --wait (\d+)\b", " ".join(restore["command"]))
    assert waits, restore["command"]
    assert int(waits[1]) > grace
    for c in (hostd, restore):
        sc = c["securityContext"]
        assert sc["privileged"] is False
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        # The same capabilities as the systemd unit.
        assert {f"CAP_{cap}" for cap in sc["capabilities"]["add"]} == CAPABILITIES

    assert docs["ConfigMap"]["metadata"]["namespace"] == namespace
    assert docs["ConfigMap"]["data"]["policy.toml"] == POLICY, (
        "the ConfigMap's policy differs from hostd/policy/training.toml: "
        "run python3 deploy/k8s/embed_policy.py"
    )


def test_the_manifests_options_are_the_clis():
    """`hostd run --mode` and `hostd restore --wait`, as the DaemonSets use them, exist."""
    import typer.main

    from hostd.cli import app
    from hostd.cli.manual import _commands, _options

    commands = dict(_commands(typer.main.get_command(app)))

    def options(name: str) -> set[str]:
        return {o for opt in _options(commands[name]) for o in opt.opts}

    for ds in daemonsets().values():
        spec = ds["spec"]["template"]["spec"]
        run = container(spec, "hostd")["command"]
        assert run[:2] == ["hostd", "run"]
        assert {w for w in run if w.startswith("-")} <= options("run")
        init = spec["initContainers"][0]["command"][-1]
        restore = re.search(r"hostd restore((?: --?[a-z-]+(?: \d+)?)*)", init)[1].split()
        assert {w for w in restore if w.startswith("-")} <= options("restore"), restore


def test_sidecar():
    docs = documents("sidecar.yaml")
    spec = docs["Pod"]["spec"]
    assert spec["shareProcessNamespace"] is True
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    hostd = container(spec, "hostd")
    assert hostd["command"][:3] == ["hostd", "run", "--sidecar"]
    assert hostd["image"].endswith(f":{VERSION}")
    sc = hostd["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    added = set(sc["capabilities"]["add"])
    assert "SYS_NICE" in added
    assert added <= {"SYS_NICE", "SYS_PTRACE", "DAC_READ_SEARCH"}
    assert not any(v.get("hostPath") for v in spec["volumes"])
    assert docs["ConfigMap"]["data"]["policy.toml"] == POLICY, (
        "the ConfigMap's policy differs from hostd/policy/training.toml: "
        "run python3 deploy/k8s/embed_policy.py"
    )


def test_embed_policy_is_idempotent(tmp_path):
    sys.path.insert(0, str(K8S))
    try:
        import embed_policy
    finally:
        sys.path.remove(str(K8S))
    for name in embed_policy.MANIFESTS:
        text = (K8S / name).read_text()
        assert embed_policy.embed(text, POLICY) == text
    changed = embed_policy.embed(Path(K8S / "sidecar.yaml").read_text(), "version = 1\n")
    assert "  policy.toml: |\n    version = 1\n---\n" in changed

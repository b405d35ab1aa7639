"""deploy/k8s: the DaemonSet and the sidecar example, validated against Kubernetes' schemas.

``kubernetes-validate`` (the test extra) carries the OpenAPI schemas of each Kubernetes release,
so this runs offline. Validation is strict (an unknown field is an error), against the oldest
release the manifests need (1.30: ``appArmorProfile``) and the newest the validator knows. The
assertions pin what hostd needs from each manifest and that both stay in step with the unit
(capabilities), the default policy (the ConfigMaps) and hostd's version (the image tags).
"""

from __future__ import annotations

import importlib.util
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


def documents(name: str) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def validator():
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[test]')")
    import kubernetes_validate

    return kubernetes_validate


@pytest.mark.parametrize("name", ["daemonset.yaml", "sidecar.yaml"])
def test_manifest_is_valid(validator, name):
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    assert docs
    for version in (OLDEST, validator.latest_version()):
        for doc in docs:
            try:
                validator.validate(doc, version, strict=True)
            except validator.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']} invalid for Kubernetes {version}: {exc}")


def test_validator_catches_a_bad_manifest(validator):
    """Strict validation is not a formality: an unknown field is refused."""
    ds = documents("daemonset.yaml")["DaemonSet"]
    ds["spec"]["template"]["spec"]["containers"][0]["capabilites"] = {}
    with pytest.raises(validator.ValidationError):
        validator.validate(ds, OLDEST, strict=True)


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def test_daemonset():
    docs = documents("daemonset.yaml")
    namespace = docs["Namespace"]["metadata"]["name"]
    ds = docs["DaemonSet"]
    assert ds["metadata"]["namespace"] == namespace
    assert docs["ServiceAccount"]["metadata"]["namespace"] == namespace
    template = ds["spec"]["template"]
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

    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["sys"]["hostPath"]["path"] == "/sys"
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/hostd"
    assert volumes["run"]["hostPath"]["path"] == "/run/hostd"
    assert volumes["policy"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]

    hostd = container(spec, "hostd")
    assert hostd["command"] == ["hostd", "run", "--policy", "/etc/hostd/policy.toml"]
    assert hostd["image"].endswith(f":{VERSION}")
    mounts = {m["mountPath"]: m for m in hostd["volumeMounts"]}
    assert mounts["/sys"].get("readOnly") is not True  # cgroupfs and cpufreq writes
    assert mounts["/etc/hostd"]["readOnly"] is True
    assert {"/var/lib/hostd", "/run/hostd"} <= set(mounts)
    assert hostd["resources"]["requests"] and hostd["resources"]["limits"]
    restore = spec["initContainers"][0]
    assert "hostd restore" in " ".join(restore["command"])
    assert restore["image"] == hostd["image"]
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

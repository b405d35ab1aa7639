"""The container image: packaging/container/Containerfile built with buildah, then a smoke test.

Built with ``--isolation chroot`` and vfs storage (what works on this kind of machine, where
``podman run`` does not) into a storage folder of the session's own. Where Docker Hub cannot be
reached, the base is a local Debian 12 minbase root instead of debian:12-slim (the session's
summary says which). The smoke test runs hostd in a container of the image with
``buildah run --isolation chroot``.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.packaging.conftest import REPO, VERSION

pytestmark = [pytest.mark.slow, pytest.mark.packaging]


@pytest.fixture(scope="module")
def container(image):
    buildah = image.extra["buildah"]
    ctr = subprocess.run(
        [*buildah, "from", "-q", image.extra["tag"]], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield buildah, ctr
    finally:
        subprocess.run([*buildah, "rm", ctr], capture_output=True, check=False)


def run_in(container, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    buildah, ctr = container
    proc = subprocess.run(
        [*buildah, "run", "--isolation", "chroot", ctr, "--", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_image_config(image):
    buildah = image.extra["buildah"]
    fmt = "{{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.Cmd}} {{index .OCIv1.Config.Labels "
    fmt += '"org.opencontainers.image.version"}}'
    out = subprocess.run(
        [*buildah, "inspect", "--format", fmt, image.extra["tag"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == f"[hostd] [run --policy /etc/hostd/policy.toml] {VERSION}"


def test_image_smoke(container):
    assert run_in(container, "hostd", "--version").stdout.strip() == f"hostd {VERSION}"
    policy = run_in(container, "cat", "/etc/hostd/policy.toml").stdout
    assert policy == (REPO / "hostd" / "policy" / "training.toml").read_text()
    check = run_in(container, "hostd", "policy", "check", "/etc/hostd/policy.toml")
    assert "/etc/hostd/policy.toml: ok" in check.stdout
    doctor = run_in(container, "hostd", "doctor", check=False)
    assert "privileges" in doctor.stdout and "proc connector" in doctor.stdout, doctor.stdout
    plan = run_in(container, "hostd", "plan")
    assert "policy training" in plan.stdout, plan.stdout

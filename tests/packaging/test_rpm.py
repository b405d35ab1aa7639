"""The .rpm: built by packaging/build-rpm.sh, listed, installed into a scratch root and run there.

The scratch root is a copy of the clean Debian 12 root (it has the /usr/bin/python3.11 the
rpm's virtual environment is built on); ``rpm -i --root DIR --nodeps`` installs into it, since
that root's rpm database knows nothing of Debian's packages.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.packaging.conftest import (
    REPO,
    VERSION,
    check_installed_hostd,
    root_copy,
    rpm_version,
)

pytestmark = [pytest.mark.slow, pytest.mark.packaging]


def rpmq(*args: str) -> str:
    return subprocess.run(["rpm", *args], capture_output=True, text=True, check=True).stdout


def test_rpm_metadata_and_files(rpm):
    assert rpmq("-qp", "--qf", "%{NAME} %{VERSION}", str(rpm)) == f"hostd {rpm_version(VERSION)}"
    files = set(rpmq("-qlp", str(rpm)).split())
    for path in (
        "/etc/hostd/policy.toml",
        "/usr/bin/hostd",
        "/usr/lib/systemd/system/hostd.service",
        "/opt/hostd/bin/hostd",
        "/opt/hostd/pyvenv.cfg",
        "/usr/share/man/man1/hostd.1",
        "/usr/share/bash-completion/completions/hostd",
        "/usr/share/zsh/site-functions/_hostd",
        "/usr/share/fish/vendor_completions.d/hostd.fish",
    ):
        assert path in files, path
    assert any(f"/site-packages/hostd-{VERSION}.dist-info/" in f for f in files)
    # The policy is %config(noreplace): flags "c" (config) and "n" (noreplace).
    flags = dict(
        line.split(" ", 1)
        for line in rpmq(
            "-qp", "--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]", str(rpm)
        ).splitlines()
    )
    assert set(flags["/etc/hostd/policy.toml"]) >= {"c", "n"}
    assert rpmq("-qpc", str(rpm)).split() == ["/etc/hostd/policy.toml"]
    requires = rpmq("-qp", "--requires", str(rpm))
    assert "python(abi) = 3." in requires, requires
    # The bundled modules are not offered to the rest of the system.
    provides = rpmq("-qp", "--provides", str(rpm))
    assert "python3" not in provides, provides


@pytest.fixture(scope="module")
def rpm_root(rpm, bookworm_root, tmp_path_factory):
    with root_copy(bookworm_root, tmp_path_factory.mktemp("rpm-root")) as root:
        proc = subprocess.run(
            ["rpm", "-i", "--root", str(root), "--nodeps", str(rpm)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield root


def test_rpm_installs_and_runs(rpm_root):
    assert rpmq("--root", str(rpm_root), "-q", "--qf", "%{VERSION}", "hostd") == rpm_version(
        VERSION
    )
    verify = subprocess.run(
        # --nodeps: that root's rpm database holds no other package to satisfy hostd's Requires.
        ["rpm", "--root", str(rpm_root), "-V", "--nodeps", "hostd"],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert (rpm_root / "usr/lib/systemd/system/hostd.service").read_bytes() == (
        REPO / "packaging" / "hostd.service"
    ).read_bytes()
    check_installed_hostd(rpm_root)

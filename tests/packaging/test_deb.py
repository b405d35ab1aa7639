"""The .deb: built by packaging/build-deb.sh (dh-virtualenv), installed into a clean Debian 12.

Checks its metadata and contents (version, dependencies, the conffile, the unit, the bundled
virtual environment), that apt resolves its dependencies on Debian 12 and installs it, that the
installed hostd runs there (``--version``, ``policy check``, ``plan``, ``doctor``), that the
installed unit passes ``systemd-analyze verify``, and that removing it keeps the conffile while
purging removes it.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.packaging.conftest import (
    REPO,
    VERSION,
    check_installed_hostd,
    debian_version,
    in_root,
    root_copy,
)

pytestmark = [pytest.mark.slow, pytest.mark.packaging]

DEPENDENCIES = ("psutil", "nvidia_ml_py", "pyudev", "typer", "rich", "prometheus_client")


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, check=True).stdout


def test_deb_metadata(deb):
    assert dpkg_deb("-f", str(deb), "Package").strip() == "hostd"
    assert dpkg_deb("-f", str(deb), "Version").strip() == debian_version(VERSION)
    depends = dpkg_deb("-f", str(deb), "Depends")
    # The virtual environment is tied to the interpreter it was built on, by its versioned name.
    assert "python3." in depends, depends
    assert dpkg_deb("--info", str(deb), "conffiles").split() == ["/etc/hostd/policy.toml"]


def test_deb_contents(deb):
    listing = dpkg_deb("--contents", str(deb))
    paths = {line.split()[5] for line in listing.splitlines()}
    links = {line.split()[5]: line.split()[-1] for line in listing.splitlines() if " -> " in line}
    for path in (
        "./etc/hostd/policy.toml",
        "./opt/hostd/bin/hostd",
        "./opt/hostd/pyvenv.cfg",
        "./usr/bin/hostd",
        "./usr/share/man/man1/hostd.1.gz",
        "./usr/share/bash-completion/completions/hostd",
        "./usr/share/zsh/vendor-completions/_hostd",
        "./usr/share/fish/vendor_completions.d/hostd.fish",
    ):
        assert path in paths, path
    assert links["./usr/bin/hostd"] == "/opt/hostd/bin/hostd"
    units = [p for p in paths if p.endswith("/systemd/system/hostd.service")]
    assert units, "no systemd unit in the package"
    for dist in (f"hostd-{VERSION}", *DEPENDENCIES):
        assert any(f"/site-packages/{dist}" in p and ".dist-info/" in p for p in paths), dist

    # The conffile is the embedded default policy, the unit is packaging/hostd.service.
    tar = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True
    ).stdout
    for member, source in (
        ("./etc/hostd/policy.toml", REPO / "hostd" / "policy" / "training.toml"),
        (units[0], REPO / "packaging" / "hostd.service"),
    ):
        content = subprocess.run(
            ["tar", "-xOf", "-", member], input=tar, capture_output=True, check=True
        ).stdout
        assert content == source.read_bytes(), member


@pytest.fixture(scope="module")
def deb_root(deb, bookworm_root, tmp_path_factory):
    """A copy of the clean Debian 12 root with the deb installed by apt (so Depends resolve)."""
    with root_copy(bookworm_root, tmp_path_factory.mktemp("deb-root")) as root:
        shutil.copy(deb, root / "tmp" / deb.name)
        in_root(root, "apt-get", "install", "-y", "--no-install-recommends", f"/tmp/{deb.name}")
        yield root


def test_deb_installs_and_runs_on_debian_12(deb_root):
    status = in_root(deb_root, "dpkg-query", "-W", "-f=${Status} ${Version}", "hostd").stdout
    assert status == f"install ok installed {debian_version(VERSION)}"
    conffiles = in_root(deb_root, "dpkg-query", "-W", "-f=${Conffiles}", "hostd").stdout
    assert "/etc/hostd/policy.toml" in conffiles
    check_installed_hostd(deb_root)


def test_deb_unit_verifies(deb_root):
    """The installed unit passes systemd-analyze verify, its hostd being the packaged one."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("not installed: systemd (apt-get install systemd)")
    installed = next((deb_root / "lib/systemd/system").glob("hostd.service"), None) or next(
        (deb_root / "usr/lib/systemd/system").glob("hostd.service")
    )
    text = installed.read_text()
    assert "ExecStart=/usr/bin/hostd run --policy /etc/hostd/policy.toml" in text
    # verify checks that ExecStart's program exists: point it at the packaged file in the root.
    unit = deb_root / "tmp" / "hostd.service"
    unit.write_text(text.replace("/usr/bin/hostd", f"{deb_root}/opt/hostd/bin/hostd"))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_deb_remove_keeps_the_conffile_and_purge_removes_it(deb_root):
    """Last in this module: it takes the package off the shared root."""
    policy = deb_root / "etc/hostd/policy.toml"
    policy.write_text(policy.read_text() + "# edited by the admin\n")
    in_root(deb_root, "dpkg", "--remove", "hostd")
    assert not (deb_root / "opt/hostd").exists()
    assert policy.read_text().endswith("# edited by the admin\n")
    in_root(deb_root, "dpkg", "--purge", "hostd")
    assert not policy.exists()

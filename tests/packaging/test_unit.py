"""packaging/hostd.service: systemd-analyze verify, its exposure score, and what it must say.

The unit is checked as a file (the packages' copies are checked in test_deb and test_rpm):
``systemd-analyze verify`` needs ExecStart's program to exist, so a copy points it at an
installed hostd. The assertions pin what hostd needs from the sandbox (the paths it writes, the
capabilities it uses, no option that hides other processes or the host's network namespace).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.packaging]

UNIT = REPO / "packaging" / "hostd.service"
CAPABILITIES = {"CAP_SYS_NICE", "CAP_SYS_PTRACE", "CAP_DAC_OVERRIDE", "CAP_NET_ADMIN"}


def settings(text: str) -> dict[str, list[str]]:
    """Every Key=value of the unit, values of repeated keys in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def installed_hostd() -> str:
    sibling = Path(sys.executable).with_name("hostd")
    found = str(sibling) if sibling.exists() else shutil.which("hostd")
    if found is None:
        pytest.skip("no hostd console script to point ExecStart at (pip install -e .)")
    return found


@pytest.fixture
def analyze():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("not installed: systemd (apt-get install systemd)")
    return "systemd-analyze"


def test_unit_passes_systemd_analyze_verify(analyze, tmp_path):
    unit = tmp_path / "hostd.service"
    unit.write_text(UNIT.read_text().replace("/usr/bin/hostd", installed_hostd()))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_unit_exposure_is_ok(analyze, tmp_path):
    unit = tmp_path / "hostd.service"
    unit.write_text(UNIT.read_text().replace("/usr/bin/hostd", installed_hostd()))
    proc = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
    )
    if "--offline" in proc.stderr and "unrecognized" in proc.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    match = re.search(r"Overall exposure level for hostd\.service: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    # 10 is a unit without any sandboxing; systemd calls below 5.0 "OK".
    assert float(match[1]) < 5.0, proc.stdout


def test_unit_says_what_hostd_needs():
    s = settings(UNIT.read_text())
    assert s["ExecStart"] == ["/usr/bin/hostd run --policy /etc/hostd/policy.toml"]
    assert s["ExecStopPost"] == ["-/usr/bin/hostd restore"]
    assert s["Restart"] == ["on-failure"]
    assert s["KillSignal"] == ["SIGTERM"]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["StateDirectory"] == ["hostd"]
    assert s["RuntimeDirectory"] == ["hostd"]
    assert s["ProtectHome"] == ["yes"]
    assert s["PrivateTmp"] == ["yes"]
    assert set(" ".join(s["CapabilityBoundingSet"]).split()) == CAPABILITIES
    writable = {p.lstrip("-") for v in s["ReadWritePaths"] for p in v.split()}
    assert writable >= {
        "/var/lib/hostd",
        "/run/hostd",
        "/sys/fs/cgroup",
        "/proc/irq",
        "/sys/devices/system/cpu",
    }
    assert "/dev/cpu_dma_latency rw" in s["DeviceAllow"]
    # Options that would hide other processes, the host's devices or its network namespace,
    # or forbid the real-time scheduling hostd hands out.
    for key in (
        "ProtectProc",
        "ProcSubset",
        "PrivateDevices",
        "PrivateNetwork",
        "PrivateUsers",
        "RestrictRealtime",
        "ProtectKernelTunables",
        "ProtectControlGroups",
    ):
        assert key not in s, key
    assert s["WantedBy"] == ["multi-user.target"]
    # The agent's file limit as the agent wants it (issue 44.2), and the exporter's sockets.
    from hostd.agent.loop import FILES_WANTED

    assert s["LimitNOFILE"] == [str(FILES_WANTED)]
    assert {"AF_INET", "AF_INET6"} <= set(" ".join(s["RestrictAddressFamilies"]).split())

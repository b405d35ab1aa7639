"""A hostile local user gains nothing (root runs the test, the user is ``nobody``): a file named
like a GPU device in a mount namespace of its own is not a GPU to hostd, because hostd asks the
kernel which device an fd is (its major in /proc/devices), never the path the process used."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else None

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: plays another user"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)"),
]

# In a user and mount namespace of its own (no privilege on the host), nobody puts a tmpfs on
# /dev, makes /dev/nvidia0 a plain file and /dev/nvidia1 the null device, and holds both open.
FAKE_GPU = (
    "n=$(mktemp) && mount --bind /dev/null $n && "
    "mount -t tmpfs none /dev && touch /dev/nvidia0 /dev/nvidiactl /dev/nvidia1 && "
    "mount --bind $n /dev/nvidia1 && "
    "exec 3</dev/nvidia0 4</dev/nvidiactl 5</dev/nvidia1 && echo ready && exec sleep 120"
)


def _fds(pid: int) -> list[str]:
    found = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except FileNotFoundError:  # closed meanwhile (an exec closes the close-on-exec ones)
            continue
    return sorted(found)


def _start(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        pytest.skip(f"cannot build the fake device here: {err.strip()[:200]}")
    return proc


def _wait_exec(proc: subprocess.Popen) -> None:
    """Until the shell has become ``sleep``, holding the fake devices (the shell holds them
    before its exec too, with fds of its own that the exec closes)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        if comm == "sleep" and "/dev/nvidia0" in _fds(proc.pid):
            return
        time.sleep(0.05)


@pytest.mark.parametrize("who", ["nobody in a user namespace", "root in a mount namespace"])
def test_a_fake_gpu_device_gains_no_protection(who):
    if who.startswith("nobody"):
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                "unshare", "-Urm", "sh", "-c", FAKE_GPU]  # fmt: skip
    else:
        argv = ["unshare", "-m", "sh", "-c", FAKE_GPU]
    proc = _start(argv)
    try:
        _wait_exec(proc)
        assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"} <= set(_fds(proc.pid))
        out = subprocess.run([HOSTD, "explain", str(proc.pid)], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "GPU devices: none" in out.stdout, out.stdout
        assert "-> layer rest" in out.stdout, out.stdout
    finally:
        proc.kill()
        proc.wait()


def test_a_real_device_is_named_by_its_numbers_not_its_path():
    """The null device opened as "/dev/nvidia1" is the null device (1, 3) to hostd."""
    from hostd.host import Host
    from hostd.tasks import _gpu_devices

    host = Host()
    proc = _start(["unshare", "-m", "sh", "-c", FAKE_GPU])
    try:
        _wait_exec(proc)
        assert host.char_device(f"proc/{proc.pid}/fd/5") == (1, 3)  # the null device
        assert _gpu_devices(host, proc.pid) == ()
    finally:
        proc.kill()
        proc.wait()

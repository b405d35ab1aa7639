"""The only door to the kernel: ``Host(root)`` reads /proc, /sys and cgroupfs below ``root``.

Every other module asks a ``Host`` for kernel state and never names /proc or /sys itself, so
everything above this layer runs unchanged against a fixture tree captured from a real machine
(``tests/fixtures/hosts/<name>/``, made by ``tools/capture_host.py``). Reads use ``os.open`` +
``os.read`` (cheaper than ``open()``, see FACTS.md) and turn errno values into the domain errors
of ``hostd.host.errors``; a file that vanished reads as ``None``, never as an exception.

Callers: ``hostd.topology`` (CPUs, caches, NUMA, PCI, IRQs, cpufreq), ``hostd.tasks`` (thread
snapshots), the CLI (``Host()`` for the live machine, ``Host(path)`` for ``--root``).

The class is built in parts: ``hostd.host.files`` (``HostFiles``: reading, listing and writing
files below the root), ``hostd.host.threads`` (``HostThreads``: threads and processes); this
module adds the constructor, NVML and the small derived lookups.
"""

from __future__ import annotations

import os
import re

from hostd.host.errors import Gone, HostError, NotPermitted, Unchangeable
from hostd.host.nvml import NvmlInfo, read_nvml, read_utilization
from hostd.host.syscalls import ThreadCalls
from hostd.host.threads import HostThreads

__all__ = ["Gone", "Host", "HostError", "NotPermitted", "NvmlInfo", "Unchangeable"]

_PCI_ADDR = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class Host(HostThreads):
    """Kernel state below ``root`` ("/" for the live machine, a folder for a fixture tree)."""

    def __init__(
        self, root: str | os.PathLike[str] = "/", calls: ThreadCalls | None = None
    ) -> None:
        """``calls``: the per-thread system calls to use instead of the kernel's (a fake, so
        that a fixture tree has threads to change: tests/fakes.py)."""
        root = os.fspath(root)
        self._calls = calls
        self.root = root if root == "/" else os.path.abspath(root)
        self._prefix = "/" if self.root == "/" else self.root.rstrip("/") + "/"
        self._nvml: tuple[NvmlInfo | None, str] | None = None
        self._known_start: dict[int, int] | None = None
        self._pods: dict[str, tuple[str, str, bool]] = {}  # container id -> its pod (pod_of)
        self._host_ns: dict[str, int] = {}  # kind -> the host's namespace (host_namespace)
        # The kernel's machine name (its system call numbers); a fixture tree's is x86_64.
        self.machine = os.uname().machine if self.root == "/" else "x86_64"

    # -- small derived lookups ---------------------------------------------------------------
    def pci_address_of(self, rel: str) -> str | None:
        """The PCI address a sysfs device link (e.g. ``sys/class/net/eth0/device``) leads to.

        Some devices hang below their PCI function (virtio-net: ``.../0000:00:03.0/virtio2``),
        so the last path component that looks like a PCI address wins.
        """
        if not self.exists(rel):
            return None
        real = os.path.realpath(self._prefix + rel)
        for part in reversed(real.split("/")):
            if _PCI_ADDR.match(part):
                return part
        return None

    def nvml(self, fresh: bool = False) -> tuple[NvmlInfo | None, str]:
        """NVML's view (GPUs and their processes) and a reason when it is unavailable.

        Live hosts ask the NVIDIA driver through pynvml; fixture trees may carry ``nvml.json``.
        Cached for the life of this Host, unless ``fresh`` (the agent's full pass: GPU
        processes come and go).
        """
        if self._nvml is None or fresh:
            self._nvml = read_nvml(None if self.live else self.path("nvml.json"))
        return self._nvml

    def gpu_utilization(self) -> dict[int, float]:
        """Each GPU's utilisation now, by NVML index (0..1); {} where NVML cannot say."""
        return read_utilization(None if self.live else self.path("nvml.json"))

    def __repr__(self) -> str:
        return f"Host({self.root!r})"

"""Device events (uevents) through pyudev: CPUs going offline or online, PCI and network devices
coming and going. The agent re-plans on each; ``hostd doctor`` reports which source is used.

``source``: "udev" where udevd runs (its events come after udev's rules have run), "kernel"
where it does not (containers, minimal hosts: the kernel's own uevents, FACTS.md). Called by
``hostd.agent``; pyudev needs ``libudev.so.1``, and its absence means no device events (the
slow rescan timer still notices a changed topology).
"""

from __future__ import annotations

from typing import NamedTuple

from hostd.host import Host

SUBSYSTEMS = ("cpu", "pci", "net")


class DeviceEvent(NamedTuple):
    action: str  # "add", "remove", "online", "offline", "change", ...
    subsystem: str
    name: str  # the device's sysfs name: "cpu3", "0000:17:00.0", "eth0"


class DeviceEvents:
    """A non-blocking uevent monitor: ``fileno()`` for select, ``read()`` drains it."""

    def __init__(self, host: Host) -> None:
        import pyudev  # late: a host without libudev still runs hostd

        self.source = "udev" if host.exists("run/udev/control") else "kernel"
        self._monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=self.source)
        for subsystem in SUBSYSTEMS:
            self._monitor.filter_by(subsystem)
        self._monitor.start()

    def fileno(self) -> int:
        return self._monitor.fileno()

    def read(self) -> list[DeviceEvent]:
        out = []
        while True:
            device = self._monitor.poll(timeout=0)
            if device is None:
                return out
            if device.subsystem in SUBSYSTEMS:
                out.append(DeviceEvent(device.action or "", device.subsystem, device.sys_name))

    def close(self) -> None:
        # pyudev closes the socket when the monitor is collected; drop our reference.
        self._monitor = None

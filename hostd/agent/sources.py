"""What wakes the agent: the proc connector, device events, signals and the timers' timeout.

``Sources.open`` subscribes to thread events (``hostd.host.connector``: fork, exec, comm, exit)
unless the policy says ``[agent] source = "poll"`` or the kernel refuses (a container without
the host's pid namespace), and to device events (``hostd.host.uevents``: CPUs, PCI and network
devices coming and going) where pyudev can. Signals set a flag and write to a pipe, so that
``wait`` (one ``select`` over every source) returns at once: SIGTERM/SIGINT stop, SIGHUP
reloads the policy, SIGUSR1 asks for a full pass (``hostd enable``/``disable``). ``kind`` and
``detail`` say what is used, for the log and ``hostd status``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
from typing import Protocol

from hostd.host import Host
from hostd.host.connector import DEFAULT_RCVBUF, Event, Overflow, ProcConnector
from hostd.host.uevents import DeviceEvent, DeviceEvents
from hostd.policy import Policy

log = logging.getLogger("hostd")
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


class Connector(Protocol):
    """What the loop needs of a thread-event source (``ProcConnector``; a fake in tests)."""

    def fileno(self) -> int: ...
    def read(self, limit: int) -> list[Event | Overflow]: ...
    def mute_renames(self, mute: bool) -> bool: ...
    def close(self) -> None: ...


class Devices(Protocol):
    def fileno(self) -> int: ...
    def read(self) -> list[DeviceEvent]: ...
    def close(self) -> None: ...


class Sources:
    def __init__(self) -> None:
        self.connector: Connector | None = None
        self.devices: Devices | None = None
        self.kind = "poll"  # "events": the proc connector feeds event passes
        self.detail = ""
        self.stop = self.reload = self.poke = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def open(self, host: Host, policy: Policy) -> None:
        """Subscribe before the first full pass, so that nothing falls in between."""
        if policy.event_source != "poll":
            try:
                # HOSTD_CONNECTOR_RCVBUF: a smaller buffer, to provoke overflows in tests.
                rcvbuf = int(os.environ.get("HOSTD_CONNECTOR_RCVBUF", DEFAULT_RCVBUF))
                connector = ProcConnector(rcvbuf=rcvbuf)
                self.connector, self.kind = connector, "events"
                self.detail = (
                    f"proc connector (receive buffer {connector.rcvbuf // 1024} KiB, "
                    f"event filter {'on' if connector.filtered else 'off'})"
                )
            except OSError as exc:
                self.detail = f"proc connector unavailable ({exc.strerror or exc})"
                if policy.event_source == "events":
                    log.warning("source events: %s; polling instead", self.detail)
        else:
            self.detail = "[agent] source = poll"
        if self.kind == "poll":
            self.detail += f"; polling /proc every {policy.interval:g} s"
        try:
            self.devices = DeviceEvents(host)
            self.detail += f"; device events from {self.devices.source}"
        except Exception as exc:  # no libudev, no netlink: the rescan timer still catches up
            self.detail += f"; no device events ({exc})"
        log.info("source %s: %s", self.kind, self.detail)

    def close(self) -> None:
        for name in ("connector", "devices"):
            source = getattr(self, name)
            if source is not None:
                source.close()
                setattr(self, name, None)

    def catch_signals(self) -> None:
        for sig in SIGNALS:
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, _frame: object = None) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stop = True
        elif signum == signal.SIGHUP:
            self.reload = True
        elif signum == signal.SIGUSR1:
            self.poke = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def wait(self, timeout: float) -> tuple[bool, bool]:
        """Wait up to ``timeout`` seconds; (thread events ready, device events ready)."""
        fds = [self._wake_r] + [s.fileno() for s in (self.connector, self.devices) if s]
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._wake_r in ready:
            while True:  # drain the wake-ups; the flags say what they were
                try:
                    if not os.read(self._wake_r, 64):
                        break
                except BlockingIOError:
                    break
        return (
            self.connector is not None and self.connector.fileno() in ready,
            self.devices is not None and self.devices.fileno() in ready,
        )

    def events_waiting(self) -> bool:
        if self.connector is None:
            return False
        ready, _, _ = select.select([self.connector.fileno()], [], [], 0)
        return bool(ready)

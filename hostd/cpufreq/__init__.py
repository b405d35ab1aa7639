"""cpufreq knobs per CPU: governor, frequency floor and energy-performance preference.

``cpu/N/scaling_governor`` (a name), ``cpu/N/scaling_min_freq`` (kHz, as an int) and
``cpu/N/energy_performance_preference`` (a name), per Documentation/admin-guide/pm/cpufreq.rst
and intel_pstate.rst. Tested against fixture trees: the CI machine has no cpufreq driver.
``hold_cpu_dma_latency`` keeps deep C-states off while the agent runs ([agent]
cpu_dma_latency_us).
"""

from __future__ import annotations

import errno
import os
import struct

from hostd import knobs
from hostd.host import Gone, Host, paths


def _path(key: str) -> str:
    k = knobs.parse_key(key)
    return paths.cpufreq(int(k.ident), k.name)


def _read(host: Host, key: str) -> object:
    text = host.read(_path(key))
    if text is None:
        raise Gone(errno.ENOENT, key, "no such cpufreq file")
    value = text.strip()
    return int(value) if key.endswith("scaling_min_freq") else value


def _write(host: Host, key: str, value: object) -> None:
    host.write(_path(key), str(value))


def hold_cpu_dma_latency(host: Host, microseconds: int) -> int:
    """Limit C-state exit latency for as long as the returned fd stays open (PM QoS,
    Documentation/power/pm_qos_interface.rst). Closing it, or the process dying, lifts the
    limit: nothing to journal."""
    fd = os.open(host.path(paths.CPU_DMA_LATENCY), os.O_RDWR | os.O_CLOEXEC)
    try:
        os.write(fd, struct.pack("i", microseconds))
    except OSError:
        os.close(fd)
        raise
    return fd


def _spec(name: str, noun: str, order: int, check: str) -> knobs.Spec:
    return knobs.Spec(
        name,
        f"cpu/N/{name}",
        _read,
        _write,
        knobs.CHECKS[check],
        noun=noun,
        apply_order=order,  # the governor before its floor and EPP
        host_wide=True,
        needs="cpufreq",
    )


GOVERNOR = _spec("scaling_governor", "CPU frequency governor", 6, "word")
MIN_FREQ = _spec("scaling_min_freq", "CPU frequency floor", 7, "freq")
EPP = _spec("energy_performance_preference", "CPU energy-performance preference", 8, "word")

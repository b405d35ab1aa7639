"""IRQ affinity knob (``irq/N/smp_affinity_list``), per core-api/irq/irq-affinity.rst.

Kernel-managed IRQs (multi-queue block and NIC drivers) refuse: EIO on most kernels, EPERM on
some (the CI machine's virtio-blk). Both are reported as ``Unchangeable`` and remembered by the
reconciler, never retried.
"""

from __future__ import annotations

import errno
import os

from hostd import knobs
from hostd.host import Gone, Host, NotPermitted, Unchangeable, paths
from hostd.model.cpus import format_cpulist, parse_cpulist


def _irq(key: str) -> int:
    return int(knobs.parse_key(key).ident)


def _read(host: Host, key: str) -> str:
    text = host.read(paths.irq(_irq(key), "smp_affinity_list"))
    if text is None:
        raise Gone(errno.ENOENT, key, "no such IRQ")
    return format_cpulist(parse_cpulist(text))


def _write(host: Host, key: str, value: object) -> None:
    try:
        host.write(paths.irq(_irq(key), "smp_affinity_list"), str(value))
    except NotPermitted as exc:
        if host.live and os.geteuid() == 0:
            # Root was refused: a managed IRQ (some kernels say EPERM instead of EIO).
            raise Unchangeable(exc.errno or errno.EPERM, key, "kernel-managed IRQ") from None
        raise


IRQ = knobs.Spec(
    "irq",
    "irq/N/smp_affinity_list",
    _read,
    _write,
    knobs.CHECKS["cpulist"],
    noun="IRQ CPU affinity",
    kept_by_kernel=True,  # (an IRQ whose every CPU goes offline is moved: then left as is)
    apply_order=5,
    host_wide=True,
    needs="irqs",
)

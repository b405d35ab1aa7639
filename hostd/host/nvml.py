"""NVML (the NVIDIA driver's management library, through ``pynvml``) as a plain snapshot.

Called only by ``Host.nvml()``. On a live host it asks the driver for its GPUs and their
compute/graphics processes; on a fixture tree it reads the same snapshot from ``nvml.json``
(written by ``tools/capture_host.py``). Any NVML failure (no library, no driver, no GPU) is a
reason string, never an exception: GPU detection then falls back to sysfs PCI.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NvmlGpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str  # normalised to sysfs form: "0000:18:00.0"
    minor: int | None  # /dev/nvidiaN


@dataclass(frozen=True, slots=True)
class NvmlInfo:
    driver_version: str
    gpus: tuple[NvmlGpu, ...]
    processes: tuple[tuple[int, int], ...] = field(default=())  # (pid, gpu index)

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(pid for pid, _ in self.processes)

    def to_json(self) -> dict:
        return {
            "driver_version": self.driver_version,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "pci_bus_id": g.pci_bus_id,
                    "minor": g.minor,
                }
                for g in self.gpus
            ],
            "processes": [{"pid": pid, "gpu": gpu} for pid, gpu in self.processes],
        }


def normalise_bus_id(bus_id: str) -> str:
    """NVML says "00000000:18:00.0"; sysfs says "0000:18:00.0"."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}" if rest else bus_id


def from_json(data: dict) -> NvmlInfo:
    gpus = tuple(
        NvmlGpu(
            index=int(g["index"]),
            name=str(g.get("name", "")),
            uuid=str(g.get("uuid", "")),
            pci_bus_id=normalise_bus_id(str(g["pci_bus_id"])),
            minor=None if g.get("minor") is None else int(g["minor"]),
        )
        for g in data.get("gpus", [])
    )
    procs = tuple((int(p["pid"]), int(p["gpu"])) for p in data.get("processes", []))
    return NvmlInfo(str(data.get("driver_version", "")), gpus, procs)


def read_utilization(fixture_path: str | None) -> dict[int, float]:
    """Each GPU's utilisation now (GPU index -> the fraction of the last sample period in which
    a kernel ran, NVML's ``nvmlDeviceGetUtilizationRates``); {} where NVML cannot say. A fixture
    tree's ``nvml.json`` may carry ``"utilization": {"0": 0.93}``."""
    if fixture_path is not None:
        try:
            with open(fixture_path, encoding="utf-8") as fh:
                got = json.load(fh).get("utilization") or {}
            return {int(k): float(v) for k, v in got.items()}
        except (OSError, ValueError, AttributeError, TypeError):
            return {}
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no library, no driver
        return {}
    try:
        out = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            with contextlib.suppress(pynvml.NVMLError):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                out[index] = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        return out
    except Exception:
        return {}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _query_live() -> NvmlInfo:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        gpus = []
        procs: set[tuple[int, int]] = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except pynvml.NVMLError:
                minor = None
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            gpus.append(
                NvmlGpu(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=normalise_bus_id(_text(pci.busId)),
                    minor=minor,
                )
            )
            for getter in (
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                with contextlib.suppress(pynvml.NVMLError):
                    procs.update((int(p.pid), index) for p in getter(handle))
        return NvmlInfo(
            _text(pynvml.nvmlSystemGetDriverVersion()), tuple(gpus), tuple(sorted(procs))
        )
    finally:
        pynvml.nvmlShutdown()


def read_nvml(fixture_path: str | None) -> tuple[NvmlInfo | None, str]:
    """(snapshot, "") or (None, why not). ``fixture_path`` None means: ask the live driver."""
    if fixture_path is not None:
        try:
            with open(fixture_path, encoding="utf-8") as fh:
                return from_json(json.load(fh)), ""
        except FileNotFoundError:
            return None, "no nvml.json in this fixture tree"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"bad nvml.json: {exc}"
    try:
        return _query_live(), ""
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    except Exception as exc:  # pynvml raises NVMLError subclasses, and OSError from ctypes
        return None, f"NVML unavailable: {type(exc).__name__}: {exc}"

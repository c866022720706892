"""Energy sources behind one small interface.

A source measures *windows*: ``begin()`` at the window's start edge, ``end()`` at its end edge,
returning one :class:`GpuReading` per GPU it measured. Where nothing could be measured it returns
readings whose ``energy_mj`` is ``None`` and whose ``status`` says why: never 0.

Counting rule (documented in the README): every rank reports the GPUs it measured, keyed by UUID;
aggregation sums *distinct* UUIDs per window, so a GPU seen by two ranks counts once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

STATUS_MEASURED = "measured"
STATUS_UNAVAILABLE = "unavailable"
# The counter moved less often than the window was long: the value may read 0 J or one tick.
STATUS_SHORT_WINDOW = "short-window"


@dataclass
class GpuReading:
    """Energy of one GPU over one window."""

    gpu_uuid: str | None
    gpu_index: int | None
    gpu_pci_bus_id: str | None
    gpu_name: str | None
    energy_mj: float | None
    status: str
    method: str
    detail: str = ""


class EnergySource:
    """Base class: one instance per rank, reused for every window of a job."""

    name = "base"

    def begin(self) -> None:
        raise NotImplementedError

    def end(self) -> list[GpuReading]:
        raise NotImplementedError

    def close(self) -> None:
        """Release the library handle (idempotent)."""


class UnavailableSource(EnergySource):
    """Used where no GPU energy can be read; every window says why."""

    name = "none"

    def __init__(self, reason: str, method: str = "none"):
        self.reason = reason
        self.method = method

    def begin(self) -> None:
        pass

    def end(self) -> list[GpuReading]:
        return [
            GpuReading(None, None, None, None, None, STATUS_UNAVAILABLE, self.method, self.reason)
        ]


class CpuTime:
    """Process CPU time (user + system seconds) of this rank: measured, not an energy figure."""

    method = "os.times"

    def __init__(self):
        self._start = None

    @staticmethod
    def _now() -> float:
        t = os.times()
        return t.user + t.system

    def begin(self) -> None:
        self._start = self._now()

    def end(self) -> float:
        return self._now() - self._start


def wall_ns() -> int:
    """Wall-clock time in ns since the epoch (window bounds must line up across ranks and hosts)."""
    return time.time_ns()


def make_source(kind: str, device: str, gpu_uuids: list[str]) -> EnergySource:
    """Factory: the source for ``kind`` on a rank that computes on ``device``.

    Args:
        kind: ``auto``, ``nvml`` or ``none`` (config key measurement.energy_source).
        device: the torch device string the rank computes on (``cpu``, ``cuda:0``).
        gpu_uuids: the GPUs this rank measures, by UUID (``GPU-…``).
    """
    if kind == "none":
        return UnavailableSource("energy measurement disabled (measurement.energy_source: none)")
    if not device.startswith("cuda") or not gpu_uuids:
        if kind == "nvml":
            raise RuntimeError(
                f"measurement.energy_source is nvml but this rank computes on {device!r} "
                "with no GPU; use auto or none, or run on a GPU"
            )
        return UnavailableSource(f"no GPU in use (device={device})", method="nvml")
    from energysweep.energy.nvml import NvmlSource

    try:
        return NvmlSource(gpu_uuids)
    except Exception as exc:  # NVMLError subclasses: missing driver, no permission, ...
        if kind == "nvml":
            raise
        return UnavailableSource(f"NVML unavailable: {type(exc).__name__}: {exc}", method="nvml")

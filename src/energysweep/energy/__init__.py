"""Energy sources behind one small interface.

A GPU source measures *windows*: ``begin()`` at the window's start edge, ``end()`` at its end
edge, returning one :class:`GpuReading` per GPU it measured. Where nothing could be measured it
returns readings whose ``energy_mj`` is ``None`` and whose ``status`` says why: never 0.

Sources (config key ``measurement.energy_source``):
- ``nvml``: NVML's cumulative energy counter per GPU, resolved by UUID (energy/nvml.py);
- ``zeus``: Zeus's ``ZeusMonitor`` windows for the same GPUs (energy/zeus.py);
- ``cross-check``: both for the same window; NVML in ``energy_mj``, Zeus in ``energy_mj_zeus``;
- ``auto``: NVML where a GPU is in use, otherwise unavailable (recorded, never 0);
- ``none``: nothing measured.
Host energy (RAPL package + DRAM, energy/rapl.py) is a second, per-node source chosen by
``measurement.host_energy_source`` and read by local rank 0 only.

Counting rule (README, Methodology): every rank reports the GPUs it measured, keyed by UUID;
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
# Zeus columns of rows whose source is not cross-check (nothing was asked of Zeus).
STATUS_NOT_REQUESTED = "not-requested"
# Host energy columns of ranks other than local rank 0 (the host is read once per node).
STATUS_NOT_READ = "not-read"
# Job-level measurements (idle baseline, host energy) that a scenario does not take.
STATUS_NOT_MEASURED = "not-measured"

GPU_SOURCES = ("auto", "nvml", "zeus", "cross-check", "none")


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
    # Cross-check only: Zeus's figure for the same GPU and window.
    energy_mj_zeus: float | None = None
    zeus_status: str = STATUS_NOT_REQUESTED
    # Which source produced the reading (the shard column energy_source).
    source: str = "none"


class SourceUnavailable(RuntimeError):
    """A source cannot measure here (no GPU, no driver, unsupported setup); the text says why."""


class EnergySource:
    """Base class: one instance per rank, reused for every window of a job."""

    name = "base"
    available = True

    def begin(self) -> None:
        raise NotImplementedError

    def end(self) -> list[GpuReading]:
        raise NotImplementedError

    def close(self) -> None:
        """Release the library handle (idempotent)."""


class UnavailableSource(EnergySource):
    """Used where no GPU energy can be read; every window says why."""

    name = "none"
    available = False

    def __init__(self, reason: str, method: str = "none"):
        self.reason = reason
        self.method = method

    def begin(self) -> None:
        pass

    def end(self) -> list[GpuReading]:
        return [
            GpuReading(None, None, None, None, None, STATUS_UNAVAILABLE, self.method, self.reason)
        ]


class CrossCheckSource(EnergySource):
    """NVML and Zeus around the same window edges; NVML is the primary figure.

    The windows nest (NVML begins first and ends last), so the two differ only by the few
    microseconds of the inner reads.
    """

    name = "cross-check"

    def __init__(self, primary: EnergySource, zeus: EnergySource):
        self.primary = primary
        self.zeus = zeus

    def begin(self) -> None:
        self.primary.begin()
        self.zeus.begin()

    def end(self) -> list[GpuReading]:
        by_uuid = {r.gpu_uuid: r for r in self.zeus.end()}
        readings = self.primary.end()
        for r in readings:
            z = by_uuid.get(r.gpu_uuid)
            if z is None:
                r.zeus_status = STATUS_UNAVAILABLE
                r.detail = "; ".join(filter(None, [r.detail, "zeus did not report this GPU"]))
            else:
                r.energy_mj_zeus = z.energy_mj
                r.zeus_status = z.status
            r.source = self.name
        return readings

    def close(self) -> None:
        self.zeus.close()
        self.primary.close()


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


def _nvml(gpu_uuids: list[str]) -> EnergySource:
    from energysweep.energy.nvml import NvmlSource

    return NvmlSource(gpu_uuids)


def _zeus(gpu_uuids: list[str]) -> EnergySource:
    from energysweep.energy.zeus import ZeusSource

    return ZeusSource(gpu_uuids)


def make_source(kind: str, device: str, gpu_uuids: list[str]) -> EnergySource:
    """Factory: the GPU energy source for ``kind`` on a rank that computes on ``device``.

    An explicitly requested source that cannot work raises (the config asked for it); ``auto``
    falls back to an :class:`UnavailableSource` that records why in every row.

    Args:
        kind: one of :data:`GPU_SOURCES` (config key measurement.energy_source).
        device: the torch device string the rank computes on (``cpu``, ``cuda:0``).
        gpu_uuids: the GPUs this rank measures, by UUID (``GPU-…``).
    """
    if kind not in GPU_SOURCES:
        raise ValueError(f"measurement.energy_source {kind!r}: expected one of {GPU_SOURCES}")
    if kind == "none":
        return UnavailableSource("energy measurement disabled (measurement.energy_source: none)")
    if not device.startswith("cuda") or not gpu_uuids:
        if kind != "auto":
            raise RuntimeError(
                f"measurement.energy_source is {kind} but this rank computes on {device!r} "
                "with no GPU; use auto or none, or run on a GPU"
            )
        return UnavailableSource(f"no GPU in use (device={device})", method="nvml")
    if "MIG-" in (os.environ.get("CUDA_VISIBLE_DEVICES") or ""):
        reason = "CUDA_VISIBLE_DEVICES names MIG slices: a MIG slice has no energy counter"
        if kind != "auto":
            raise SourceUnavailable(reason)
        return UnavailableSource(reason, method="nvml")
    if kind == "zeus":
        return _zeus(gpu_uuids)
    if kind == "cross-check":
        return CrossCheckSource(_nvml(gpu_uuids), _zeus(gpu_uuids))
    try:
        return _nvml(gpu_uuids)
    except Exception as exc:  # NVMLError subclasses: missing driver, no permission, ...
        if kind == "nvml":
            raise
        return UnavailableSource(f"NVML unavailable: {type(exc).__name__}: {exc}", method="nvml")

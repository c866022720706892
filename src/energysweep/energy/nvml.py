"""GPU energy from NVML's cumulative energy counter, read through :mod:`energysweep.hw.nvml`.

Facts this relies on (see the README's methodology section):
- ``nvmlDeviceGetTotalEnergyConsumption`` is mJ since the driver loaded (Volta and newer); it
  updates about every 100 ms on datacenter GPUs, so a shorter window is flagged ``short-window``.
- GPUs are resolved by UUID, never by CUDA index (NVML numbers them in PCI bus order).
- A counter that goes backwards (driver reload) is an error, not a negative energy.
"""

from __future__ import annotations

from energysweep.energy.base import (
    EnergySource,
    GpuReading,
    wall_ns,
)
from energysweep.hw import nvml as hw_nvml
from energysweep.tables.status import EnergyStatus

METHOD = "nvml-total-energy-counter"
# Below this window length the counter may not have ticked (datacenter update period ~100 ms).
COUNTER_UPDATE_PERIOD_NS = 100_000_000


class CounterWentBackwards(RuntimeError):
    """The energy counter decreased inside a window (driver reload or a wrong device)."""


def window_reading(
    gpu: dict, energy_mj: float, duration_ns: int, method: str, source: str
) -> GpuReading:
    """The reading of one GPU (a dict with uuid, index, pci, name) over a window of
    ``duration_ns``; flagged short-window when shorter than the counter's update period."""
    short = duration_ns < COUNTER_UPDATE_PERIOD_NS
    return GpuReading(
        gpu["uuid"],
        gpu["index"],
        gpu["pci"],
        gpu["name"],
        energy_mj,
        EnergyStatus.SHORT_WINDOW if short else EnergyStatus.MEASURED,
        method,
        f"window {duration_ns / 1e6:.1f} ms < counter update period" if short else "",
        source=source,
    )


class NvmlSource(EnergySource[list[GpuReading]]):
    """Energy counter deltas, one reading per GPU (by UUID)."""

    name = "nvml"

    def __init__(self, gpu_uuids: list[str]):
        hw_nvml.init()
        self._open = True
        self._gpus = []
        for uuid in gpu_uuids:
            handle = hw_nvml.handle_by_uuid(uuid)
            self._gpus.append({**hw_nvml.identity(handle), "handle": handle})
        # A GPU without the counter (pre-Volta) fails here, at setup, not in the first window.
        self._read()
        self._start = None
        self._start_ns = None

    def _read(self) -> list[int]:
        return [hw_nvml.energy_mj(g["handle"]) for g in self._gpus]

    def begin(self) -> None:
        self._start_ns = wall_ns()
        self._start = self._read()

    def end(self) -> list[GpuReading]:
        stop = self._read()
        duration = wall_ns() - self._start_ns
        readings = []
        for g, a, b in zip(self._gpus, self._start, stop, strict=True):
            if b < a:
                raise CounterWentBackwards(
                    f"NVML energy counter of {g['uuid']} went from {a} to {b} mJ inside a window "
                    "(driver reload?); the window is not usable"
                )
            readings.append(window_reading(g, float(b - a), duration, METHOD, self.name))
        return readings

    def close(self) -> None:
        if self._open:
            hw_nvml.shutdown()
            self._open = False

"""GPUs a source cannot reach from this process (a multi-node engine replica's other nodes).

They are reported as unavailable readings next to the ones measured, so the window's energy
sums to null rather than to a partial total presented as the whole.
"""

from __future__ import annotations

from energysweep.energy.base import EnergySource, GpuReading
from energysweep.tables.status import EnergyStatus


class WithUnreadable(EnergySource[list[GpuReading]]):
    """An energy source plus one unavailable reading per GPU it cannot reach (other nodes)."""

    def __init__(self, inner, missing: int, reason: str):
        self.inner = inner
        self.missing = missing
        self.reason = reason
        self.name = getattr(inner, "name", "nvml")

    def prepare(self) -> None:
        self.inner.prepare()

    def begin(self) -> None:
        self.inner.begin()

    def end(self) -> list[GpuReading]:
        method = getattr(self.inner, "name", "nvml")
        extra = [
            GpuReading(None, None, None, None, None, EnergyStatus.UNAVAILABLE, method, self.reason)
            for _ in range(self.missing)
        ]
        return self.inner.end() + extra

    def close(self) -> None:
        self.inner.close()

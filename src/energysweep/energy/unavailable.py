"""The GPU source where no GPU energy can be read: every window says why (null, never 0)."""

from __future__ import annotations

from energysweep.energy.base import EnergySource, GpuReading
from energysweep.tables.status import EnergyStatus


class UnavailableSource(EnergySource[list[GpuReading]]):
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
            GpuReading(
                None, None, None, None, None, EnergyStatus.UNAVAILABLE, self.method, self.reason
            )
        ]

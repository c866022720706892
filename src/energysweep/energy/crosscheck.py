"""NVML and Zeus over the same window (``measurement.energy_source: cross-check``)."""

from __future__ import annotations

from energysweep.energy.base import EnergySource, GpuReading
from energysweep.tables.status import EnergyStatus


class CrossCheckSource(EnergySource[list[GpuReading]]):
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
                r.zeus_status = EnergyStatus.UNAVAILABLE
                r.detail = "; ".join(filter(None, [r.detail, "zeus did not report this GPU"]))
            else:
                r.energy_mj_zeus = z.energy_mj
                r.zeus_status = z.status
            r.source = self.name
        return readings

    def close(self) -> None:
        self.zeus.close()
        self.primary.close()

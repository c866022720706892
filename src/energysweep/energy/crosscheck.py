"""NVML and Zeus over the same window (``measurement.energy_source: cross-check``)."""

from __future__ import annotations

from energysweep.energy.base import EnergySource, GpuReading
from energysweep.tables.status import EnergyStatus


class CrossCheckSource(EnergySource[list[GpuReading]]):
    """NVML and Zeus around the same window edges; NVML is the primary figure.

    The windows nest (NVML begins first and ends last). NVML aligns its edges to counter
    refreshes (energysweep.energy.ticks) and Zeus reads at its edges, so on a load step the two
    differ by up to a refresh period's energy at each edge (Zeus's misplacement).
    """

    name = "cross-check"

    def __init__(self, primary: EnergySource, zeus: EnergySource):
        self.primary = primary
        self.zeus = zeus

    def prepare(self) -> None:
        self.primary.prepare()

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

    def load_goes_on_after_end(self) -> None:
        self.primary.load_goes_on_after_end()

    def close(self) -> None:
        self.zeus.close()
        self.primary.close()

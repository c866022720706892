"""NVML and Zeus over the same window (``measurement.energy_source: cross-check``)."""

from __future__ import annotations

import energysweep.energy.nvml as nvml
from energysweep.energy.base import EnergySource, GpuReading
from energysweep.tables.status import EnergyStatus

# Zeus and NVML agree within this, beyond Zeus's edge misplacement (zeus_ratios).
ZEUS_AGREEMENT = 0.05


def zeus_ratios(
    readings: list[GpuReading], window_s: float
) -> tuple[dict[str | None, float | None], float]:
    """Zeus / NVML energy per GPU of a cross-check window of ``window_s`` (None where either is
    missing), and how far from 1 they may be. Zeus reads the counter at its edges, each up to
    a refresh period after the refresh it holds, where NVML's edges are aligned: over the window
    the two differ by up to a period's share of it even at steady power (CI run 106: 0.89-0.93
    over 1 s), on top of :data:`ZEUS_AGREEMENT`."""
    ratios = {
        r.gpu_uuid: (
            r.energy_mj_zeus / r.energy_mj if r.energy_mj_zeus is not None and r.energy_mj else None
        )
        for r in readings
    }
    return ratios, ZEUS_AGREEMENT + nvml.COUNTER_UPDATE_PERIOD_NS / 1e9 / window_s


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

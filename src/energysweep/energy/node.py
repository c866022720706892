"""Node energy over a window (the ladder's node rung), from Slurm's energy accounting.

Read by global rank 0 only: Slurm's step figure already sums the step's nodes, so every other
rank's rows say ``not-read``. Where the site gathers no node energy, or the job runs outside
Slurm, every window is ``unavailable`` with the reason (never 0). A window shorter than Slurm's
sampling period (AcctGatherNodeFreq) is ``short-window``: its figure is mostly the counter's
steps, not the window. Reads happen just outside the window's edges (an ``sstat`` call takes
tens of ms), so the figure also covers those moments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from energysweep.energy.base import wall_ns
from energysweep.hw import node_meter
from energysweep.tables.status import EnergyStatus

METHOD = "slurm-sstat-consumed-energy"


@dataclass
class NodeReading:
    energy_mj: float | None
    status: EnergyStatus
    method: str
    detail: str | None


class NodeSource:
    """Slurm's step energy at a window's edges (begin/end, like the other sources)."""

    def __init__(self, rank: int, environ=None, config: dict | None = None):
        environ = os.environ if environ is None else environ
        self.job = environ.get("SLURM_JOB_ID")
        self.step = environ.get("SLURM_STEP_ID")
        self.reason: str | None = None
        self.period_s: float | None = None
        self._start: float | None = None
        self._start_ns: int | None = None
        if rank != 0:
            self.status, self.reason = EnergyStatus.NOT_READ, "global rank 0 reads the step's nodes"
            return
        self.status = EnergyStatus.UNAVAILABLE
        if not (self.job and self.step):
            self.reason = "not a Slurm job step: no node energy accounting to read"
        else:
            slurm_cfg = node_meter.slurm_config() if config is None else config
            plugin, self.period_s = node_meter.energy_gathering(slurm_cfg)
            if plugin is None:
                self.reason = (
                    "the site gathers no node energy (AcctGatherEnergyType="
                    f"{slurm_cfg.get('AcctGatherEnergyType', 'unknown')}); Slurm would report 0"
                )
            elif node_meter.step_energy_j(self.job, self.step) is None:
                self.reason = f"sstat shows no ConsumedEnergyRaw for step {self.job}.{self.step}"
            else:
                self.status, self.method_detail = EnergyStatus.MEASURED, plugin
        if self.status == EnergyStatus.UNAVAILABLE:
            device = node_meter.ipmi_device()
            self.reason = (self.reason or "") + (
                f"; IPMI device {device} is readable, but energysweep reads IPMI only through "
                "Slurm (acct_gather_energy/ipmi)"
                if device
                else "; no readable IPMI device"
            )

    @property
    def available(self) -> bool:
        return self.status == EnergyStatus.MEASURED

    def begin(self) -> None:
        if self.available:
            self._start_ns = wall_ns()
            self._start = node_meter.step_energy_j(self.job, self.step)

    def end(self) -> NodeReading:
        if not self.available:
            return NodeReading(None, self.status, "none", self.reason)
        if self._start_ns is None:
            raise RuntimeError("end() without begin()")
        stop = node_meter.step_energy_j(self.job, self.step)
        duration_s = (wall_ns() - self._start_ns) / 1e9
        if self._start is None or stop is None or stop < self._start:
            return NodeReading(
                None,
                EnergyStatus.UNAVAILABLE,
                METHOD,
                f"sstat read failed or went back ({self._start} -> {stop} J)",
            )
        detail = f"Slurm {self.method_detail}, step {self.job}.{self.step}"
        status = EnergyStatus.MEASURED
        if self.period_s and duration_s < self.period_s:
            status = EnergyStatus.SHORT_WINDOW
            detail += f"; window {duration_s:.1f} s < AcctGatherNodeFreq {self.period_s:g} s"
        return NodeReading((stop - self._start) * 1e3, status, METHOD, detail)

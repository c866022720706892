"""Process CPU time of a rank over a window: measured, not an energy figure.

Where no RAPL counter exists it is the honest stand-in next to a null CPU energy (README,
Methodology): what the rank spent, never a modelled joule figure.
"""

from __future__ import annotations

import os

from energysweep.energy.base import EnergySource


class CpuTime(EnergySource[float]):
    """Process CPU time (user + system seconds) of this rank."""

    name = "cpu-time"

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

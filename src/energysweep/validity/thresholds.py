"""The verdict's thresholds: config section ``validity`` as a typed, frozen dataclass.

Its own module so that every check of the verdict (energysweep.validity.verdict, .serving) reads
the same typed section without importing the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from energysweep.job.sections import load_section


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """Config section ``validity``: the verdict's thresholds (schema defaults, written once)."""

    counter_period_s: float
    min_counter_periods: float
    min_iterations: int
    min_steady_state_s: float
    min_ok_repetitions: int
    max_ci_half_width: float
    max_idle_std_w: float
    throttle_reasons: list[str]
    max_recheck_deviation: float
    power_average_s: float
    min_batch_fill: float
    require_timeline: bool
    min_load_offered: float
    min_load_sustained: float
    knee_min_throughput_fraction: float
    knee_max_ttft_growth: float
    exploratory: bool

    @classmethod
    def from_config(cls, section: dict | None) -> Thresholds:
        """The validated config's ``validity`` section (every key present: defaults filled); a
        missing one (None) is an error naming it."""
        return load_section(cls, section, "validity")

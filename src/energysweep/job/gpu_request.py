"""What one job asks of its GPUs' power limit and clocks (the grid axes gpu.power_limit_w and
gpu.clock).

A job's setting is part of its key (:class:`energysweep.job.spec.JobKey`: ``power_limit_w``,
``gpu_clock``), in the text its path part, its grid-table cell and its rows' columns have
(:func:`axis_text`); :class:`GpuRequest` is the same setting typed, with the route each part takes
(:meth:`GpuRequest.routes`), as the launcher and the ranks read it (``job.gpu``).
"""

from __future__ import annotations

from dataclasses import dataclass

# The job-key fields of the setting axes (in path order) -> their config key under `gpu:`.
SETTING_AXES = {"power_limit_w": "power_limit_w", "gpu_clock": "clock"}
# An axis value for "left as the node has it" (a swept axis's null).
UNSET = "unset"

# The route each setting takes (docs/gpu-settings.md).
NVML = "nvml"  # the job's launcher sets it through NVML
SLURM_PROLOG = "slurm-prolog"  # the site's Slurm Prolog sets the power limit; the job verifies
SLURM_GPU_FREQ = "slurm-gpu-freq"  # slurmd sets the clocks from sbatch --gpu-freq; job verifies


def axis_text(value: float | int | str | None) -> str:
    """A setting axis value as its key text: ``unset``, watts as ``300`` or ``312.5``, a clock."""
    if value is None:
        return UNSET
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True, kw_only=True)
class GpuRequest:
    """A job's GPU setting: a power limit in W and a clock in Slurm's --gpu-freq vocabulary
    (None: left as the node has it), and who sets the power limit (``gpu.power_limit_method``;
    None when the job asks for no power limit)."""

    power_limit_w: float | None
    clock: str | None
    power_limit_method: str | None

    @classmethod
    def of_key(cls, power_limit_w: str | None, gpu_clock: str | None, method: str | None):
        """The request a job key's axis texts make (None: the job sets nothing)."""
        watts = None if power_limit_w in (None, UNSET) else float(power_limit_w)
        clock = None if gpu_clock in (None, UNSET) else str(gpu_clock)
        if watts is None and clock is None:
            return None
        return cls(power_limit_w=watts, clock=clock, power_limit_method=method)

    def routes(self, under_slurm: bool) -> tuple[str | None, str | None]:
        """(power limit route, clock route): who sets each (None: nothing to set).

        Under Slurm the clocks are Slurm's (``--gpu-freq``); elsewhere the job sets them.
        """
        power = None if self.power_limit_w is None else self.power_limit_method
        clock = None
        if self.clock is not None:
            clock = SLURM_GPU_FREQ if under_slurm else NVML
        return power, clock

    def label(self) -> str:
        """``power limit 300 W, clock medium``, for messages."""
        watts, clock = self.power_limit_w, self.clock
        parts = [f"power limit {watts:g} W" if watts is not None else None,
                 f"clock {clock}" if clock is not None else None]  # fmt: skip
        return ", ".join(p for p in parts if p)

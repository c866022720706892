"""What one job asks of its GPUs' power limit and clocks (the grid axes gpu.power_limit_w and
gpu.clock), carried in the job spec to the launcher and the ranks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The route each setting takes (README, "GPU power limits and clocks").
NVML = "nvml"  # the job's launcher sets it through NVML
SLURM_PROLOG = "slurm-prolog"  # the site's Slurm Prolog sets the power limit; the job verifies
SLURM_GPU_FREQ = "slurm-gpu-freq"  # slurmd sets the clocks from sbatch --gpu-freq; job verifies


@dataclass(frozen=True, kw_only=True)
class GpuRequest:
    """A job's GPU setting: a power limit in W and a clock in Slurm's --gpu-freq vocabulary
    (None: left as the node has it), and how the power limit is applied."""

    power_limit_w: float | None
    clock: str | None
    power_limit_method: str  # gpu.power_limit_method (its default is the schema's)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> GpuRequest | None:
        return None if data is None else cls(**data)

    def routes(self, under_slurm: bool) -> tuple[str | None, str | None]:
        """(power limit route, clock route): who sets each (None: nothing to set).

        Under Slurm the clocks are Slurm's (``--gpu-freq``); elsewhere the job sets them.
        """
        power = None if self.power_limit_w is None else self.power_limit_method
        clock = None
        if self.clock is not None:
            clock = SLURM_GPU_FREQ if under_slurm else NVML
        return power, clock

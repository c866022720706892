"""The launcher-to-rank record of a job's GPU setting: what was asked, who set it, what happened.

The launcher (energysweep.launch.gpu_guard) writes it as JSON to the file :data:`RECORD_ENV`
names in the ranks' environment; every rank loads it back into the same dataclasses
(energysweep.gpu_setting.probe).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from energysweep.gpu_setting import control as gs
from energysweep.job.gpu_request import GpuRequest
from energysweep.job.sections import load_section

# The environment variable naming the job's settings record (set by the launcher,
# energysweep.launch.gpu_guard; read by every rank).
RECORD_ENV = "ENERGYSWEEP_GPU_SETTINGS"


@dataclass(frozen=True, kw_only=True)
class SettingsRecord:
    """What the launcher did to the job's GPUs on its node (energysweep.launch.gpu_guard),
    written as JSON to the file :data:`RECORD_ENV` names, loaded back by every rank.

    ``routes`` says who sets each part (``power_limit``, ``clock``: energysweep.job.gpu_request);
    ``slurm_tres_freq`` is what sbatch --gpu-freq asked, as Slurm records the job, and
    ``slurm_gpu_freq`` what reached the step's environment; ``error`` why nothing could be set.
    """

    request: GpuRequest
    routes: dict[str, str | None]
    host: str
    slurm_tres_freq: str | None
    slurm_gpu_freq: str | None
    gpus: list[gs.GpuSetting]
    error: str | None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, path: str | Path) -> SettingsRecord:
        """The record in ``path``; an unknown or missing key is an error."""
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict) and "request" in data:  # a missing key: load_section says so
            data["request"] = load_section(GpuRequest, data["request"], f"{path}: request")
        if isinstance(data, dict) and "gpus" in data:
            data["gpus"] = [gs.GpuSetting.from_dict(g) for g in data["gpus"]]
        return load_section(cls, data, str(path))

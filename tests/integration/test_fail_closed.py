"""Fail closed, end to end: ``measurement.require_energy: gpu`` stops a job before its model loads
when the node cannot read GPU energy, naming the reason in the rule's log.

Each case runs a real measure job below Snakemake (energysweep.launch.job.run_job, what
scripts/measure.py calls, writing the rule's log): torchrun, the ranks, the emulated node. Without
the ``check_job`` call in energysweep.run each of these jobs would run to the end and publish
rows of unavailable energy instead.
"""

from __future__ import annotations

import pytest
from jobspec import job_spec, limits

from energysweep.hw.emulated import node_config
from energysweep.job.spec import JobDir
from energysweep.launch.job import JobFailed, run_job
from energysweep.sweep.tinymodel import build_tiny_model

pytestmark = [pytest.mark.integration]


def emulated(**overrides) -> dict:
    return {"device": "emulated", "emulated": {**node_config.section_defaults(), **overrides}}


CASES = {
    "cpu-node": ({"device": "cpu"}, "no GPU in use (device=cpu)"),
    "emulated-nvml-fails": (
        emulated(faults=[{"kind": "init_error", "error": "DRIVER_NOT_LOADED"}]),
        "NVMLError_DriverNotLoaded",
    ),
    "emulated-gpu-missing": (
        emulated(faults=[{"kind": "missing_gpu", "gpu": 0}]),
        "GPU not found by NVML: NVMLError_NotFound",
    ),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_required_gpu_energy_stops_the_job_before_the_model_loads(case, model_dir, tmp_path):
    measurement, reason = CASES[case]
    out = tmp_path / "job"
    spec = job_spec(measurement={"require_energy": "gpu", **measurement})
    log_path = tmp_path / "measure.log"
    with open(log_path, "w") as log, pytest.raises(JobFailed, match="exited 1"):
        run_job(spec, JobDir(str(out)), str(model_dir), limits(job_timeout_s=240), log, cpus=1)
    text = log_path.read_text()
    assert "EnergyRequired: measurement.require_energy is gpu" in text, text[-3000:]
    assert "stops before loading the model" in text
    assert "rank 0 on " in text and reason in text, text[-3000:]
    assert not (out / "job.json").exists() and not list(out.glob("bs~*/*.parquet"))

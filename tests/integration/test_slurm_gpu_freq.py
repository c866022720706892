"""``gpu.clock`` through a real Slurm cluster: the measure job's sbatch gets ``--gpu-freq``, and
Slurm records it for the job; what Slurm then does on a node whose slurmd has no NVML.

The local cluster (cluster/slurm-local.sh: Debian's Slurm 22.05, 4 fake GPU devices, no NVIDIA
driver) can neither run CUDA ranks nor set clocks, so the job asks for ``measurement.device:
cuda`` only to keep its clock setting in the grid (on CPU ranks it would be skipped before
submission), and fails in its ranks: what is checked is the way there. Seen here:
``scontrol show job`` has ``TresFreq=gpu:medium``; the batch step's environment has
``SLURM_GPU_FREQ=medium``, but the step the rule runs in (the jobstep plugin's inner ``srun -n1``)
does not: the plugin drops it, so Slurm would start that step at ``GpuFreqDef``. The launcher
records the job's request (``TresFreq``), that the clocks were Slurm's to set (route
``slurm-gpu-freq``), and that NVML is unavailable, so nothing could be set or verified.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import test_env, workflow_copy

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

SLURM = ["--profile", "profiles/slurm", "--profile", "profiles/slurm-ci"]
TIMEOUT_S = 600
CONFIG = {
    "backends": ["pytorch"],
    "scenarios": ["inference"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1},
    "measurement": {"device": "cuda", "min_window_s": 0.01, "idle_baseline_s": 0},
    "gpu": {"clock": ["medium"]},
    # A CUDA sweep of 1 repetition of 0.01 s windows can give no valid point: refused unless
    # exploratory (energysweep.sweep.can_be_valid); this test is about --gpu-freq.
    "validity": {"exploratory": True},
}


@pytest.mark.timeout(TIMEOUT_S + 120)
def test_gpu_clock_reaches_sbatch_and_scontrol_as_gpu_freq(slurm_cluster, tmp_path):
    wf = workflow_copy(tmp_path / "gpufreq")
    (wf / "config" / "test.yaml").write_text(yaml.safe_dump(CONFIG))
    proc = subprocess.run(
        ["timeout", "-k", "20", str(TIMEOUT_S), "snakemake", *SLURM, "--verbose"]
        + ["--configfile=config/test.yaml", "results/grid/jobs.tsv", _job_json()],
        cwd=wf,
        env=test_env(slurm=True),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 60,
    )
    out = proc.stdout + proc.stderr
    # The submission: the measure rule's slurm_extra resource, as the plugin passes it.
    lines = out.splitlines()
    (at,) = [i for i, x in enumerate(lines) if "sbatch call:" in x and "rule_measure" in x]
    assert "--gpu-freq=medium" in lines[at], lines[at]
    submitted = re.compile(r"has been submitted with SLURM jobid (\d+)")
    job_id = next(m.group(1) for x in lines[at:] if (m := submitted.search(x)))
    # What Slurm records for the job (kept MinJobAge=600 s after it ends).
    shown = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert "TresFreq=gpu:medium" in shown, shown
    # The job itself: the launcher's record of its GPU setting, then the ranks' failure.
    log = (wf / "logs" / "measure" / _params()).with_suffix(".log").read_text()
    record = json.loads(log.split("gpu settings: ", 1)[1].splitlines()[0])
    assert record["routes"]["clock"] == "slurm-gpu-freq"  # Slurm's to set, the job only verifies
    # The job asked for it (Slurm's record, read by the job)...
    assert record["slurm_tres_freq"] == "gpu:medium"
    # ...but the rule's step did not get it: snakemake-executor-plugin-slurm-jobstep's inner
    # `srun -n1` drops every SLURM_* variable but the job's identity, SLURM_GPU_FREQ included,
    # and has no resource for srun flags, so Slurm starts that step with GpuFreqDef.
    assert record["slurm_gpu_freq"] is None
    assert "'SLURM_GPU_FREQ': 'medium'" in _slurm_logs(wf)  # the batch step had it
    assert record["error"].startswith("NVML unavailable: NVMLError_LibraryNotFound")
    assert "measurement.device is cuda but torch sees no CUDA device" in log
    assert proc.returncode != 0  # the ranks cannot run here; nothing was published
    assert not (wf / "results" / _job_json()).exists()


def _slurm_logs(wf: Path) -> str:
    """The plugin's per-job Slurm logs (kept for failed jobs; --verbose prints the batch env)."""
    return "".join(p.read_text() for p in (wf / "logs" / "slurm").rglob("*.log"))


def _params() -> str:
    return "model~tiny-llama/backend~pytorch/scenario~inference/tp~1/pp~1/dp~1/gpu_clock~medium"


def _job_json() -> str:
    return str(Path("results/shards") / _params() / "job.json")

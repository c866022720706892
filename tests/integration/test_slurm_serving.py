"""A serving job on the real single-node Slurm cluster (cluster/slurm-local.sh): the client and
its vLLM server run inside the job's allocation (`snakemake --profile profiles/slurm`), the
server's port comes from the Slurm job id, and nothing is left on the node afterwards."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_slurm_pipeline import sacct, snakemake, write_config
from test_vllm_real import processes_in

from energysweep.launch.ports import server_port

from conftest import vllm_python, workflow_copy

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

CONFIG = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [2], "repetitions": 1, "iterations": 8, "output_tokens": 8,
                 "warmup_iterations": 1},
    "measurement": {"min_window_s": 0.5, "idle_baseline_s": 0, "cooldown_s": 0,
                    "sampler_hz": 0},
    "engine": {"enforce_eager": True, "cpu_kvcache_gib": 1},
    "serving": {"request_rates": [4, 64], "batch_caps": [2]},
}  # fmt: skip
JOB = "results/shards/model~tiny-llama/backend~vllm/scenario~serving/tp~1/pp~1/dp~1"


@pytest.mark.timeout(1200)
def test_a_serving_job_runs_its_server_inside_the_slurm_allocation(slurm_cluster, tmp_path):
    wf = workflow_copy(tmp_path)
    cfg = write_config(wf, {**CONFIG, "environments": {"vllm": vllm_python()}})
    proc = snakemake(wf, cfg, f"{JOB}/job.json")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    record = json.loads((wf / JOB / "job.json").read_text())
    rows = pd.read_parquet(wf / JOB / "shards.parquet")
    (job_id,) = set(rows["slurm_job_id"])
    assert job_id and (rows["launch_mode"] == "server").all()
    (server,) = record["timing"]["serving"]["servers"]
    # The API server carries the allocation's job id: it was started inside the job's step.
    assert server["slurm_job_id"] == job_id
    assert server["port"] == server_port(job_id)
    assert set(rows["load"]) == {"rate=4", "rate=64"} and (rows["status"] == "ok").all()
    tres = sacct({job_id}).iloc[0]
    assert tres["state"] == "COMPLETED" and tres["gpus"] == 1
    assert "mem=4000M" in tres["tres"], tres["tres"]  # a rank's 2000 MB + the server's front end
    assert processes_in(wf) == []

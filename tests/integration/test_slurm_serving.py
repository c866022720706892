"""Serving on the real single-node Slurm cluster (cluster/slurm-local.sh), through `snakemake
--profile profiles/slurm`: a concurrency sweep (1 and 32 requests in flight; 32 overloads) at
two batch caps (a server restart between them), tp=1. (A middle level, 4 in flight, carried no
check of its own and is gone: issue 28's test time.) The client and its vLLM server run inside
the job's allocation, the server's port comes from the Slurm job id, and nothing is left on the
node afterwards. bench/serving_overhead.py reports the finished sweep (``--results``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
from test_pipeline_local import check_phases
from test_slurm_pipeline import sacct, snakemake, write_config
from test_vllm_real import processes_in

from energysweep.launch.ports import server_port

from conftest import ROOT, test_env, vllm_python, workflow_copy

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

CONFIG = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [2], "repetitions": 1, "iterations": 8, "output_tokens": 16,
                 "warmup_iterations": 1},
    "measurement": {"min_window_s": 1, "idle_baseline_s": 0, "cooldown_s": 0,
                    "sampler_hz": 0},
    "engine": {"enforce_eager": True, "cpu_kvcache_gib": 0.0625},
    # request_rates: null overrides config/config.yaml's (a --configfile is merged into it).
    "serving": {"concurrency": [1, 32], "request_rates": None, "batch_caps": [2, 4],
                "parallel": None},
}  # fmt: skip
JOB = "results/shards/model~tiny-llama/backend~vllm/scenario~serving/tp~1/pp~1/dp~1"


@pytest.mark.timeout(1500)
def test_a_serving_sweep_runs_its_servers_inside_the_slurm_allocation(slurm_cluster, tmp_path):
    wf = workflow_copy(tmp_path)
    cfg = write_config(wf, {**CONFIG, "environments": {"vllm": vllm_python()}})
    proc = snakemake(wf, cfg)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    record = json.loads((wf / JOB / "job.json").read_text())
    rows = pd.read_parquet(wf / JOB / "shards.parquet")
    (job_id,) = set(rows["slurm_job_id"])
    assert job_id and (rows["launch_mode"] == "server").all()
    servers = record["timing"]["serving"]["servers"]
    # One server per batch cap, restarted between them, each started inside the job's step
    # (the API server's own environment carries the allocation's id) on the job's port.
    assert [s["batch_cap"] for s in servers] == [2, 4]
    assert all(s["slurm_job_id"] == job_id and s["port"] == server_port(job_id) for s in servers)
    assert all(s["start_s"] > 0 and s["stop_s"] > 0 for s in servers)
    check_phases(wf / JOB / "job.json")  # both servers' starts in server_start, phases add up
    tres = sacct({job_id}).iloc[0]
    assert tres["state"] == "COMPLETED" and tres["gpus"] == 1
    assert "mem=4000M" in tres["tres"], tres["tres"]  # a rank's 2000 MB + the server's front end
    # 32 in flight against caps of 2 and 4: most wait in the engine's queue; flagged, past the knee.
    s = pd.read_csv(wf / "results" / "summary.csv")
    over = s[s["load"] == "concurrency=32"]
    assert len(over) == 2 and over["invalid_reasons"].str.contains("load_not_sustained").all()
    assert (over["queue_waiting_mean"] > over["batch_size"]).all()
    assert over["sustained_rate_rps"].isna().all()
    knees = s[s["knee"].astype(str) == "True"]
    assert sorted(knees["batch_size"]) == [2, 4]
    assert str(s[(s["load"] == "concurrency=1")]["sustainable"].iloc[0]) == "True"
    assert processes_in(wf) == []
    # bench/serving_overhead.py's report on this sweep (its quick mode only plans one: a serving
    # sweep of its own cost the suite a minute): each point's time outside its window.
    bench = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serving_overhead.py"), "--results", str(wf)],
        env=test_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    table = bench.stdout.strip().splitlines()
    assert re.match(r"serving time outside windows / inside: \d+\.\d\d \(.* over 1 job\(s\)\)",
                    table[-1]), table[-1]  # fmt: skip
    points = [line.split() for line in table if re.match(r"\s+[24]\s+concurrency=", line)]
    assert sorted((p[0], p[1]) for p in points) == [
        (cap, f"concurrency={c}") for cap in ("2", "4") for c in (1, 32)
    ]

"""vLLM and TensorRT-LLM jobs through the real pipeline, with fake engine modules.

PyTorch's launch mode (torchrun, a process per rank, no per-request rows) is checked on the
session's default sweep (test_pipeline_local.py); its jobs would add nothing here.

Real Snakemake, real torchrun (gloo), the real replica step of the direct launch mode, the real
process audit, shards and summary; only ``vllm`` / ``tensorrt_llm`` are the fakes of
tests/fake_engines.py, put on PYTHONPATH as packages.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import test_env, workflow_copy

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]

VLLM_INIT = """import sys
import fake_engines
_m = fake_engines.make_vllm()
for _k, _v in _m.items():
    if _k != "vllm":
        sys.modules[_k] = _v
LLM = _m["vllm"].LLM
SamplingParams = _m["vllm"].SamplingParams
__version__ = _m["vllm"].__version__
distributed = _m["vllm.distributed"]
"""
TRT_INIT = """import fake_engines
_m = fake_engines.make_tensorrt_llm()["tensorrt_llm"]
LLM = _m.LLM
SamplingParams = _m.SamplingParams
"""
CONFIG = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm", "tensorrt-llm"],
    "scenarios": ["inference"],  # the engines have no training scenario
    "parallel": {"tp": [1, 2], "pp": [1], "dp": [1, 2], "max_gpus_per_job": 2},
    "workload": {"batch_sizes": [2], "repetitions": 1, "iterations": 1, "output_tokens": 5},
    # One iteration per window: a fake engine's batch takes microseconds, so windows of the
    # default 0.5 s held ~20,000 iterations and 200,000 request rows, gathered and written in a
    # teardown of up to 4.9 s per job. Nothing here checks a window's length.
    "measurement": {"min_window_s": 0, "idle_baseline_s": 0, "cooldown_s": 0, "sampler_hz": 0},
    "engine": {"max_model_len": 96},
    # The fake vllm package is on this interpreter's PYTHONPATH (set below), not in .venv-vllm.
    "environments": {"vllm": sys.executable},
}


@pytest.mark.timeout(900)
def test_engine_jobs_run_with_their_launch_modes(tmp_path):
    wf = workflow_copy(tmp_path)
    fakes = tmp_path / "fakes"
    for pkg, init in (("vllm", VLLM_INIT), ("tensorrt_llm", TRT_INIT)):
        (fakes / pkg).mkdir(parents=True)
        (fakes / pkg / "__init__.py").write_text(init)
    shutil.copy(ROOT / "tests" / "fake_engines.py", fakes / "fake_engines.py")
    (wf / "config" / "fake.yaml").write_text(yaml.safe_dump(CONFIG))
    env = test_env()
    env["PYTHONPATH"] = f"{fakes}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--configfile", "config/fake.yaml"],
        cwd=wf,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    got = e.groupby(["backend", "tp", "dp"]).agg(
        mode=("launch_mode", "first"),
        pids=("pid", "nunique"),
        launchers=("launcher_processes", "first"),
        workers=("gpu_workers", "first"),
        dps=("dp_rank", "nunique"),
        status=("status", "first"),
    )
    # vLLM: one process per rank (torchrun); TensorRT-LLM: one per replica (direct), whose
    # engine spawns the GPU workers. The audit counted what the shards record.
    assert got.loc[("vllm", 2, 1)].tolist() == ["torchrun", 2, 2, 2, 1, "ok"]
    assert got.loc[("vllm", 1, 2)].tolist() == ["torchrun", 2, 2, 2, 2, "ok"]
    assert got.loc[("tensorrt-llm", 2, 1)].tolist() == ["direct", 1, 1, 2, 1, "ok"]
    assert got.loc[("tensorrt-llm", 1, 2)].tolist() == ["direct", 2, 2, 2, 2, "ok"]

    # One summary for all backends: same columns, one row per point, every point ok.
    s = pd.read_csv(wf / "results" / "summary.csv")
    assert set(s["backend"]) == {"vllm", "tensorrt-llm"}
    assert (s["status"] == "ok").all()
    per_backend = s.groupby("backend").size()
    assert per_backend.nunique() == 1, per_backend  # 3 layouts x phases, whatever the backend

    # Every engine job publishes requests.parquet: one row per request, the engine's timings.
    jobs = list((wf / "results" / "shards").rglob("job.json"))
    assert len(jobs) == 6  # 2 engines x 3 layouts
    for job in jobs:
        req = pd.read_parquet(job.with_name("requests.parquet"))
        engine = json.loads(job.read_text())["engine"]
        assert engine["max_model_len"] == 96
        # generate windows: output_tokens each; prefill windows: 1 new token each
        assert set(req["output_tokens"]) == {CONFIG["workload"]["output_tokens"], 1}
        assert (req["metrics_status"] == "measured").all(), req["metrics_status"].unique()
        assert req["ttft_s"].notna().all()

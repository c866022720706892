"""A job's GPU setting is put back however the job ends: real launcher, real torchrun (gloo),
real ranks; NVML is the fake pynvml in the launcher's process (its settings persist, as a
GPU's do), since this machine has no GPU.

- A rank SIGKILLed mid-job (the test-only fault hook): the job fails, publishes nothing, and
  every GPU is back at its power limit and clocks from before the job.
- A job whose ranks cannot verify the setting (CPU ranks: no GPU to read it back from) measures
  nothing: every point is a failed row saying why, flagged ``unverified``; the GPUs are restored.
"""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pyarrow.parquet as pq
import pynvml as real
import pytest
import yaml
from jobspec import job_spec, limits

from energysweep.job.layout import ParallelLayout
from energysweep.job.spec import JobDir
from energysweep.launch import procs
from energysweep.launch.job import JobFailed, run_job

import fake_pynvml
from conftest import test_env, workflow_copy

pytestmark = [pytest.mark.integration]
# The job's GPU setting: its key's axes and the config's gpu section that sweeps them.
SETTING = {
    "power_limit_w": "300",
    "gpu_clock": "low",
    "gpu": {"power_limit_w": [300], "clock": ["low"], "power_limit_method": "nvml"},
    "parallel": {"gpus_per_node": 8},
}
BEFORE = (450_000, 2619, 1500)  # a site's own setting, different from the defaults


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from energysweep.sweep.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def _gpus(fake_nvml):
    gpus = fake_pynvml.h100s(4)
    for g in gpus:
        g.privileged = True
        g.power_limit_mw, g.app_mem_mhz, g.app_sm_mhz = BEFORE
    fake_nvml(gpus)
    return gpus


def _state(gpus):
    return [(g.power_limit_mw, g.app_mem_mhz, g.app_sm_mhz) for g in gpus]


def _applied(log_text: str) -> dict:
    line = next(x for x in log_text.splitlines() if x.startswith("gpu settings: "))
    return json.loads(line[len("gpu settings: ") :])


@pytest.mark.timeout(300)
def test_sigkilled_rank_the_gpus_get_their_settings_back(fake_nvml, model, tmp_path, monkeypatch):
    gpus = _gpus(fake_nvml)
    monkeypatch.setenv("ENERGYSWEEP_TEST_FAULT", '{"rank": 1, "batch_size": 1, "action": "kill"}')
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "job"
    spec = job_spec(ParallelLayout(dp=2), "inference", **SETTING)
    log_path = tmp_path / "job.log"
    with open(log_path, "w") as log, pytest.raises(JobFailed, match="exited"):
        run_job(spec, JobDir(str(out)), str(model), limits(), log, cpus=2)
    text = log_path.read_text()
    record = _applied(text)
    # The job's two GPUs were set (the first two NVML lists), the others never touched.
    assert [g["uuid"] for g in record["gpus"]] == [g.uuid for g in gpus[:2]]
    assert {(g["power_limit_status"], g["clock_status"]) for g in record["gpus"]} == {
        ("applied", "applied")
    }
    assert "injected fault" in text or "SIGKILL" in text or "Signals.SIGKILL" in text, text[-2000:]
    assert _state(gpus) == [BEFORE] * 4  # all back, as they were before the job
    assert "gpu settings restored: ok" in text
    assert sorted(p.name for p in out.iterdir()) == [".spec.json"]  # nothing published
    assert procs.marked(json.loads((out / ".spec.json").read_text())["job_id"]) == []


@pytest.mark.timeout(300)
def test_unverifiable_setting_is_flagged_and_nothing_is_measured(
    fake_nvml, model, tmp_path, monkeypatch
):
    gpus = _gpus(fake_nvml)
    monkeypatch.delenv("ENERGYSWEEP_TEST_FAULT", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "job"
    spec = job_spec(ParallelLayout(), "inference", batch_sizes=(1, 2), reps=2, **SETTING)
    log_path = tmp_path / "job.log"
    with open(log_path, "w") as log:
        run_job(spec, JobDir(str(out)), str(model), limits(), log, cpus=1)
    assert _state(gpus) == [BEFORE] * 4
    rows = pq.read_table(out / "shards.parquet").to_pandas()
    assert len(rows) == 2 * 2 * 2  # batch sizes x repetitions x (generate, prefill)
    assert set(rows["status"]) == {"error"}
    assert rows["window_start_ns"].isna().all() and rows["gpu_energy_mj"].isna().all()
    assert set(rows["gpu_power_limit_status"]) == {"unverified"}
    assert set(rows["gpu_clock_status"]) == {"unverified"}
    assert set(rows["power_limit_w"]) == {"300"} and set(rows["gpu_clock"]) == {"low"}
    assert rows["error"].str.contains("is not in effect, so batch size").all()
    assert rows["error"].str.contains("this rank has no GPU to set or verify").all()


@pytest.mark.timeout(300)
def test_cpu_sweep_lists_its_gpu_settings_as_skipped_with_the_reason(tmp_path):
    """On CPU ranks a setting cannot be applied: known before submission, so those points are in
    results/grid/skipped.tsv (with their setting columns) and no job is made for them."""
    wf = workflow_copy(tmp_path)
    over = {
        "backends": ["pytorch"],
        "scenarios": ["inference"],
        "parallel": {"tp": [1], "pp": [1], "dp": [1]},
        "measurement": {"device": "cpu"},
        "gpu": {"power_limit_w": [None, 300], "clock": ["low,memory=high"]},
    }
    (wf / "config" / "test.yaml").write_text(yaml.safe_dump(over))
    proc = subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--configfile=config/test.yaml"]
        + ["results/grid/jobs.tsv", "results/grid/skipped.tsv"],
        cwd=wf,
        env=test_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = pd.read_csv(wf / "results" / "grid" / "jobs.tsv", sep="\t", dtype=str)
    skipped = pd.read_csv(wf / "results" / "grid" / "skipped.tsv", sep="\t", dtype=str)
    assert jobs.empty and list(jobs.columns)[-2:] == ["power_limit_w", "gpu_clock"]
    assert sorted(skipped["power_limit_w"]) == ["300", "unset"]
    assert set(skipped["gpu_clock"]) == {"low,memory=high"}
    assert skipped["reason"].str.contains("runs the ranks on CPUs: there is no GPU").all()


@pytest.mark.timeout(300)
def test_device_auto_on_a_node_without_a_gpu_fails_each_setting_point_saying_why(
    fake_nvml, model, tmp_path, monkeypatch
):
    """``measurement.device: auto`` is decided on the job's node: the grid kept the setting
    points (tests/integration/test_examples_dryrun.py); a node that turns out to have no GPU
    (no NVML, no CUDA device) records each of them as an error with the reason, in the rows
    and in the job's log, and measures nothing."""
    fake_nvml([], init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)  # the launcher's node: no driver
    monkeypatch.delenv("ENERGYSWEEP_TEST_FAULT", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the ranks' torch: no CUDA device
    out = tmp_path / "job"
    spec = job_spec(ParallelLayout(), "inference", measurement={"device": "auto"}, **SETTING)
    log_path = tmp_path / "job.log"
    with open(log_path, "w") as log:
        run_job(spec, JobDir(str(out)), str(model), limits(), log, cpus=1)
    rows = pq.read_table(out / "shards.parquet").to_pandas()
    assert len(rows) == 2 and set(rows["status"]) == {"error"}  # generate, prefill
    assert rows["gpu_energy_mj"].isna().all() and rows["window_start_ns"].isna().all()
    why = "measurement.device auto found no CUDA GPU on"
    assert rows["error"].str.contains(why).all() and rows["error"].str.contains("NVML").all()
    text = log_path.read_text()
    assert _applied(text)["error"].startswith("NVML unavailable")
    assert "batch size 1 rep 0 generate: error: SettingNotApplied: GPU setting (" in text
    assert why in text

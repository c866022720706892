"""The sweep through a real Slurm cluster: `snakemake --profile profiles/slurm` (+ the CI profile).

The cluster is the one cluster/slurm-local.sh starts: one node, 8 CPUs, 4 fake GPUs declared as
GRES. Jobs see CUDA_VISIBLE_DEVICES but no CUDA, run their ranks on CPU (gloo), and record both.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from test_vllm_real import processes_in

from energysweep.hw.emulated.node import identity

from conftest import SMALL, test_env, workflow_copy
from emulated_truth import (
    SLURM_LONG_ERROR_PCT,
    SLURM_RANK_BIAS_S,
    SLURM_WORST_ERROR_S,
    against_truth,
    assert_matches_truth,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

# The tests of one Slurm behaviour need one job per layout: inference only.
INFERENCE = {"scenarios": ["inference"]}
SLURM = ["--profile", "profiles/slurm", "--profile", "profiles/slurm-ci"]
SNAKEMAKE_TIMEOUT_S = 900


def snakemake_argv(*args: str, profile=SLURM, timeout=SNAKEMAKE_TIMEOUT_S) -> list[str]:
    # `timeout -k` as well: a Snakemake that lost its jobs ignores SIGTERM (reference notes).
    return ["timeout", "-k", "20", str(timeout), "snakemake", *profile, *args]


def start_snakemake(wf: Path, log_path: Path, *args: str) -> subprocess.Popen:
    """Snakemake through Slurm in the background (:func:`stop_snakemake`), output in log_path."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            snakemake_argv(*args), cwd=wf, env=test_env(slurm=True), stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def snakemake(wf: Path, *args: str, profile=SLURM, timeout=SNAKEMAKE_TIMEOUT_S):
    argv = snakemake_argv(*args, profile=profile, timeout=timeout)
    return subprocess.run(
        argv,
        cwd=wf,
        env=test_env(slurm=profile is SLURM),
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )


def write_config(wf: Path, over: dict) -> str:
    (wf / "config" / "test.yaml").write_text(yaml.safe_dump(over))
    return "--configfile=config/test.yaml"


SACCT_COLUMNS = ["job_id", "comment", "tres", "state", "submit", "start", "end", "workdir"]


def _sacct_table(*select: str) -> pd.DataFrame:
    """One row per job (-X) that ``select`` picks (e.g. ``-j 1,2`` or ``-S <time>``)."""
    out = subprocess.run(
        [
            "sacct",
            "-X",
            *select,
            "-P",
            "-n",
            "-o",
            "JobID,Comment%200,AllocTRES%80,State,Submit,Start,End,WorkDir%400",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    df = pd.DataFrame([line.split("|") for line in out.strip().splitlines()], columns=SACCT_COLUMNS)
    df["gpus"] = df["tres"].str.extract(r"gres/gpu=(\d+)")[0].astype(float)
    return df


def sacct(job_ids) -> pd.DataFrame:
    df = _sacct_table("-j", ",".join(sorted(job_ids)))
    for column in ("submit", "start", "end"):
        df[column] = pd.to_datetime(df[column])
    return df


def rule_jobs(since: str, rule: str, wf: Path) -> pd.DataFrame:
    """The jobs of one rule that the workflow in ``wf`` submitted since ``since`` (sacct -S)."""
    df = _sacct_table("-S", since)
    mine = df["workdir"].map(lambda d: Path(d).resolve() == wf.resolve())
    return df[mine & df["comment"].str.contains(f"rule_{rule}", regex=False)].reset_index(drop=True)


def stop_snakemake(sm: subprocess.Popen) -> None:
    """Stop a Snakemake still running: SIGTERM (it passes it on to its jobs), SIGKILL after 30 s."""
    if sm.poll() is not None:
        return
    sm.terminate()
    try:
        sm.wait(timeout=30)
    except subprocess.TimeoutExpired:
        sm.kill()
        sm.wait(timeout=30)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


@pytest.mark.timeout(SNAKEMAKE_TIMEOUT_S * 2 + 300)
def test_default_sweep_through_slurm(slurm_cluster, request, tmp_path):
    """The default layouts through Slurm, on the emulated GPU node (its 4 GPUs are the node's
    GRES): one job per layout and scenario, each allocated exactly tp*pp*dp GPUs; the node
    packed with jobs whose GPUs never overlap while one waits for GPUs; every rank measuring
    the GPU its CUDA_VISIBLE_DEVICES names, every window's energy its ground truth's; and the
    same schema and rows as the same sweep on the local profile (CPU, no GPU). (Two tests until
    issue 28's test time: this sweep on CPU, and three 2-GPU jobs on the emulated node.)"""
    wf = workflow_copy(tmp_path / "slurm")
    emulated = {"device": "emulated", "emulated": {"node_gpus": slurm_cluster.gpus_per_node}}
    cfg = write_config(wf, {**SMALL, "measurement": emulated})
    log_path = tmp_path / "snakemake-slurm.log"
    sm = start_snakemake(wf, log_path, cfg)
    try:
        # Meanwhile (the Slurm sweep mostly waits on the scheduler) the same sweep on the local
        # profile: the session's run, shared with test_pipeline_local (done already if it ran).
        local, _ = request.getfixturevalue("local_run")
        sm.wait(timeout=SNAKEMAKE_TIMEOUT_S + 60)
    finally:
        stop_snakemake(sm)
    assert sm.returncode == 0, log_path.read_text()[-5000:]
    e = pd.read_parquet(wf / "results" / "energy.parquet")

    # One COMPLETED Slurm job per layout and scenario (the default sweep has inference and
    # training), allocated exactly tp*pp*dp GPUs.
    per_job = e.groupby(["scenario", "tp", "pp", "dp"])["slurm_job_id"].unique()
    assert len(per_job) == 8 and all(len(ids) == 1 for ids in per_job)
    assert set(e["scenario"]) == {"inference", "training"}
    acct = sacct([ids[0] for ids in per_job]).set_index("job_id")
    for (_, tp, pp, dp), ids in per_job.items():
        job = acct.loc[ids[0]]
        assert job["state"] == "COMPLETED", job
        assert job["gpus"] == tp * pp * dp, job
        assert "rule_measure" in job["comment"]
    allocated = e.groupby("slurm_job_id")["allocated_gpus"].first()
    assert_gpus_shared_out(acct, allocated, slurm_cluster.gpus_per_node)
    # Snakemake held back no job for GPUs of its own count (the local profile's cap, from the
    # submitting machine's GPUs: here the emulated node's 4): Slurm allocates.
    assert "Provided resources: gpu" not in log_path.read_text()

    # The job saw the GPUs Slurm gave it, ran on CPU, and recorded both. Every row joins with
    # sacct: job id, step, partition, account and node.
    assert e["slurm_partition"].eq(slurm_cluster.default_partition).all()
    assert e["slurm_account"].eq(slurm_cluster.account).all()
    assert e["slurm_node"].eq(slurm_cluster.node).all()
    assert e["slurm_step_id"].notna().all() and e["slurm_job_id"].notna().all()
    # No node energy: this cluster gathers none (AcctGatherEnergyType none), so null, never 0.
    assert e["node_energy_mj"].isna().all()
    assert e.loc[e["rank"] == 0, "node_energy_detail"].str.contains("gathers no node energy").all()
    assert e["device"].eq("cpu").all()
    gpus_seen = e.groupby(["tp", "pp", "dp"])["allocated_gpus"].first().str.split(",").map(len)
    assert all(n == tp * pp * dp for (tp, pp, dp), n in gpus_seen.items())
    # Each rank measured the emulated GPU its CUDA_VISIBLE_DEVICES entry names, and its energy.
    for r in e.itertuples():
        index = int(r.allocated_gpus.split(",")[r.local_rank])
        assert r.gpu_uuid == identity(r.host, index).uuid and r.gpu_index == index
    assert e["gpu_energy_method"].eq("emulated:nvml-total-energy-counter").all()
    rows = against_truth(wf)
    assert len(rows) == len(e)
    assert_matches_truth(rows, SLURM_WORST_ERROR_S, SLURM_RANK_BIAS_S, SLURM_LONG_ERROR_PCT)

    # Same schema and row count as the same sweep on the local profile.
    # (The arrow schema, not pandas' dtypes: a column null on CPU reads back as object there.)
    local_energy = pq.read_table(local / "results" / "energy.parquet")
    assert local_energy.schema == pq.read_table(wf / "results" / "energy.parquet").schema
    assert local_energy.num_rows == len(e)
    ls = pd.read_csv(local / "results" / "summary.csv")
    s = pd.read_csv(wf / "results" / "summary.csv")
    assert list(ls.columns) == list(s.columns) and len(ls) == len(s)


def assert_gpus_shared_out(acct: pd.DataFrame, allocated: pd.Series, node_gpus: int) -> None:
    """Slurm gave the node's ``node_gpus`` GPUs to the sweep's jobs (``acct``, by job id;
    ``allocated``: the GPUs each job saw): jobs ran together, never on one GPU at once, never on
    more GPUs than the node has, and a job submitted with the others waited for GPUs to come
    free."""
    jobs = acct.assign(gpu_set=allocated.reindex(acct.index).str.split(",").map(set))
    together = 0
    for job_id, job in jobs.iterrows():
        # sacct's whole seconds: a job starting within the second another ended counts as after.
        running = jobs[(jobs["start"] <= job["start"]) & (jobs["end"] > job["start"])]
        assert running["gpus"].sum() <= node_gpus, running
        together = max(together, len(running))
        for other_id, other in running.drop(index=job_id).iterrows():
            assert not job["gpu_set"] & other["gpu_set"], (job_id, other_id, running)
    assert together >= 2, jobs
    waited = [
        (a, b)
        for a, ja in jobs.iterrows()
        for b, jb in jobs.iterrows()
        if jb["submit"] < ja["end"] <= jb["start"]
    ]
    assert waited, jobs


@pytest.mark.timeout(SNAKEMAKE_TIMEOUT_S + 300)
def test_scancel_mid_measurement_leaves_no_shard_and_rerun_completes(
    slurm_cluster, overtime_run, tmp_path
):
    # overtime_run: the timeout-retry test's sweep, started here to run beside this test and
    # the serving one (one GPU each, of the node's 4).
    wf = workflow_copy(tmp_path)
    cfg = write_config(
        wf,
        {
            "workload": {"batch_sizes": [1, 4, 8], "repetitions": 2, "iterations": 3},
            "parallel": {"tp": [1], "pp": [1], "dp": [1]},
            **INFERENCE,
        },
    )
    argv = ["snakemake", *SLURM, cfg]
    with open(tmp_path / "snakemake.log", "w") as log:
        sm = subprocess.Popen(
            argv, cwd=wf, env=test_env(slurm=True), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            # Wait until the job has written its first shard into staging: mid-measurement.
            deadline = time.monotonic() + 300
            staged = []
            while time.monotonic() < deadline and not staged:
                staged = list((wf / "results" / "shards").glob("**/.staging-*/bs~1/rep~0.parquet"))
                time.sleep(0.1)
            assert staged, "measure job never started measuring"
            job_dir = staged[0].parents[2]
            # The staged shard names the Slurm job that is writing it.
            killed = pd.read_parquet(staged[0])["slurm_job_id"].iloc[0]
            subprocess.run(["scancel", killed], check=True, timeout=30)
            # Killed mid-measurement: nothing under a final name that aggregation would read.
            time.sleep(3)
            assert not list(job_dir.glob("bs~*/rep~*.parquet"))
            assert not (job_dir / "job.json").exists()
        finally:
            # Plugin 2.8 may wait a long time on a cancelled job; the user's move is to stop
            # Snakemake and rerun it, which is what is tested here.
            stop_snakemake(sm)
    assert not list(job_dir.glob("bs~*/rep~*.parquet"))
    # A stopped Snakemake may leave its lock; unlocking is the documented first step of a rerun.
    unlock = snakemake(wf, cfg, "--unlock")
    assert unlock.returncode == 0, unlock.stderr[-3000:]
    rerun = snakemake(wf, cfg)
    assert rerun.returncode == 0, rerun.stderr[-5000:]
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert e["status"].eq("ok").all()
    done = e["slurm_job_id"].unique()
    assert len(done) == 1 and done[0] != killed  # every row comes from the rerun
    states = sacct([killed, done[0]]).set_index("job_id")["state"].str.split().str[0]
    assert states.to_dict() == {killed: "CANCELLED", done[0]: "COMPLETED"}
    # Nothing of either job outlives it: CI run 47 found the cancelled job's inner Snakemake
    # (the jobstep plugin's, under srun) still running an hour later, parented to init.
    assert processes_in(wf) == []


# The timeout-retry test's sweep: an idle baseline of 90 s on the emulated node (its GPU idles,
# the rank sleeps), plus start-up: > 90 s, so Slurm kills the first attempt under a 1-minute
# limit (60-90 s in). Its job mostly waits, so it runs beside other single-node tests (fixture
# overtime_run; the test that checks it runs last on the single-node cluster, slurm_fixtures):
# alone, it was 4 minutes of the Slurm session's chain (issue 28).
OVERTIME = {
    "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1},
    "measurement": {
        "device": "emulated",
        "emulated": {"node_gpus": 4},
        "idle_baseline_s": 90,
        "prefill_pass": False,
    },
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    **INFERENCE,
}


@pytest.fixture(scope="session")
def overtime_run(slurm_switch, tmp_path_factory):
    """The sweep test_job_over_its_runtime_is_retried_with_more checks, started by the first test
    that asks for it and left running beside the next ones (its one job holds one of the node's
    4 GPUs); stopped at the session's end if still running."""
    slurm_switch.ensure(1)
    wf = workflow_copy(tmp_path_factory.mktemp("overtime"))
    cfg = write_config(wf, OVERTIME)
    # 1 minute on the first attempt, 5 on the retry (Slurm kills a 1-minute job 60-90 s in; the
    # retry's ~2 minutes keep a margin while other tests load the 2 cores). profiles/slurm-ci
    # turns retries off for every other test: this one needs its retry.
    retry = ["--set-resources", "measure:runtime=4*attempt-3", "--retries", "1"]
    log_path = wf.parent / "snakemake-overtime.log"
    since = now()
    sm = start_snakemake(wf, log_path, cfg, *retry)
    try:
        yield SimpleNamespace(wf=wf, since=since, proc=sm, log=log_path)
    finally:
        stop_snakemake(sm)


@pytest.mark.timeout(SNAKEMAKE_TIMEOUT_S + 120)
@pytest.mark.last_on_its_cluster
def test_job_over_its_runtime_is_retried_with_more(overtime_run):
    """A job needing about 2 minutes gets 1 (TIMEOUT), then succeeds on the longer retry."""
    overtime_run.proc.wait(timeout=SNAKEMAKE_TIMEOUT_S + 60)
    assert overtime_run.proc.returncode == 0, overtime_run.log.read_text()[-5000:]
    jobs = rule_jobs(overtime_run.since, "measure", overtime_run.wf)
    states = jobs["state"].str.split().str[0].tolist()
    assert states == ["TIMEOUT", "COMPLETED"], jobs
    limits = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs["job_id"]), "-o", "JobID,Timelimit"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert [lim.split("|")[1] for lim in limits] == ["00:01:00", "00:05:00"]
    # The retry measured what the first attempt could not: its idle baseline, then its window.
    e = pd.read_parquet(overtime_run.wf / "results" / "energy.parquet")
    assert e["status"].eq("ok").all() and set(e["slurm_job_id"]) == {jobs["job_id"].iloc[1]}
    assert (e["idle_gpu_power_status"] == "measured").all()

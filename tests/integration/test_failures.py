"""Failures are fast, loud and lose nothing: real Snakemake, real torchrun (gloo), real Parquet.

- Every script step: an exception leaves its type and message in the rule's log, and the console
  shows one line naming the step and the log (steps made to fail with the test-only fault hook,
  ``ENERGYSWEEP_TEST_FAULT`` with ``step``; measure and merge fail for real below).
- A 2-rank pp=2 inference job and a 2-rank pp=2 training job where rank 1 raises at a batch size
  fail within ``collective_timeout_s`` + a few seconds of the fault, with the error in the rule's
  log, and no process of either job is left.
- SIGTERM to a running measure step (as scancel and Slurm's TIMEOUT send) and SIGKILL of one rank:
  no process left, nothing published, and the rerun completes.
- A truncated job table fails the merge naming the file and the rerun command; the previous
  results stay; the printed command, run as printed, completes the merge.
- ENOSPC: a shard write onto a full filesystem (a tiny tmpfs) fails the job with the path, and
  nothing is published; a merge onto a full filesystem writes nothing.

Tiny grids (one batch size, one repetition, short windows) keep this module to a few minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from jobspec import job_spec, limits

from energysweep import aggregate as agg
from energysweep import results
from energysweep.job.spec import JobDir, LaunchedJob
from energysweep.launch import procs
from energysweep.launch.job import JobFailed, run_job

from conftest import test_env, workflow_copy

pytestmark = [pytest.mark.integration]

BASE = {
    "scenarios": ["inference"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1, "warmup_iterations": 0},
    "training": {"steps": 1, "warmup_steps": 0, "seq_len": 16},
    "measurement": {
        "min_window_s": 0.01,
        "idle_baseline_s": 0,
        "cooldown_s": 0,
        "sampler_hz": 0,
        "prefill_pass": False,
    },
}
# Two-rank pipeline jobs, both scenarios; the collective timeout must exceed the longest wait of
# a healthy job on a loaded 2-core machine (rank 0 counting parameters while rank 1 waits).
PP2 = {
    **BASE,
    "scenarios": ["inference", "training"],
    "parallel": {"tp": [1], "pp": [2], "dp": [1]},
    "limits": {"collective_timeout_s": 30, "kill_grace_s": 3},
}
PP2_JOBS = [
    f"results/shards/model~tiny-llama/backend~pytorch/scenario~{s}/tp~1/pp~2/dp~1"
    for s in ("inference", "training")
]
SNAKEMAKE_TIMEOUT_S = 400
FAULT = "ENERGYSWEEP_TEST_FAULT"


def snakemake(wf: Path, cfg: str, *args, fault: dict | None = None, wait: bool = True):
    """Snakemake on the local profile in ``wf``; ``fault``: the test-only fault hook."""
    env = test_env()
    env.pop(FAULT, None)
    if fault is not None:
        env[FAULT] = json.dumps(fault)
    cmd = ["snakemake", "--profile", "profiles/local", f"--configfile={cfg}", *args]
    if not wait:
        return subprocess.Popen(
            cmd, cwd=wf, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return subprocess.run(
        cmd, cwd=wf, env=env, capture_output=True, text=True, timeout=SNAKEMAKE_TIMEOUT_S
    )


def write_config(wf: Path, name: str, cfg: dict) -> str:
    (wf / "config" / name).write_text(yaml.safe_dump(cfg))
    return f"config/{name}"


def log_of(job_dir: str) -> str:
    return "logs/measure/" + job_dir.removeprefix("results/shards/") + ".log"


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


def workflow_processes(wf: Path) -> dict[int, str]:
    """Live processes (not zombies) running in ``wf`` that belong to a job: pid -> cmdline.

    Independent of energysweep.launch.procs (which the code under test uses): the working directory
    and the command line, as ``ps`` would show them.
    """
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        stat = _read(Path(f"/proc/{pid}/stat"))
        if not stat or stat.rpartition(")")[2].split()[0] in ("Z", "X"):
            continue
        cmd = _read(Path(f"/proc/{pid}/cmdline")).replace("\0", " ")
        if Path(cwd) == wf and (
            "energysweep.run" in cmd or "measure.py" in cmd or "torch.distributed.run" in cmd
        ):
            found[pid] = cmd
    return found


def job_marks(wf: Path, job_dirs: list[str]) -> list[str]:
    return [LaunchedJob.load(JobDir(str(wf / d)).spec_file).job_id for d in job_dirs]


def assert_nothing_left(wf: Path, job_dirs: list[str], timeout_s: float = 20) -> None:
    """No process of the jobs, no published output, no staging directory."""
    deadline = time.monotonic() + timeout_s
    while workflow_processes(wf) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workflow_processes(wf) == {}, "processes outlived their job"
    for mark in job_marks(wf, job_dirs):
        assert procs.marked(mark) == []
    for d in job_dirs:
        job = wf / d
        assert not (job / "job.json").exists() and not (job / "shards.parquet").exists()
        assert not list(job.glob("bs~*/rep~*.parquet")) and not list(job.glob(".staging-*"))


@pytest.fixture(scope="module")
def wf(tmp_path_factory):
    """A workflow copy whose steps are made to fail one stage after another, then complete.

    Run 1: record_config, grid_tables and build_tiny_model fail (nothing else can run).
    Run 2: everything up to the merge completes; the figure and report-page steps fail.
    Runs 3 and 4 (target ``preflight``): its node step fails, then its verdict step. Every run's
    output is kept for the step tests; the workflow (model built, results merged) serves the
    later tests.
    """
    wf = workflow_copy(tmp_path_factory.mktemp("failures"))
    cfg = write_config(wf, "base.yaml", BASE)
    runs = {}
    for run, steps, target in (
        ("early", ["record_config", "grid_tables", "build_tiny_model"], []),
        ("late", ["figures", "report_pages"], []),
        ("preflight_node", ["preflight_node"], ["preflight"]),
        ("preflight", ["preflight"], ["preflight"]),
    ):
        proc = snakemake(wf, cfg, *target, fault={"action": "raise", "step": steps})
        # A later run redoes the failed steps (and rewrites their logs): keep them now.
        logs = {step: _read(wf / STEP_LOGS[step][1]) for step in steps}
        runs[run] = (proc, logs)
    return wf, cfg, runs


STEP_LOGS = {
    "record_config": ("early", "logs/record_config.log"),
    "grid_tables": ("early", "logs/grid_tables.log"),
    "build_tiny_model": ("early", "logs/build_model/tiny-llama.log"),
    "figures": ("late", "logs/figures.log"),
    "report_pages": ("late", "logs/report_pages.log"),
    "preflight_node": ("preflight_node", "logs/preflight/node~0.log"),
    "preflight": ("preflight", "logs/preflight/verdict.log"),
}


@pytest.mark.timeout(2 * SNAKEMAKE_TIMEOUT_S)
@pytest.mark.parametrize("step", list(STEP_LOGS))
def test_failed_step_traceback_in_its_log_one_line_on_console(wf, step):
    wf, _, runs = wf
    run, log = STEP_LOGS[step]
    proc, logs = runs[run]
    assert proc.returncode != 0
    text = logs[step]
    assert "Traceback (most recent call last)" in text
    assert f"RuntimeError: injected fault (raise) in step {step}" in text
    console = proc.stdout + proc.stderr
    line = (
        f"energysweep step {step} failed: RuntimeError: injected fault (raise) in step "
        f"{step} (full traceback in {log})"
    )
    assert line in console


@pytest.mark.timeout(2 * SNAKEMAKE_TIMEOUT_S)
def test_steps_after_a_failure_complete_and_merge_ran(wf):
    wf, _, runs = wf
    assert runs["late"][0].returncode != 0  # the figure steps failed on purpose
    for out in ("config.yaml", "grid/jobs.tsv", "summary.csv", "environment.parquet"):
        assert (wf / "results" / out).is_file(), out
    assert not (wf / "results" / "plots" / "energy_per_token.png").exists()


@pytest.mark.timeout(3 * SNAKEMAKE_TIMEOUT_S)
def test_bad_job_table_fails_merge_keeps_results_rerun_command_works(wf):
    wf, cfg, _ = wf
    res_dir = wf / "results"
    kept = [
        res_dir / "summary.csv",
        res_dir / "environment.parquet",
        *sorted((res_dir / "energy.parquet").rglob("*.parquet")),
    ]
    before = {p: p.read_bytes() for p in kept}
    (job,) = sorted(res_dir.glob("shards/**/job.json"))
    table = Path(JobDir.of(job).job_table)
    table.write_bytes(table.read_bytes()[:300])  # truncated
    proc = snakemake(wf, cfg, "--forcerun", "merge_shards")
    assert proc.returncode != 0
    log = (wf / "logs" / "merge_shards.log").read_text()
    rel_table = table.relative_to(wf)
    assert "MergeInputError" in log and f"{rel_table} is not a readable Parquet file" in log
    console = proc.stdout + proc.stderr
    assert "energysweep step merge_shards failed: MergeInputError: merge refused" in console
    assert str(rel_table) in console and "(full traceback in logs/merge_shards.log)" in console
    assert {p: p.read_bytes() for p in kept} == before, "a refused merge replaced the results"
    # The command the error prints, run exactly as printed, reruns the job and the merge.
    command = re.search(r"rerun it: (.+)$", log, re.M).group(1)
    assert command == shlex.join(
        [
            "snakemake",
            "--profile",
            "profiles/local",
            f"--configfile={cfg}",
            "--forcerun",
            str(job.relative_to(wf)),
        ]
    )
    env = test_env()
    env.pop(FAULT, None)
    rerun = subprocess.run(
        shlex.split(command),
        cwd=wf,
        env=env,
        capture_output=True,
        text=True,
        timeout=SNAKEMAKE_TIMEOUT_S,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert pd.read_parquet(table).shape[0] == json.loads(job.read_text())["job_table_rows"]
    assert (res_dir / "plots" / "energy_per_token.png").is_file()


def _fault_times(log: str) -> list[float]:
    return [float(t) for t in re.findall(r"injected fault \(raise\) .* at unix time ([\d.]+)", log)]


@pytest.mark.timeout(2 * SNAKEMAKE_TIMEOUT_S)
def test_rank_raising_alone_fails_pp2_jobs_within_bound(wf):
    """Rank 1 raises at batch size 1; rank 0 waits for it in the pipeline's send/recv."""
    wf, _, _ = wf
    cfg = write_config(wf, "pp2.yaml", PP2)
    targets = [f"{d}/job.json" for d in PP2_JOBS]
    proc = snakemake(
        wf, cfg, "--cores", "4", *targets, fault={"rank": 1, "batch_size": 1, "action": "raise"}
    )
    assert proc.returncode != 0
    timeout_s = PP2["limits"]["collective_timeout_s"]
    grace_s = PP2["limits"]["kill_grace_s"]
    for job_dir in PP2_JOBS:
        log_path = wf / log_of(job_dir)
        log = log_path.read_text()
        assert "RuntimeError: injected fault (raise) on rank 1 at batch size 1" in log
        assert "JobAborted: rank 1: the ranks did not agree on batch size 1" in log
        assert "JobFailed" in log and "nothing of it was published" in log
        (fault_at,) = _fault_times(log)
        # Bound: the agreement deadline, the kill grace, and teardown.
        failed_after = log_path.stat().st_mtime - fault_at
        print(
            f"{job_dir}: failed {failed_after:.1f} s after the fault (bound "
            f"{timeout_s + grace_s + 15} s)"
        )
        assert failed_after < timeout_s + grace_s + 15, failed_after
    assert_nothing_left(wf, PP2_JOBS)


@pytest.mark.timeout(3 * SNAKEMAKE_TIMEOUT_S)
def test_sigterm_to_measure_step_and_sigkill_of_a_rank_then_rerun(wf):
    """Both pp=2 jobs run long windows; the inference job's measure step gets SIGTERM (as scancel
    sends), the training job's rank 1 gets SIGKILL."""
    wf, _, _ = wf
    long = {**PP2, "measurement": {**PP2["measurement"], "min_window_s": 600}}
    cfg = write_config(wf, "pp2-long.yaml", long)
    targets = [f"{d}/job.json" for d in PP2_JOBS]
    run = snakemake(wf, cfg, "--cores", "4", *targets, wait=False)
    try:
        ranks = {}
        deadline = time.monotonic() + SNAKEMAKE_TIMEOUT_S / 2
        while time.monotonic() < deadline:
            live = workflow_processes(wf)
            ranks = {
                d: sorted(
                    p
                    for p, c in live.items()
                    if "energysweep.run" in c
                    and f"{d}/.spec.json" in c
                    and "torch.distributed.run" not in c
                )
                for d in PP2_JOBS
            }
            if all(len(r) == 2 for r in ranks.values()):
                break
            assert run.poll() is None, run.stdout.read()[-3000:]
            time.sleep(0.5)
        assert all(len(r) == 2 for r in ranks.values()), ranks
        time.sleep(5)  # into the model load / windows
        inference, training = PP2_JOBS
        launcher = next(
            p
            for p, c in workflow_processes(wf).items()
            if "torch.distributed.run" in c and f"{inference}/.spec.json" in c
        )
        step = int(Path(f"/proc/{launcher}/stat").read_text().rpartition(")")[2].split()[1])
        assert "measure.py" in _read(Path(f"/proc/{step}/cmdline"))
        rank1 = next(
            p
            for p in ranks[training]
            if b"RANK=1" in _read(Path(f"/proc/{p}/environ")).encode().split(b"\0")
        )
        t0 = time.monotonic()
        os.kill(step, signal.SIGTERM)
        os.kill(rank1, signal.SIGKILL)
        out, _ = run.communicate(timeout=SNAKEMAKE_TIMEOUT_S)
        stopped_after = time.monotonic() - t0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=60)
    assert run.returncode != 0
    print(f"both jobs stopped and Snakemake exited {stopped_after:.1f} s after the signals")
    # Bound: kill_grace_s for the SIGTERMed job; torchrun's own 30 s grace for its ranks at most.
    assert stopped_after < PP2["limits"]["kill_grace_s"] + 30, stopped_after
    assert_nothing_left(wf, PP2_JOBS)
    inference_log = (wf / log_of(inference)).read_text()
    assert "JobInterrupted" in inference_log and "interrupted (got SIGTERM)" in inference_log
    training_log = (wf / log_of(training)).read_text()
    assert "JobFailed" in training_log and "exited" in training_log
    rerun = snakemake(wf, write_config(wf, "pp2.yaml", PP2), "--cores", "4", *targets)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for job_dir in PP2_JOBS:
        assert (wf / job_dir / "job.json").is_file()
        assert (pd.read_parquet(wf / job_dir / "shards.parquet")["status"] == "ok").all()


@contextlib.contextmanager
def full_filesystem(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` (root only); unmounted afterwards whatever happens."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"the ENOSPC test needs to mount a tmpfs (root): mount failed with "
            f"{proc.returncode}: {proc.stderr.strip()}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@pytest.mark.timeout(SNAKEMAKE_TIMEOUT_S)
def test_enospc_shard_write_fails_job_with_path_publishes_nothing(wf, tmp_path):
    wf, _, _ = wf
    model = wf / "resources" / "models" / "tiny-llama"
    assert (model / "config.json").is_file()
    with full_filesystem(tmp_path / "small", "16k") as small:
        out = small / "job"
        spec = job_spec(
            workload={"iterations": 1, "warmup_iterations": 0},
            measurement={"prefill_pass": False},
        )
        job_dir = JobDir(str(out))
        log_path = tmp_path / "job.log"
        with open(log_path, "w") as log, pytest.raises(JobFailed, match="exited 1") as info:
            run_job(spec, job_dir, str(model), limits(), log, cpus=1)
        text = log_path.read_text()
        assert "nothing of it was published" in str(info.value)
        m = re.search(r"OSError: \[Errno 28\] cannot write (\S+): No space left on device", text)
        assert m, text[-3000:]
        assert m.group(1).startswith(str(out / ".staging-")) and m.group(1).endswith(".parquet")
        assert sorted(p.name for p in out.iterdir()) == [".spec.json"]  # nothing published
        assert procs.marked(LaunchedJob.load(job_dir.spec_file).job_id) == []


@pytest.mark.timeout(120)
def test_enospc_merge_writes_nothing(tmp_path):
    from test_merged_dataset import make_sweep

    records = make_sweep(tmp_path)
    with full_filesystem(tmp_path / "small", "16k") as small:
        (small / "filler").write_bytes(b"\0" * 8192)
        with pytest.raises(OSError, match=r"cannot write .*: No space left on device") as info:
            results.aggregate(
                agg.job_table_paths(records),
                small / "energy.parquet",
                small / "summary.csv",
                jobs=records,
                environment_out=small / "environment.parquet",
            )
        assert info.value.errno == 28
        assert sorted(p.name for p in small.iterdir()) == ["filler"]

"""The local Slurm cluster (cluster/slurm-local.sh) behaves like the GPU cluster we target.

Needs the ``slurm_cluster`` fixture from ``slurm_fixtures`` (imported by the conftest).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_fixtures import UP_TIMEOUT_S, SlurmCluster, run_script

# States after which a job never changes again (sacct prints e.g. "CANCELLED by 0").
TERMINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
# First fixture use may install packages; this bounds setup + call + teardown of one test.
FIRST_USE_TIMEOUT_S = UP_TIMEOUT_S + 120


def _run(argv: list[str], timeout_s: float = 30) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"{argv} exit {result.returncode}: {result.stderr}"
    return result.stdout


def _sbatch(*args: str) -> str:
    """Submit a job; return its id."""
    return _run(["sbatch", "--parsable", *args]).strip().split(";")[0]


def _sacct_when_done(job_id: str, timeout_s: float) -> tuple[str, str]:
    """Poll sacct until the job is in a terminal state; return (AllocTRES, State)."""
    deadline = time.monotonic() + timeout_s
    tres = state = ""
    while time.monotonic() < deadline:
        out = _run(["sacct", "-j", job_id, "-o", "JobID,AllocTRES%60,State", "-P", "-n"])
        for line in out.splitlines():
            jid, tres, state = line.split("|")
            if jid == job_id and state.split()[0] in TERMINAL_STATES:
                return tres, state
        time.sleep(0.5)
    pytest.fail(f"job {job_id} not finished after {timeout_s}s (last state {state or '?'})")


@pytest.mark.slurm
@pytest.mark.timeout(FIRST_USE_TIMEOUT_S)
def test_gpu_job_gets_two_gpus(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job_id = _sbatch(
        "--gpus=2",
        f"--partition={slurm_cluster.default_partition}",
        f"--output={out}",
        "--wrap",
        'echo "CVD=${CUDA_VISIBLE_DEVICES:-}"',
    )

    tres, state = _sacct_when_done(job_id, timeout_s=60)

    assert state == "COMPLETED"
    assert "gres/gpu=2" in tres.split(","), tres
    visible = out.read_text().strip().removeprefix("CVD=")
    assert len(visible.split(",")) == 2, f"CUDA_VISIBLE_DEVICES={visible!r}"


@pytest.mark.slurm
@pytest.mark.timeout(FIRST_USE_TIMEOUT_S)
def test_third_two_gpu_job_waits_for_gpus(slurm_cluster: SlurmCluster) -> None:
    jobs = [
        _sbatch("--gpus=2", "--output=/dev/null", "--wrap", "sleep 60")
        for _ in range(slurm_cluster.gpus_per_node // 2 + 1)
    ]
    try:
        deadline = time.monotonic() + 30
        states: list[str] = []
        while time.monotonic() < deadline:
            out = _run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%T|%r"])
            states = sorted(out.split())
            if states == ["PENDING|Resources", "RUNNING|None", "RUNNING|None"]:
                break
            time.sleep(0.5)
        assert states == ["PENDING|Resources", "RUNNING|None", "RUNNING|None"]
    finally:
        _run(["scancel", *jobs])


@pytest.mark.slurm
@pytest.mark.timeout(FIRST_USE_TIMEOUT_S)
def test_up_is_idempotent(slurm_cluster: SlurmCluster) -> None:
    again = run_script("up", timeout_s=60)
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    assert run_script("status", timeout_s=60).returncode == 0


@pytest.mark.slurm
@pytest.mark.timeout(FIRST_USE_TIMEOUT_S)
def test_up_survives_a_stale_pid_file(slurm_cluster: SlurmCluster) -> None:
    """A pid file naming a dead process (left by a restarted machine) must not hide our server."""
    pid_file = slurm_cluster.state / "mariadbd.pid"
    real_pid = pid_file.read_text()
    pid_file.write_text(f"{os.getpid()}\n")  # a live pid, but not a MariaDB server
    try:
        again = run_script("up", timeout_s=60)
        assert again.returncode == 0, again.stderr
        assert "already up" in again.stderr
        assert pid_file.read_text().strip() == real_pid.strip()
    finally:
        pid_file.write_text(real_pid)

"""One job per GPU outside Slurm: claims by GPU UUID (energysweep.launch.gpu_claims)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import pytest

from energysweep.launch import gpu_claims
from energysweep.launch.gpu_claims import ClaimTimeout, Gpu

GPUS = [Gpu(i, f"GPU-{i:08x}-1111-2222-3333-{i:012x}") for i in range(3)]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def _hold_in_another_process(directory, gpus, count):
    """A process that claims ``count`` of ``gpus`` and holds them until killed."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from energysweep.launch.gpu_claims import Gpu, claimed
        gpus = [Gpu(i, u) for i, u in {[(g.index, g.uuid) for g in gpus]!r}]
        with claimed(gpus, {count}, sys.stderr, 5, "other job", directory=Path({str(directory)!r})):
            print("held", flush=True)
            sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_jobs_claim_distinct_gpus_and_a_claim_dies_with_its_process(tmp_path):
    other = _hold_in_another_process(tmp_path, GPUS, 2)  # GPUs 0 and 1
    try:
        log = io.StringIO()
        with gpu_claims.claimed(GPUS, 1, log, 5, "job B", directory=tmp_path) as mine:
            assert mine == [GPUS[2]]  # the free one
            assert f"{GPUS[2].uuid} (index 2)" in log.getvalue()
            # Nothing left for a third job: it waits (bounded), saying for what and who holds it.
            clock, log3 = Clock(), io.StringIO()
            with pytest.raises(ClaimTimeout, match="other job"):
                with gpu_claims.claimed(
                    GPUS, 1, log3, 3.0, "job C", tmp_path, clock=clock, sleep=clock.sleep
                ):
                    pass
            assert "waiting for 1 free GPU(s) of 3" in log3.getvalue()
            assert "job B" in log3.getvalue() and clock.t >= 3.0
    finally:
        other.kill()  # SIGKILL: no handler runs; the kernel drops its locks
        other.wait(timeout=10)
    with gpu_claims.claimed(GPUS, 3, io.StringIO(), 5, "job D", directory=tmp_path) as mine:
        assert mine == GPUS


def test_a_job_larger_than_the_node_fails_at_once(tmp_path):
    with pytest.raises(ClaimTimeout, match="computes on 4 GPUs but this node has 3"):
        with gpu_claims.claimed(GPUS, 4, io.StringIO(), 5, "job", directory=tmp_path):
            pass


def test_job_env_names_the_claimed_gpus_and_slurm_allocations_are_kept(
    tmp_path, monkeypatch, fake_nvml
):
    import fake_pynvml

    monkeypatch.setenv(gpu_claims.ENV, str(tmp_path))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    mod = fake_nvml(fake_pynvml.h100s(4))
    other = _hold_in_another_process(
        tmp_path, [Gpu(i, g.uuid) for i, g in enumerate(mod.fake_gpus)], 1
    )
    try:
        env = {"CUDA_VISIBLE_DEVICES": "0,2,3"}  # the step may use these; GPU 0 is taken
        with gpu_claims.job_gpus("cuda", 2, env, io.StringIO(), 5, "job") as out:
            assert out["CUDA_VISIBLE_DEVICES"] == "2,3"
            assert out["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        with gpu_claims.job_gpus("cpu", 2, env, io.StringIO(), 5, "job") as out:
            assert out is env  # no GPU to claim
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        with gpu_claims.job_gpus("cuda", 2, env, io.StringIO(), 5, "job") as out:
            assert out is env  # the allocation is the job's
    finally:
        other.kill()
        other.wait(timeout=10)
    assert gpu_claims.node_gpu_count({"device": "cuda"}) == 4
    assert gpu_claims.node_gpu_count({"device": "cpu"}) == 0
    assert gpu_claims.node_gpu_count({"device": "emulated", "emulated": {"node_gpus": 3}}) == 3

import sys

import pytest

from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import Placement
from energysweep.launch.argv import build_argv, build_env
from energysweep.launch.ports import rendezvous_port


def test_single_rank_runs_directly():
    argv = build_argv(Placement(ParallelLayout(), "pytorch", 8), "s.json", python="py")
    assert argv == ["py", "-m", "energysweep.run", "--spec", "s.json"]


def test_one_node_torchrun_standalone():
    argv = build_argv(Placement(ParallelLayout(tp=2, dp=2), "pytorch", 8), "s.json", python="py")
    assert argv == [
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "-m",
        "energysweep.run",
        "--spec",
        "s.json",
    ]


def test_multi_node_one_torchrun_per_node_c10d_port_from_job_id():
    argv = build_argv(
        Placement(ParallelLayout(tp=8, pp=2, dp=2), "pytorch", 16),
        "s.json",
        python="py",
        slurm_job_id="123456",
        head_node="dgx-01",
    )
    assert argv[:6] == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1"]
    i = argv.index("torch.distributed.run")
    assert argv[i + 1 :] == [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "16",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"dgx-01:{rendezvous_port('123456')}",
        "--rdzv-id",
        "123456",
        "-m",
        "energysweep.run",
        "--spec",
        "s.json",
    ]
    assert 15000 <= rendezvous_port(123456) < 30000
    assert rendezvous_port(1) != rendezvous_port(2)


def test_multi_node_needs_slurm():
    with pytest.raises(ValueError, match="Slurm job id"):
        build_argv(Placement(ParallelLayout(tp=16, dp=2), "pytorch", 16), "s.json")


def test_env_pci_order_and_threads():
    env = build_env("pytorch", base={"X": "1"}, threads=3)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["X"] == "1"


def test_every_thread_count_snakemake_set_for_the_job_is_the_ranks_share():
    """Snakemake exports the job's threads as OMP, MKL, OpenBLAS, GOTO, vecLib and numexpr
    counts; a rank (or a vLLM server worker bound to one core) that kept MKL's 2 ran its decode
    steps ~70x slower on 2 cores."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")  # fmt: skip
    job = dict.fromkeys(names, "2")
    env = build_env("pytorch", base=job, threads=1)
    assert {v: env[v] for v in job} == dict.fromkeys(job, "1")


def test_default_python_is_this_interpreter():
    assert build_argv(Placement(ParallelLayout(), "pytorch", 8), "s")[0] == sys.executable

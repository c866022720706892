"""TensorRT-LLM at the boundary: the exact LLM kwargs, SamplingParams, environment and argv.

TensorRT-LLM cannot be installed here (its PyPI entry downloads from NVIDIA's index) nor run
without a GPU. The mapping is pinned here and the flow runs against a fake module with the LLM
API's names (tests/fake_engines.py); a contract test checks the names where the package exists.
"""

from __future__ import annotations

import os
import sys

import fake_engines
import pytest
from jobspec import job_spec, launched_job

from energysweep import dist
from energysweep.backends import request_log, trtllm_backend
from energysweep.energy import GpuReading
from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import Placement
from energysweep.launch import argv as launch_argv
from energysweep.launch import replica as launch_replica
from energysweep.tables.status import EnergyStatus

# A tensorrt-llm job as the workflow builds it (validated config, JobSpec.from_config).
JOB = {
    "backend": "tensorrt-llm",
    "dtype": "bfloat16",
    "batch_sizes": (1, 64, 256),
    "workload": {"max_input_tokens": 512, "output_tokens": 256},
}
PY = "/envs/trt/bin/python"
ENTRY = ["-m", "energysweep.run", "--spec", "s.json"]


def argv_for(layout, gpus_per_node=16, **kw):
    placement = Placement(layout, "tensorrt-llm", gpus_per_node)
    return launch_argv.build_argv(placement, "s.json", python=PY, **kw)


def kwargs_for(tp=1, pp=1):
    job = job_spec(layout=ParallelLayout(tp, pp), **JOB)
    return trtllm_backend.llm_kwargs(job, "/models/llama")


# --------------------------------------------------------------------------- layouts (pinned)
def test_tp8_one_node_direct():
    layout = ParallelLayout(tp=8)
    assert kwargs_for(tp=8) == {
        "model": "/models/llama",
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 1,
        "dtype": "bfloat16",
        "skip_tokenizer_init": True,
        "max_batch_size": 256,
        "max_seq_len": 512 + 256,
    }
    # One plain process; the LLM API spawns the 8 MPI workers itself.
    assert argv_for(layout) == [PY, *ENTRY]
    assert Placement(layout, "tensorrt-llm", 16).launch_mode == "direct"
    assert Placement(layout, "tensorrt-llm", 16).processes == (1, 8)
    assert Placement(layout, "tensorrt-llm", 16).coords(0) == layout.coords(0)  # writer, dp 0
    env = launch_argv.build_env("tensorrt-llm", base={}, slurm_job_id="9")
    assert not any(k.startswith("VLLM_") for k in env)


def test_tp4_pp2_over_two_nodes_is_srun_mpi_with_tp_times_pp_ranks():
    layout = ParallelLayout(tp=4, pp=2)
    assert kwargs_for(tp=4, pp=2)["tensor_parallel_size"] == 4
    assert kwargs_for(tp=4, pp=2)["pipeline_parallel_size"] == 2
    argv = argv_for(layout, gpus_per_node=4, slurm_job_id="77", head_node="n1")
    assert argv == [
        "srun",
        "--mpi=pmix",
        "--nodes",
        "2",
        "--ntasks-per-node",
        "4",
        "--kill-on-bad-exit=1",
        "/envs/trt/bin/trtllm-llmapi-launch",
        PY,
        *ENTRY,
    ]
    nodes = int(argv[argv.index("--nodes") + 1])
    assert nodes * int(argv[argv.index("--ntasks-per-node") + 1]) == layout.tp * layout.pp
    assert Placement(layout, "tensorrt-llm", 4).launch_mode == "mpi"
    # Our code runs in MPI rank 0 only: one launcher, 8 GPU workers.
    assert Placement(layout, "tensorrt-llm", 4).processes == (1, 8)


def test_multi_node_replicas_with_dp_are_skipped_not_run():
    layout = ParallelLayout(tp=4, pp=2, dp=2)
    reasons = Placement(layout, "tensorrt-llm", 4).unsupported()
    assert reasons and "dp=2" in reasons[0]
    with pytest.raises(ValueError, match="cannot run"):
        argv_for(layout, gpus_per_node=4)


def test_dp2_one_node_is_one_process_per_replica_on_disjoint_gpus(monkeypatch):
    layout = ParallelLayout(tp=2, dp=2)
    assert argv_for(layout) == [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "energysweep.launch.replica",
        "--replica-gpus",
        "2",
        "--spec",
        "s.json",
    ]
    assert Placement(layout, "tensorrt-llm", 16).processes == (2, 4)
    assert [Placement(layout, "tensorrt-llm", 16).coords(r).dp_rank for r in range(2)] == [0, 1]
    assert all(Placement(layout, "tensorrt-llm", 16).coords(r).is_writer for r in range(2))
    assert launch_argv.replica_visible_devices("4,5,6,7", 0, 2, 2) == "4,5"
    assert launch_argv.replica_visible_devices("4,5,6,7", 1, 2, 2) == "6,7"
    assert launch_argv.replica_visible_devices(None, 1, 2, 2) == "2,3"
    with pytest.raises(ValueError, match="need 4 GPUs"):
        launch_argv.replica_visible_devices("0,1,2", 1, 2, 2)
    # The replica step sets its GPUs, then becomes the run (same pid under torchrun).
    execs = []
    monkeypatch.setattr(os, "execv", lambda exe, args: execs.append(args))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c,GPU-d")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    launch_replica.replica_main(["--replica-gpus", "2", "--spec", "s.json"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-c,GPU-d"
    assert execs == [[sys.executable, *ENTRY]]


def test_sampling_always_sets_max_tokens():
    """max_tokens defaults to 32 in TensorRT-LLM: it must always be the workload's length."""
    assert trtllm_backend.sampling_kwargs(256) == {
        "max_tokens": 256,
        "min_tokens": 256,
        "ignore_eos": True,
        "top_k": 1,
        "detokenize": False,
        "return_perf_metrics": True,
    }
    assert fake_engines.TrtSamplingParams().max_tokens == 32


# ------------------------------------------------------------- energy of multi-node replicas
class FixedSource:
    name = "nvml"

    def begin(self):
        pass

    def end(self):
        return [
            GpuReading(f"GPU-{i}", i, None, None, 1000.0, EnergyStatus.MEASURED, "nvml")
            for i in range(4)
        ]

    def close(self):
        pass


def test_gpus_on_other_nodes_are_reported_unavailable_never_summed_as_total():
    assert trtllm_backend.unreadable_gpus(ParallelLayout(tp=8), 16) == 0
    assert trtllm_backend.unreadable_gpus(ParallelLayout(tp=4, pp=2), 4) == 4
    backend = object.__new__(trtllm_backend.TrtllmBackend)
    backend.ctx = type("C", (), {"layout": ParallelLayout(tp=4, pp=2)})()
    backend.gpus_per_node = 4
    src = backend.wrap_energy_source(FixedSource())
    readings = src.end()
    assert len(readings) == 8
    missing = [r for r in readings if r.gpu_uuid is None]
    assert len(missing) == 4
    assert all(r.energy_mj is None and r.status == "unavailable" for r in missing)
    assert "another node" in missing[0].detail
    backend.gpus_per_node = 16
    inner = FixedSource()
    assert backend.wrap_energy_source(inner) is inner


# ---------------------------------------------------------- flow against a fake TensorRT-LLM
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from energysweep.sweep.tinymodel import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture
def fake_trt(monkeypatch):
    for name, mod in fake_engines.make_tensorrt_llm().items():
        monkeypatch.setitem(sys.modules, name, mod)
    return fake_engines.TrtLLM


def test_replica_generates_exact_tokens_and_logs_perf_metrics(fake_trt, model_dir, tmp_path):
    job = launched_job(
        tmp_path,
        model_dir,
        **{**JOB, "workload": {"max_input_tokens": 8, "output_tokens": 4}},
        layout=ParallelLayout(tp=2),
    )
    ctx = dist.RankContext(
        placement=job.placement,
        rank=0,
        local_rank=0,
        world_size=1,
        coords=job.placement.coords(0),
        device="cuda:0",
        host="h",
        pid=os.getpid(),
        model_dir=model_dir,
        dtype=job.dtype,
        seed=job.seed,
        max_input_tokens=job.workload.max_input_tokens,
    )
    backend = trtllm_backend.load_backend(ctx, job)
    llm = fake_trt.instances[-1]
    assert llm.kwargs == trtllm_backend.llm_kwargs(job, model_dir)
    batch = backend.encode(["one two three four five six seven eight nine", "x"])
    out = backend.generate(batch, 4)
    assert [len(t) for t in out] == [4, 4]
    inputs, params = llm.calls[-1]
    assert inputs == batch and params.max_tokens == 4 and params.return_perf_metrics
    backend.close()
    assert llm.shut_down
    rows = request_log.read(job.outputs.requests).to_pylist()
    assert len(rows) == 2 and rows[0]["backend"] == "tensorrt-llm"
    assert rows[0]["ttft_s"] == pytest.approx(0.05)
    assert rows[0]["tpot_s"] == pytest.approx(0.02)


def test_missing_perf_metrics_are_null():
    assert trtllm_backend.request_timing(fake_engines.TrtCompletion(0, [1, 2])) is None


# ------------------------------------------------ contract test against the real TensorRT-LLM
@pytest.mark.gpu
def test_contract_names():
    tllm = pytest.importorskip("tensorrt_llm", reason="tensorrt_llm not installed (GPU only)")
    import inspect

    sp = tllm.SamplingParams(**trtllm_backend.sampling_kwargs(16))
    assert (sp.max_tokens, sp.min_tokens, sp.ignore_eos) == (16, 16, True)
    from tensorrt_llm.llmapi import LlmArgs

    fields = set(getattr(LlmArgs, "model_fields", {})) or set(
        inspect.signature(tllm.LLM.__init__).parameters
    )
    kw = trtllm_backend.llm_kwargs(job_spec(layout=ParallelLayout(tp=4, pp=2), **JOB), "/m")
    assert set(kw) <= fields, set(kw) - fields

"""vLLM at the boundary: the exact LLM kwargs, SamplingParams, environment and argv per layout.

The mapping is pinned here; the flow (tokenise, submit, writer, request log) runs against a fake
module with vLLM's names (tests/fake_engines.py); and the contract test at the bottom checks every
name we pass, and the fake, against the real vLLM in its own environment (.venv-vllm, built by
`make test`; tests/integration/test_vllm_real.py runs the real engine).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
import subprocess
import sys
from pathlib import Path

import fake_engines
import pytest
import torch
from jobspec import job_spec, launched_job

from energysweep import dist
from energysweep.backends import request_log, vllm_backend
from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import Placement
from energysweep.launch import argv as launch_argv
from energysweep.launch import ports

from conftest import vllm_python

ROOT = Path(__file__).resolve().parents[2]

# A vllm job as the workflow builds it (validated config, JobSpec.from_config).
JOB = {
    "backend": "vllm",
    "dtype": "bfloat16",
    "seed": 7,
    "batch_sizes": (1, 8, 32),
    "workload": {"max_input_tokens": 512, "output_tokens": 256},
    "parallel": {"gpus_per_node": 16},
}
TORCHRUN = ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
ENTRY = ["-m", "energysweep.run", "--spec", "s.json"]


def kwargs_for(tp=1, pp=1, dp=1):
    job = job_spec(layout=ParallelLayout(tp, pp, dp), **JOB)
    return vllm_backend.engine_kwargs(job, "/models/llama", on_gpu=True)


def common_kwargs(tp, pp):
    return {
        "model": "/models/llama",
        "skip_tokenizer_init": True,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "data_parallel_size": 1,
        "distributed_executor_backend": "external_launcher",
        "dtype": "bfloat16",
        "seed": 7,
        "max_num_seqs": 32,
        "max_model_len": 512 + 256,
        "gpu_memory_utilization": 0.9,
        "enforce_eager": False,
        "disable_log_stats": False,
    }


def argv_for(tp=1, pp=1, dp=1, **kw):
    placement = job_spec(layout=ParallelLayout(tp, pp, dp), **JOB).placement
    return launch_argv.build_argv(placement, "s.json", python="py", **kw)


def external_dp_rank(world: int, tp: int, pp: int) -> list[int]:
    """vLLM 0.32's rank layout: arange(world).reshape(-1, dp, pp, tp) (ExternalDP x DP x PP x TP,
    vllm/distributed/parallel_state.py initialize_model_parallel), with data_parallel_size=1."""
    grid = torch.arange(world).reshape(-1, 1, pp, tp)
    return [int((grid == r).nonzero()[0][0]) for r in range(world)]


# --------------------------------------------------------------------------- layouts (pinned)
def test_tp4():
    layout = ParallelLayout(tp=4)
    assert kwargs_for(tp=4) == common_kwargs(4, 1)
    assert argv_for(tp=4) == [*TORCHRUN, "4", *ENTRY]
    assert Placement(layout, "vllm", 16).launch_mode == "torchrun"
    # 4 launcher processes, each one vLLM engine and its own GPU worker (no extra processes).
    assert Placement(layout, "vllm", 16).processes == (4, 4)
    assert layout.writer_ranks() == [0]


def test_tp2_pp2():
    layout = ParallelLayout(tp=2, pp=2)
    assert kwargs_for(tp=2, pp=2) == common_kwargs(2, 2)
    assert argv_for(tp=2, pp=2) == [*TORCHRUN, "4", *ENTRY]
    assert Placement(layout, "vllm", 16).processes == (4, 4)
    assert [layout.coords(r).pp_rank for r in range(4)] == [0, 0, 1, 1]
    assert layout.writer_ranks() == [0]


def test_dp2_with_two_gpus_per_replica():
    layout = ParallelLayout(tp=2, dp=2)
    # No data_parallel_size: the 4-rank world holds 2 independent replicas (vLLM's external DP).
    assert kwargs_for(tp=2, dp=2) == common_kwargs(2, 1)
    assert argv_for(tp=2, dp=2) == [*TORCHRUN, "4", *ENTRY]
    assert Placement(layout, "vllm", 16).processes == (4, 4)
    ours = [layout.coords(r).dp_rank for r in range(4)]
    assert ours == [0, 0, 1, 1] == external_dp_rank(4, tp=2, pp=1)
    assert layout.writer_ranks() == [0, 2]


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 4), (2, 2, 2), (4, 1, 2), (1, 2, 2)])
def test_our_replicas_are_vllms_external_dp_groups(tp, pp, dp):
    layout = ParallelLayout(tp, pp, dp)
    ours = [layout.coords(r).dp_rank for r in range(layout.world_size)]
    assert ours == external_dp_rank(layout.world_size, tp, pp)


def test_one_rank_still_runs_under_torchrun():
    """external_launcher reads RANK/LOCAL_RANK/MASTER_* from the environment even for one rank."""
    assert argv_for() == [*TORCHRUN, "1", *ENTRY]


def test_multi_node_is_one_torchrun_per_node():
    argv = argv_for(tp=8, pp=2, dp=2, slurm_job_id="4242", head_node="dgx-01")
    assert argv[:3] == ["srun", "--nodes", "2"]
    assert "--nproc-per-node" in argv and argv[argv.index("--nproc-per-node") + 1] == "16"


def test_sampling_is_greedy_with_a_fixed_output_length():
    assert vllm_backend.sampling_kwargs(256) == {
        "n": 1,
        "temperature": 0.0,
        "max_tokens": 256,
        "min_tokens": 256,
        "ignore_eos": True,
        "detokenize": False,
    }


def test_engine_options_from_the_config_override_the_schema_defaults():
    engine = {"gpu_memory_utilization": 0.8, "enforce_eager": True, "max_model_len": 4096}
    kw = vllm_backend.engine_kwargs(job_spec(**JOB, engine=engine), "/m", on_gpu=True)
    assert (kw["gpu_memory_utilization"], kw["enforce_eager"], kw["max_model_len"]) == (
        0.8,
        True,
        4096,
    )


# --------------------------------------------------------------------------------- env, ports
ENGINE = job_spec(**JOB).engine


def test_env_port_from_slurm_job_id():
    env = launch_argv.build_env("vllm", base={}, slurm_job_id="123456", engine=ENGINE)
    assert env["VLLM_PORT"] == str(ports.vllm_port(123456))
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_concurrent_jobs_get_disjoint_port_blocks():
    got = [ports.vllm_port(j) for j in range(5_000_000, 5_000_200)]
    assert len(set(got)) == len(got)
    assert all(5000 <= p < 15000 for p in got)
    assert min(abs(a - b) for a in got for b in got if a != b) >= ports.VLLM_PORT_BLOCK
    # Disjoint from the torchrun rendezvous range, so a vLLM socket never takes it.
    assert max(got) + ports.VLLM_PORT_BLOCK <= ports.PORT_BASE


def test_cpu_kv_cache_is_the_engine_option_never_an_inherited_variable():
    """engine.cpu_kvcache_gib reaches vLLM as kv_cache_memory_bytes (fractions of a GiB
    allowed); a VLLM_CPU_KVCACHE_SPACE in the job's environment would override it in vLLM's CPU
    platform, so the ranks do not inherit it."""
    engine = {"cpu_kvcache_gib": 0.0625}
    kw = vllm_backend.engine_kwargs(job_spec(**JOB, engine=engine), "/m", on_gpu=False)
    assert kw["kv_cache_memory_bytes"] == 2**26 and "gpu_memory_utilization" not in kw
    gpu = vllm_backend.engine_kwargs(job_spec(**JOB, engine=engine), "/m", on_gpu=True)
    assert "kv_cache_memory_bytes" not in gpu  # GPUs: gpu_memory_utilization decides
    env = launch_argv.build_env("vllm", base={"VLLM_CPU_KVCACHE_SPACE": "1"}, engine=ENGINE)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_env_port_outside_slurm_is_free():
    port = int(launch_argv.build_env("vllm", base={}, engine=ENGINE)["VLLM_PORT"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # still free: nothing holds it


def test_pytorch_env_has_no_vllm_variables():
    env = launch_argv.build_env("pytorch", base={}, slurm_job_id="1")
    assert not any(k.startswith("VLLM_") for k in env)


# ----------------------------------------------------------------- flow against a fake vLLM
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from energysweep.sweep.tinymodel import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def make_ctx(model_dir, job, rank):
    return dist.RankContext(
        placement=job.placement,
        rank=rank,
        local_rank=rank,
        world_size=job.layout.world_size,
        coords=job.placement.coords(rank),
        device="cpu",
        host="h",
        pid=os.getpid(),
        model_dir=model_dir,
        dtype=job.dtype,
        seed=job.seed,
        max_input_tokens=job.workload.max_input_tokens,
    )


def tp2_rank(model_dir, out, rank: int, output_tokens: int):
    """(job, backend) of rank ``rank`` of a tp=2 vllm job with short prompts."""
    workload = {"max_input_tokens": 8, "output_tokens": output_tokens}
    job = launched_job(out, model_dir, **{**JOB, "workload": workload}, layout=ParallelLayout(tp=2))
    return job, vllm_backend.load_backend(make_ctx(model_dir, job, rank), job)


@pytest.fixture
def fake_vllm(monkeypatch):
    for name, mod in fake_engines.make_vllm().items():
        monkeypatch.setitem(sys.modules, name, mod)
    yield fake_engines.VllmLLM
    gc.unfreeze()  # a backend froze this test process's heap (freeze_heap), not a rank's


# vLLM 0.32.0's error (v1/core/kv_cache_utils.py) for a KV cache that holds fewer tokens than one
# request of max_model_len: its advice, gpu_memory_utilization, does not size a CPU rank's cache.
KV_TOO_SMALL = (
    "To serve at least one request with the model's max seq len (80), (0.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (0.0 GiB). Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend)"
)


def test_a_kv_cache_too_small_on_cpu_names_the_key_that_sizes_it(fake_vllm, model_dir, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    def refuse(self, model, **kwargs):
        raise ValueError(KV_TOO_SMALL)

    monkeypatch.setattr(fake_vllm, "__init__", refuse)
    with pytest.raises(ValueError, match=r"raise engine\.cpu_kvcache_gib") as err:
        tp2_rank(model_dir, tmp_path, 0, output_tokens=5)
    assert "engine.cpu_kvcache_gib is 1" in str(err.value) and KV_TOO_SMALL in str(err.value)
    # Another engine error is the engine's own, untouched.
    monkeypatch.setattr(fake_vllm, "__init__", lambda self, model, **kw: (_ for _ in ()).throw(
        ValueError("unrelated")))  # fmt: skip
    with pytest.raises(ValueError, match="^unrelated$"):
        tp2_rank(model_dir, tmp_path, 0, output_tokens=5)


def test_writer_returns_exact_tokens_and_logs_requests(fake_vllm, model_dir, tmp_path):
    job, backend = tp2_rank(model_dir, tmp_path, 0, output_tokens=5)
    llm = fake_vllm.instances[-1]
    # CPU ranks: no gpu_memory_utilization (the KV cache is engine.cpu_kvcache_gib).
    assert llm.kwargs == vllm_backend.engine_kwargs(job, model_dir, on_gpu=False)
    assert "gpu_memory_utilization" not in llm.kwargs
    assert backend.startup["engine_version"] == fake_engines.VLLM_VERSION
    assert backend.startup["import_s"] >= 0 and backend.startup["engine_init_s"] >= 0
    assert backend.startup["compile_s"] is None  # the fake reports no compile time
    assert backend.fatal_point_errors  # 2 ranks: a failed point must end the job
    batch = backend.encode(["the quick brown fox jumps over the lazy dog " * 3, "hi"])
    assert max(len(ids) for ids in batch) == 8  # truncated to max_input_tokens
    assert backend.input_tokens(batch) == sum(len(ids) for ids in batch)
    out = backend.generate(batch, 5)
    assert [len(t) for t in out] == [5, 5]
    prompts, params = llm.calls[-1]
    assert prompts == [{"prompt_token_ids": ids} for ids in batch]
    assert (params.max_tokens, params.min_tokens, params.ignore_eos) == (5, 5, True)
    backend.close()
    # The engine is left to the rank's exit: vLLM's shutdown collects the heap twice and destroys
    # the whole process group, before energysweep.run's last barrier.
    assert backend.llm is llm
    rows = request_log.read(job.outputs.requests).to_pylist()
    assert [(r["request_index"], r["output_tokens"], r["metrics_status"]) for r in rows] == [
        (0, 5, "measured"),
        (1, 5, "measured"),
    ]
    assert rows[0]["ttft_s"] == pytest.approx(0.05)
    assert rows[0]["tpot_s"] == pytest.approx(0.01)
    assert rows[0]["call_start_ns"] <= rows[0]["call_end_ns"]


def test_the_engine_is_built_over_a_frozen_heap(fake_vllm, model_dir, tmp_path, monkeypatch):
    """vLLM's engine construction collects garbage five times: the rank's heap (torch, vLLM) is
    frozen first, so those collections skip it."""
    frozen = []
    init = fake_vllm.__init__

    def counting(self, model, **kwargs):
        frozen.append(gc.get_freeze_count())
        init(self, model, **kwargs)

    monkeypatch.setattr(fake_vllm, "__init__", counting)
    tp2_rank(model_dir, tmp_path, 0, output_tokens=2)
    assert frozen and frozen[0] > 0


def test_other_tp_ranks_submit_but_return_nothing(fake_vllm, model_dir, tmp_path):
    job, backend = tp2_rank(model_dir, tmp_path, 1, output_tokens=3)
    assert backend.generate(backend.encode(["a b c"]), 3) is None
    assert len(fake_vllm.instances[-1].calls) == 1  # it still took part in the step
    assert backend.requests == []


def test_without_metrics_timings_are_null_not_zero():
    assert vllm_backend.request_timing(None) is None
    stats = fake_engines.RequestStateStats(
        num_generation_tokens=1, first_token_ts=5.0, last_token_ts=5.0, first_token_latency=0.2
    )
    ttft, tpot, _ = vllm_backend.request_timing(stats)
    assert ttft == pytest.approx(0.2) and tpot is None  # one token: no TPOT


def test_a_job_without_engine_section_names_the_fix(fake_vllm, model_dir, tmp_path):
    job = launched_job(tmp_path, model_dir, **JOB)
    bare = dataclasses.replace(job, engine=None)
    with pytest.raises(ValueError, match="carry the config section `engine`"):
        vllm_backend.load_backend(make_ctx(model_dir, bare, 0), bare)


# ------------------------------------------------------- contract test against the real vLLM
@pytest.mark.timeout(600)
def test_contract_with_the_real_vllm():
    """Our engine kwargs, sampling, metrics and env names, and the fake's API, against the real
    vLLM in its own environment (tests/vllm_contract.py; `make test` builds .venv-vllm first)."""
    proc = subprocess.run(
        [vllm_python(), str(ROOT / "tests" / "vllm_contract.py")],
        env={
            **os.environ,
            "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'tests'}:{ROOT / 'tests' / 'integration'}",
        },
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "vllm contract ok: 0.32.0" in proc.stdout


def test_an_empty_request_table_keeps_the_schema(tmp_path):
    request_log.write([], tmp_path / "r.parquet")  # an empty table keeps the schema
    assert request_log.read(tmp_path / "r.parquet").num_rows == 0


def test_an_eager_engine_on_cpu_ranks_compiles_nothing(monkeypatch):
    """vLLM's own torch.compile helpers (tp > 1's embedding mask on CPUs) would compile C++ in
    the first warm-up: TorchDynamo is off on CPU ranks of an eager engine, and only there."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "disable", False)
    assert not vllm_backend.eager_on_cpu(on_gpu=True, enforce_eager=True)
    assert not vllm_backend.eager_on_cpu(on_gpu=False, enforce_eager=False)
    assert torch._dynamo.config.disable is False
    assert vllm_backend.eager_on_cpu(on_gpu=False, enforce_eager=True)
    assert torch._dynamo.config.disable is True
    compiled = torch.compile(lambda x: x + 1)
    assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]  # runs eagerly, nothing compiled


def test_a_rank_unlinks_its_jobs_engine_segments_and_no_others(tmp_path):
    """The rank skips the interpreter's exit, where vLLM's CPU communicator unlinks its segments
    (energysweep.run.entry): close() unlinks the job's own, by their per-job names."""
    from energysweep.job.names import segment_prefix

    mine, other = segment_prefix("a" * 32), segment_prefix("b" * 32)
    names = [f"{mine}-tp:0-[0-1]-cpushm_0", f"{mine}-pp:1-[0-1]-cpushm_1",
             f"{other}-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_0", f"{mine}-notes"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    vllm_backend.unlink_job_segments(mine, shm=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])

"""Contract between energysweep's vLLM backend, the fake vLLM of tests/fake_engines.py and the
real vLLM. Run with the vLLM environment's interpreter (tests/unit/test_vllm_backend.py does, with
PYTHONPATH=src:tests): vLLM cannot be imported in Snakemake's environment.

Import and introspection only (no engine is built). Any drift fails with an AssertionError naming
the field: a renamed engine argument, a metrics field the backend reads, a fake that no longer
looks like the real API.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys


def main() -> int:
    import fake_engines
    import vllm
    import vllm.envs as envs
    from jobspec import job_spec  # tests/integration: the job as the workflow builds it
    from vllm import LLM, SamplingParams
    from vllm.config import CompilationConfig, ParallelConfig
    from vllm.distributed import parallel_state
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.metrics.stats import RequestStateStats

    from energysweep.backends import vllm_backend
    from energysweep.job.layout import ParallelLayout

    assert vllm.__version__ == vllm_backend.TESTED_VERSION == fake_engines.VLLM_VERSION, (
        vllm.__version__,
        vllm_backend.TESTED_VERSION,
        fake_engines.VLLM_VERSION,
    )

    # Engine arguments: every name we pass is an EngineArgs field, and EngineArgs takes them.
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    llm_params = inspect.signature(LLM.__init__).parameters
    for layout in (ParallelLayout(tp=4), ParallelLayout(tp=2, pp=2), ParallelLayout(tp=2, dp=2)):
        job = job_spec(
            layout=layout,
            backend="vllm",
            dtype="bfloat16",
            seed=7,
            batch_sizes=(1, 32),
            workload={"max_input_tokens": 512, "output_tokens": 256},
        )
        for on_gpu in (True, False):
            kw = vllm_backend.engine_kwargs(job, "/models/llama", on_gpu=on_gpu)
            assert set(kw) <= fields, set(kw) - fields
            assert all(k in llm_params or "kwargs" in llm_params for k in kw)
            EngineArgs(**kw)

    # Sampling: our kwargs, and the fake's fields and defaults are the real ones.
    sp = SamplingParams(**vllm_backend.sampling_kwargs(256))
    assert (sp.max_tokens, sp.min_tokens, sp.ignore_eos, sp.temperature, sp.detokenize) == (
        256,
        256,
        True,
        0.0,
        False,
    )
    real_default = SamplingParams()
    for f in dataclasses.fields(fake_engines.VllmSamplingParams):
        assert getattr(real_default, f.name) == f.default, f"SamplingParams.{f.name}"

    # Per-request metrics: the fields the backend reads exist, with the fake's defaults.
    real_stats = {f.name: f for f in dataclasses.fields(RequestStateStats)}
    for f in dataclasses.fields(fake_engines.RequestStateStats):
        assert f.name in real_stats, f"RequestStateStats.{f.name}"
        assert real_stats[f.name].default == f.default, f"RequestStateStats.{f.name} default"
    src = inspect.getsource(vllm_backend.request_timing)
    for name in ("num_generation_tokens", "first_token_ts", "last_token_ts", "first_token_latency"):
        assert name in real_stats and name in src, name

    # Outputs: what the fake's RequestOutput / CompletionOutput carry, the real ones take.
    ro = inspect.signature(RequestOutput.__init__).parameters
    for f in dataclasses.fields(fake_engines.VllmRequestOutput):
        assert f.name in ro, f"RequestOutput.{f.name}"
    co = inspect.signature(CompletionOutput).parameters
    for f in dataclasses.fields(fake_engines.VllmCompletion):
        assert f.name in co, f"CompletionOutput.{f.name}"
    assert "prompt_token_ids" in TokensPrompt.__annotations__

    # LLM.generate and the fake's generate take the same arguments the backend passes.
    gen = inspect.signature(LLM.generate).parameters
    fake_gen = inspect.signature(fake_engines.VllmLLM.generate).parameters
    for name in ("prompts", "sampling_params", "use_tqdm"):
        assert name in gen and name in fake_gen, name
    assert gen["use_tqdm"].kind == fake_gen["use_tqdm"].kind == inspect.Parameter.KEYWORD_ONLY

    # Teardown, start-up timing and environment variables energysweep uses.
    assert callable(parallel_state.destroy_model_parallel)
    assert "compilation_time" in {f.name for f in dataclasses.fields(CompilationConfig)}
    assert {
        "VLLM_PORT",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
    } <= set(envs.environment_variables)

    # external_launcher with data_parallel_size=1 builds a tp*pp world per replica.
    os.environ["RANK"] = "0"
    pc = ParallelConfig(
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        data_parallel_size=1,
        distributed_executor_backend="external_launcher",
    )
    assert pc.world_size == 4
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    shared_memory_names()
    worker_titles()
    server_arguments(job_spec)
    kv_cache_errors()
    print("vllm contract ok:", vllm.__version__)
    return 0


def server_arguments(job_spec) -> None:
    """The server's command from the registry's template (energysweep.launch.server) parses with
    vLLM's own server parser, on CPU (the KV cache as kv_cache_memory_bytes) and on GPU."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from energysweep.job.layout import ParallelLayout
    from energysweep.launch.server import ServerOptions, server_argv

    engine = dataclasses.replace(job_spec(backend="vllm").engine, cpu_kvcache_gib=0.0625)
    for on_gpu in (False, True):
        o = ServerOptions("vllm", "/env/bin/python", "/models/m", ParallelLayout(tp=2), 8, 80,
                          "float32", 0, engine, on_gpu)  # fmt: skip
        argv = server_argv(o, 31000, "es-job")
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], argv
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
        assert (args.model, args.port, args.tensor_parallel_size, args.max_num_seqs) == (
            "/models/m", 31000, 2, 8)  # fmt: skip
        assert args.kv_cache_memory_bytes == (None if on_gpu else 2**26), args.kv_cache_memory_bytes


def kv_cache_errors() -> None:
    """The texts of vLLM's KV-cache-too-small errors, which the registry's cpu_error_hints
    match to name engine.cpu_kvcache_gib, are still the ones vLLM raises."""
    from vllm.v1.core import kv_cache_utils

    from energysweep.job.backends import backend

    src = inspect.getsource(kv_cache_utils._check_enough_kv_cache_memory)
    for text, _ in backend("vllm").cpu_error_hints:
        assert text in src, text


def shared_memory_names() -> None:
    """The CPU communicator's segment names (issue 24): why the backend renames them, and that
    the renaming gives every job its own.

    Under external_launcher the init method is ``env://``, so the CPU worker's VLLM_DIST_IDENT is
    ``//`` and vLLM alone names every job's tp group ``//-tp:0-[0-1]-cpushm``; with the backend's
    wrapper two jobs get two names, the same on every rank of a job.
    """
    from types import SimpleNamespace

    from vllm.distributed.device_communicators import cpu_communicator
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    from energysweep.backends import vllm_backend
    from energysweep.job.names import segment_prefix

    os.environ.update(RANK="0", LOCAL_RANK="0")
    init_method = ExecutorWithExternalLauncher._distributed_args(None)[0]
    assert init_method == "env://", init_method
    worker = inspect.getsource(__import__("vllm.v1.worker.cpu_worker", fromlist=["x"]))
    assert 'os.environ["VLLM_DIST_IDENT"] = (' in worker  # overwritten: no knob for a job
    os.environ["VLLM_DIST_IDENT"] = init_method.split(":")[-1]
    shm = cpu_communicator._CPUSHMDistributed
    group = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    assert shm.make_group_name(group) == "//-tp:0-[0-1]-cpushm"  # the same for every job
    a, b = segment_prefix("a" * 32), segment_prefix("b" * 32)
    assert vllm_backend.name_segments_per_job(a)
    name_a = shm.make_group_name(group)
    assert vllm_backend.name_segments_per_job(b)  # a second job in this process: its own name
    name_b = shm.make_group_name(group)
    assert (name_a, name_b) == (f"{a}-tp:0-[0-1]-cpushm", f"{b}-tp:0-[0-1]-cpushm")
    # The consistency check every rank runs calls the same (wrapped) function.
    comm = cpu_communicator.CpuCommunicator
    check = inspect.getsource(comm._all_group_ranks_share_shm_group_name)
    assert "_CPUSHMDistributed.make_group_name(self)" in check


def worker_titles() -> None:
    """The served engine's process titles, which a serving job's ``gpu_pids`` parses
    (energysweep.launch.server.worker_gpu): a worker's ``VLLM::Worker[_PP<p>][_TP<t>]``, set
    from its parallel groups, under its engine core's ``VLLM::EngineCore_DP<d>``."""
    from types import SimpleNamespace
    from unittest import mock

    from vllm.v1.engine import core
    from vllm.v1.executor import multiproc_executor as mp

    from energysweep.launch.server import worker_gpu

    def group(size: int, rank: int):
        return lambda: SimpleNamespace(world_size=size, rank_in_group=rank)

    titles: list[str] = []
    groups = {n: group(1, 0) for n in dir(mp) if n.startswith("get_") and n.endswith("_group")}
    groups.update(get_pp_group=group(2, 1), get_tp_group=group(2, 1))
    with mock.patch.multiple(
        mp,
        **groups,
        model_parallel_is_initialized=lambda: True,
        set_process_title=lambda name, suffix="": titles.append(f"VLLM::{name}"),
        decorate_logs=lambda *a, **k: None,
    ):
        mp.WorkerProc.setup_proc_title_and_log_prefix(enable_ep=False)
    assert titles == ["VLLM::Worker_PP1_TP1"], titles
    assert worker_gpu(titles[0], "VLLM::EngineCore_DP1", tp=2, pp=2) == 7
    # One engine core per DP replica, titled with its rank (the worker's parent).
    assert 'f"EngineCore_DP{dp_rank}"' in inspect.getsource(core)


if __name__ == "__main__":
    sys.exit(main())

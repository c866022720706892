"""vLLM backend: every torchrun rank is one vLLM engine (``external_launcher``), any tp x pp x dp.

How a layout maps onto vLLM (checked against vLLM 0.32.0's source, see docs/backends.md):
- ``torchrun --nproc-per-node tp*pp*dp`` starts every rank (energysweep.launch, also for one
  rank: the executor reads RANK/LOCAL_RANK/MASTER_* from the environment);
- ``LLM(tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=1,
  distributed_executor_backend="external_launcher")`` in every rank: each rank runs one worker
  in-process on its own GPU and reuses the process group energysweep.dist started;
- DP: vLLM lays ranks out as ExternalDP x DP x PP x TP (tp innermost, as
  :class:`energysweep.grid.ParallelLayout`), so with ``data_parallel_size=1`` a world of
  tp*pp*dp ranks holds dp *independent* replicas ("every dp rank can generate independently").
  Prompts are split by energysweep.run as for PyTorch, and all ranks of a replica submit the same
  batch. vLLM's own DP (``data_parallel_size > 1`` or VLLM_DP_SIZE) is for MoE models: in one
  process it raises, and via VLLM_DP_* it refuses dense models;
- PP: vLLM broadcasts the last stage's output to every PP rank, so the writer (stage 0) returns
  the tokens; under this executor PP runs one batch at a time (no micro-batch overlap);
- the same seed on every rank; greedy decoding; ``ignore_eos`` and ``min_tokens = max_tokens =
  workload.output_tokens`` so every request generates exactly that many tokens;
- ``disable_log_stats=False`` so ``RequestOutput.metrics`` (TTFT, first/last token timestamps)
  exists; those go to requests.parquet (energysweep.backends.request_log).

Energy: like PyTorch, every rank measures its own GPU (energysweep.run), so energy counts agree
across backends. vLLM is imported only when a job loads it.
"""

from __future__ import annotations

from energysweep.backends.engine_common import EngineBackend, JobOptions, job_options, spec_of
from energysweep.grid import ParallelLayout

TESTED_VERSION = "0.32.0"  # EngineArgs / SamplingParams field names checked against this
METRICS_SOURCE = "vllm RequestOutput.metrics (first_token_latency, first/last_token_ts)"


def engine_kwargs(layout: ParallelLayout, model_dir: str, opts: JobOptions) -> dict:
    """Keyword arguments of ``vllm.LLM(...)`` (all are ``EngineArgs`` fields) for one rank."""
    return {
        "model": model_dir,
        # We pass token ids and never read text back: vLLM needs no tokenizer of its own.
        "skip_tokenizer_init": True,
        "tensor_parallel_size": layout.tp,
        "pipeline_parallel_size": layout.pp,
        # dp replicas are vLLM's "external DP": the world is tp*pp*dp ranks, dp independent groups.
        "data_parallel_size": 1,
        "distributed_executor_backend": "external_launcher",
        "dtype": opts.dtype,
        "seed": opts.seed,
        "max_num_seqs": opts.max_batch_size,
        "max_model_len": opts.max_model_len,
        "gpu_memory_utilization": float(opts.engine["gpu_memory_utilization"]),
        "enforce_eager": bool(opts.engine["enforce_eager"]),
        "disable_log_stats": False,
    }


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


class VllmBackend(EngineBackend):
    """One rank of a vLLM replica; the replica's writer returns the token ids."""

    name = "vllm"

    def __init__(self, ctx, opts: JobOptions, spec: dict):
        super().__init__(ctx, opts)
        from vllm import LLM, SamplingParams

        self.spec = spec
        self.llm = LLM(**engine_kwargs(ctx.layout, ctx.model_dir, opts))
        self._sampling_cls = SamplingParams

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
        self.write_requests(self.spec)
        del self.llm
        try:
            # vLLM's TP/PP groups; the world group stays for energysweep.run's last barrier.
            from vllm.distributed.parallel_state import destroy_model_parallel

            destroy_model_parallel()
        except Exception as exc:  # teardown must not hide the job's result
            print(f"vllm teardown: {type(exc).__name__}: {exc}")


def load_backend(ctx) -> VllmBackend:
    spec = spec_of(ctx)
    return VllmBackend(ctx, job_options(spec), spec)

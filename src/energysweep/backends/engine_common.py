"""What the engine backends (vLLM, TensorRT-LLM) share: job options, tokenisation, request log.

Both engines get exactly the token ids the PyTorch backend generates from (the checkpoint's own
Hugging Face tokenizer, truncated to ``workload.max_input_tokens``, special tokens added), and
both must return exactly ``workload.output_tokens`` new tokens per request (EOS ignored), so a
grid point means the same work on every backend.

The job options come from the job spec, which run.py hands over as ``ctx.extra["spec"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from energysweep.backends import request_log
from energysweep.backends.base import Backend

# The defaults of config section ``engine:`` (config/config.schema.yaml, the same values); used
# where a spec carries no ``engine`` (one built without the workflow, e.g. in a test).
ENGINE_DEFAULTS = {
    "gpu_memory_utilization": 0.9,  # vLLM on GPUs: fraction of each GPU's memory for weights + KV
    "cpu_kvcache_gib": 1,  # vLLM on CPUs: KV cache GiB per rank (VLLM_CPU_KVCACHE_SPACE)
    "enforce_eager": False,  # vLLM: True disables CUDA graphs / torch.compile
    "max_model_len": None,  # None: max_input_tokens + output_tokens
}


@dataclass(frozen=True)
class JobOptions:
    """The settings an engine is built with, taken from one job spec."""

    job_id: str
    backend: str
    dtype: str
    seed: int
    batch_sizes: tuple[int, ...]
    max_input_tokens: int
    output_tokens: int
    engine: dict = field(default_factory=dict)

    @property
    def max_batch_size(self) -> int:
        """The engine is built once per job, so it must admit the largest swept batch."""
        return max(self.batch_sizes)

    @property
    def max_model_len(self) -> int:
        """Longest sequence a request can reach: prompt (truncated) + fixed output."""
        override = self.engine.get("max_model_len")
        return int(override) if override else self.max_input_tokens + self.output_tokens


def job_options(spec: dict) -> JobOptions:
    """JobOptions from a job spec (the dict rules/common.smk get_job_spec builds)."""
    wl = spec["workload"]
    return JobOptions(
        job_id=str(spec.get("job_id", "")),
        backend=spec["job"]["backend"],
        dtype=spec["dtype"],
        seed=int(spec["seed"]),
        batch_sizes=tuple(int(b) for b in spec["batch_sizes"]),
        max_input_tokens=int(wl["max_input_tokens"]),
        output_tokens=int(wl["output_tokens"]),
        engine={**ENGINE_DEFAULTS, **(spec.get("engine") or {})},
    )


def spec_of(ctx) -> dict:
    """The job spec run.py passed in ``ctx.extra["spec"]``; a clear error if it did not."""
    spec = (ctx.extra or {}).get("spec")
    if spec is None:
        raise RuntimeError(
            "engine backends need the job spec: energysweep.run must call "
            "dist.make_context(..., extra={'spec': spec})"
        )
    return spec


class EngineBackend(Backend):
    """Tokenisation and the per-request log; subclasses add the engine itself.

    ``encode`` returns one list of token ids per prompt (no padding: engines batch ragged
    prompts themselves), which is also what ``generate`` submits.
    """

    name = "engine"
    writes_requests = True  # close() writes requests.parquet (run.py writes an empty one else)

    def __init__(self, ctx, opts: JobOptions):
        from transformers import AutoTokenizer

        self.ctx = ctx
        self.opts = opts
        self.tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
        self.requests: list[request_log.RequestRow] = []
        self._calls = 0

    def encode(self, prompts: list[str]) -> list[list[int]]:
        enc = self.tokenizer(prompts, truncation=True, max_length=self.opts.max_input_tokens)
        return [list(ids) for ids in enc["input_ids"]]

    @staticmethod
    def input_tokens(batch: list[list[int]]) -> int:
        return sum(len(ids) for ids in batch)

    def _submit(self, submit, batch: list[list[int]], timing_of, writer: bool = True):
        """Run ``submit(batch)`` timed; on a writer, return each request's generated token ids
        (its first completion) and log one request row each, with ``timing_of(output)``.

        Returns None on a process that is not its replica's writer.
        """
        call = self._calls
        self._calls += 1
        start = time.time_ns()
        outputs = submit(batch)
        end = time.time_ns()
        if not writer:
            return None
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        self._record(
            call, start, end, batch, [len(t) for t in tokens], [timing_of(o) for o in outputs]
        )
        return tokens

    def _record(self, call: int, start_ns: int, end_ns: int, batch, lengths, timings) -> None:
        """Add one row per request; ``timings`` holds (ttft_s, tpot_s, source) or None each."""
        for i, (ids, n_out, t) in enumerate(zip(batch, lengths, timings, strict=True)):
            ttft, tpot, source = t if t is not None else (None, None, "none")
            self.requests.append(
                request_log.RequestRow(
                    job_id=self.opts.job_id,
                    backend=self.opts.backend,
                    dp_rank=self.ctx.coords.dp_rank,
                    call_index=call,
                    batch_size=len(batch),
                    request_index=i,
                    input_tokens=len(ids),
                    output_tokens=n_out,
                    call_start_ns=start_ns,
                    call_end_ns=end_ns,
                    ttft_s=ttft,
                    tpot_s=tpot,
                    metrics_status="measured" if ttft is not None else "unavailable",
                    metrics_source=source,
                )
            )

    def write_requests(self, spec: dict) -> None:
        """Gather every process's request rows; process 0 writes ``requests.parquet``.

        Collective: every process of the job calls it (from ``close``).
        """
        from energysweep import dist

        gathered = dist.gather(self.requests)
        path = request_log.path_for(spec)
        if self.ctx.rank == 0 and path is not None:
            rows = [r for part in gathered for r in part]
            rows.sort(key=lambda r: (r.dp_rank, r.call_index, r.request_index))
            request_log.write(rows, path)

    def synchronize(self) -> None:
        """The engines' generate calls return only when every request finished."""

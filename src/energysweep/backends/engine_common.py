"""What the engine backends (vLLM, TensorRT-LLM) share: engine limits, tokenisation, request log.

Both engines get exactly the token ids the PyTorch backend generates from (the checkpoint's own
Hugging Face tokenizer, truncated to ``workload.max_input_tokens``, special tokens added), and
both must return exactly ``workload.output_tokens`` new tokens per request (EOS ignored), so a
grid point means the same work on every backend.

An engine backend is built from the rank's context and the launched job
(:class:`energysweep.job.spec.LaunchedJob`), which ``load_backend(ctx, job)`` receives: its
options are ``job.engine``, its limits :func:`max_batch_size` and :func:`max_model_len`.
"""

from __future__ import annotations

import time

from energysweep.backends import request_log
from energysweep.backends.base import Backend
from energysweep.job.spec import JobSpec, LaunchedJob
from energysweep.tables.status import EnergyStatus


def max_batch_size(job: JobSpec) -> int:
    """The engine is built once per job, so it must admit the largest swept batch."""
    return max(job.workload.batch_sizes)


def max_model_len(job: JobSpec) -> int:
    """Longest sequence a request can reach: ``engine.max_model_len``, or (null) the prompt
    (truncated) + the fixed output."""
    if job.engine is not None and job.engine.max_model_len:
        return int(job.engine.max_model_len)
    return job.workload.max_input_tokens + job.workload.output_tokens


class EngineBackend(Backend):
    """Tokenisation and the per-request log; subclasses add the engine itself.

    ``encode`` returns one list of token ids per prompt (no padding: engines batch ragged
    prompts themselves), which is also what ``generate`` submits.
    """

    name = "engine"
    writes_requests = True  # close() writes requests.parquet (run.py writes an empty one else)

    def __init__(self, ctx, job: LaunchedJob):
        from transformers import AutoTokenizer

        if job.engine is None:
            raise ValueError(
                f"{job.key.backend} jobs carry the config section `engine` "
                "(energysweep.job.spec.JobSpec.from_config)"
            )
        self.ctx = ctx
        self.job = job
        self.tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
        self.requests: list[request_log.RequestRow] = []
        self._calls = 0

    def encode(self, prompts: list[str]) -> list[list[int]]:
        enc = self.tokenizer(
            prompts, truncation=True, max_length=self.job.workload.max_input_tokens
        )
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
                    job_id=self.job.job_id,
                    backend=self.job.key.backend,
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
                    metrics_status=(
                        EnergyStatus.MEASURED if ttft is not None else EnergyStatus.UNAVAILABLE
                    ),
                    metrics_source=source,
                )
            )

    def write_requests(self) -> None:
        """Gather every process's request rows; process 0 writes ``job.outputs.requests``.

        Collective: every process of the job calls it (from ``close``).
        """
        from energysweep import dist

        gathered = dist.gather(self.requests)
        if self.ctx.rank == 0:
            rows = [r for part in gathered for r in part]
            rows.sort(key=lambda r: (r.dp_rank, r.call_index, r.request_index))
            request_log.write(rows, self.job.outputs.requests)

    def synchronize(self) -> None:
        """The engines' generate calls return only when every request finished."""

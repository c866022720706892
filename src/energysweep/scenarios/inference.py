"""The ``inference`` scenario: generate (and prefill) windows over batches of prompts.

Each point encodes its batches once, warms up until iteration time is steady (at least
``workload.warmup_iterations`` batches; energysweep.measure.warmup), then
each repetition measures a generate window of ``workload.output_tokens`` new tokens per prompt and,
with ``measurement.prefill_pass``, a prefill window (one new token), each after a cooldown. Rank
0's first repetition's generated tokens are kept for generations.parquet.
"""

from __future__ import annotations

import math

from energysweep.scenarios.base import Scenario, prompt_indices
from energysweep.tables.phases import Phase

# Batches pre-encoded per point: prompts cycle with period n_prompts / gcd(n_prompts, global
# batch); a long window reuses them (encoding never happens inside a window).
MAX_ENCODED_BATCHES = 128


class InferenceScenario(Scenario):
    """Runs the inference windows of one job on one rank through its backend."""

    name = "inference"

    def __init__(self, job, ctx, backend, prompts: list[str], monitor):
        super().__init__(job, ctx, backend, prompts, monitor)
        self._point_batches: list[tuple[list[int], dict]] | None = None

    def phases(self) -> list[Phase]:
        return [Phase.GENERATE] + ([Phase.PREFILL] if self.m.prefill_pass else [])

    def is_fatal(self, exc: BaseException) -> bool:
        # A multi-rank engine (vLLM) cannot go on after an exception, and its other ranks
        # wait inside the engine's own collectives, not in the agreement: end the job now
        # (torchrun then stops every rank) rather than after collective_timeout_s.
        return bool(self.backend.fatal_point_errors)

    def _batches(self, bs: int) -> list[tuple[list[int], dict]]:
        global_batch = bs * self.ctx.layout.dp
        n = len(self.prompts)
        cycle = n // math.gcd(n, global_batch)
        count = min(max(cycle, 1), MAX_ENCODED_BATCHES)
        out = []
        for it in range(count):
            idx = prompt_indices(it, bs, self.ctx.layout.dp, self.ctx.coords.dp_rank, n)
            out.append((idx, self.backend.encode([self.prompts[i] for i in idx])))
        return out

    def _generate(self, batch, n_new: int):
        gen = self.backend.generate(batch, n_new)
        if gen is not None and any(len(g) != n_new for g in gen):
            raise RuntimeError(f"backend returned {[len(g) for g in gen]} tokens, not {n_new}")
        return gen

    def window(self, batches, n_new: int, record: list | None = None) -> dict:
        """One measured generate (or prefill: ``n_new`` 1) window over ``batches``."""
        min_iters = self.wl.iterations
        tokens = {"tin": 0, "tout": 0}

        def step(it: int) -> None:
            idx, batch = batches[it % len(batches)]
            gen = self._generate(batch, n_new)
            if gen is None:  # not its replica's writer
                return
            tokens["tin"] += self.backend.input_tokens(batch)
            tokens["tout"] += sum(len(g) for g in gen)
            if record is not None and it < min_iters:
                record.extend(
                    {"iteration": it, "prompt_index": i, "token_ids": g}
                    for i, g in zip(idx, gen, strict=True)
                )

        w = self.measured(step, min_iters, self.backend.synchronize)
        return {**w, **tokens}

    def prepare(self, bs: int) -> None:
        self._point_batches = batches = self._batches(bs)

        def step(it: int) -> None:
            self._generate(batches[it % len(batches)][1], self.wl.output_tokens)

        self.warm_up_until_steady(bs, step, self.backend.synchronize, self.wl.warmup_iterations)

    def repetition(self, bs: int, rep: int, cooldown_s: float) -> list[dict]:
        batches = self._point_batches
        record: list | None = [] if rep == 0 else None
        self.sleep(cooldown_s)
        w = self.window(batches, self.wl.output_tokens, record)
        rows = self._rows(bs, rep, Phase.GENERATE, w)
        if self.m.prefill_pass:
            self.sleep(cooldown_s)
            rows += self._rows(bs, rep, Phase.PREFILL, self.window(batches, 1))
        if record:
            self.generations += [
                {"batch_size": bs, "dp_rank": self.ctx.coords.dp_rank, **r} for r in record
            ]
        return rows

    def end_point(self) -> None:
        self._point_batches = None

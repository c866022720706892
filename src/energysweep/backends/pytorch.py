"""PyTorch / transformers backend: one process per rank under torchrun, any tp x pp x dp layout.

Interface every backend implements (see energysweep.scenarios.inference):
    encode(prompts) -> batch            left-padded, truncated to max_input_tokens
    input_tokens(batch) -> int          prompt tokens excluding padding
    generate(batch, n) -> list[list[int]] | None
                                        exactly n new token ids per prompt (EOS ignored) on the
                                        replica's writer rank; None on other ranks
    synchronize()                       wait for the device (window edges)
    is_oom(exc) -> bool
    close()
Also, for accuracy tests: prefill_logits(batch) -> Tensor[B, L, V] | None (on the writer).

DP is the caller's: each replica gets its own prompts, and all ranks of one replica are called with
the same batch. TP and PP live in :mod:`energysweep.torchpp` (stage loading, sharding plan, the
greedy decode loop used for every layout).
"""

from __future__ import annotations

import torch

from energysweep.backends.base import Backend
from energysweep.dist import RankContext
from energysweep.torchpp.decode import StageRunner
from energysweep.torchpp.load import load_rank_stage
from energysweep.util.oom import is_oom


class PyTorchBackend(Backend):
    """One rank's share of a model replica; greedy decoding with a fixed output length."""

    name = "pytorch"

    def __init__(self, ctx: RankContext):
        from transformers import AutoTokenizer

        self.ctx = ctx
        self.device = torch.device(ctx.device)
        # ctx.tp_mode: "local" or "dtensor", see torchpp.tp.
        self.model, _ = load_rank_stage(ctx, ctx.tp_mode)
        self.tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.runner = StageRunner(self.model, ctx.layout, ctx.rank, ctx.mesh)

    def encode(self, prompts: list[str]) -> dict:
        enc = self.tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.ctx.max_input_tokens,
        )
        return {
            k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")
        }

    @staticmethod
    def input_tokens(batch: dict) -> int:
        return int(batch["attention_mask"].sum())

    def generate(self, batch: dict, max_new_tokens: int) -> list[list[int]] | None:
        return self.runner.generate(batch, max_new_tokens)

    def prefill_logits(self, batch: dict) -> torch.Tensor | None:
        return self.runner.prefill_logits(batch)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    is_oom = staticmethod(is_oom)

    def close(self) -> None:
        del self.runner
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def load_backend(ctx: RankContext, job) -> PyTorchBackend:
    """The rank's backend; what it needs of the job (dtype, max_input_tokens) is in ``ctx``."""
    return PyTorchBackend(ctx)

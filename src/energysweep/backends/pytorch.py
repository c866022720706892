"""PyTorch / transformers backend: one process per rank under torchrun.

Interface every backend implements (see energysweep.run):
    encode(prompts) -> batch            left-padded, truncated to max_input_tokens
    input_tokens(batch) -> int          prompt tokens excluding padding
    generate(batch, n) -> list[list[int]] | None
                                        exactly n new token ids per prompt (EOS ignored) on the
                                        replica's writer rank; None on other ranks
    synchronize()                       wait for the device (window edges)
    is_oom(exc) -> bool
    close()
"""

from __future__ import annotations

import torch

from energysweep.dist import RankContext

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PyTorchBackend:
    """A full model replica per rank (tp = pp = 1); greedy decoding with a fixed output length."""

    name = "pytorch"

    def __init__(self, ctx: RankContext):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if ctx.layout.tp > 1 or ctx.layout.pp > 1:
            raise NotImplementedError("tp>1 / pp>1 are not implemented in the pytorch backend yet")
        self.ctx = ctx
        self.device = torch.device(ctx.device)
        self.tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            ctx.model_dir, dtype=DTYPES[ctx.dtype]
        ).to(self.device)
        self.model.eval()

    def encode(self, prompts: list[str]) -> dict:
        enc = self.tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.ctx.max_input_tokens,
        )
        return {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}

    @staticmethod
    def input_tokens(batch: dict) -> int:
        return int(batch["attention_mask"].sum())

    @torch.inference_mode()
    def generate(self, batch: dict, max_new_tokens: int) -> list[list[int]] | None:
        out = self.model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        new = out[:, batch["input_ids"].shape[1] :]
        return new.tolist() if self.ctx.coords.is_writer else None

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @staticmethod
    def is_oom(exc: BaseException) -> bool:
        return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()

    def close(self) -> None:
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def load_backend(ctx: RankContext) -> PyTorchBackend:
    return PyTorchBackend(ctx)

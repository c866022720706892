"""The one greedy decode loop of the PyTorch backend, for every layout (tp = pp = 1 included).

Each stage runs its layers with its own KV cache (:func:`energysweep.torchpp.stage.run_layers`)
and sends its hidden states to the next stage (point to point between equal tp ranks, global ranks
from ``layout.pp_group``). The last stage takes the argmax (EOS suppressed, as HF's
``min_new_tokens`` does) and broadcasts the token to every stage of its pipeline. It reproduces
``model.generate(do_sample=False, min_new_tokens=n, max_new_tokens=n)``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from energysweep.torchpp.stage import HFModule, attention_of, decoder, run_layers


def eos_token_ids(model: HFModule) -> list[int]:
    """EOS ids HF ``generate`` would suppress under ``min_new_tokens`` (generation config's)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


class StageRunner:
    """Runs one rank's share of a replica: prefill, greedy decode, hidden-state hand-off.

    Every rank of a replica is called with the same batch; outputs come back on the replica's
    writer (tp rank 0 of stage 0), None elsewhere.
    """

    def __init__(self, model: HFModule, layout, rank: int, mesh=None):
        self.model = model
        self.inner = decoder(model)
        self.layout = layout
        self.rank = rank
        c = layout.coords(rank)
        self.coords = c
        self.first = c.pp_rank == 0
        self.last = c.pp_rank == layout.pp - 1
        self.pipe = layout.pp_group(rank)  # global ranks of this pipeline, stage order
        self.prev = None if self.first else self.pipe[c.pp_rank - 1]
        self.next = None if self.last else self.pipe[c.pp_rank + 1]
        if (layout.tp > 1 or layout.pp > 1) and mesh is None:
            raise ValueError(f"layout {layout} needs the device mesh (ctx.mesh) and none was given")
        self.pp_group = mesh.get_group("pp") if layout.pp > 1 else None
        self.tp_group = mesh.get_group("tp") if layout.tp > 1 else None
        self.tp_root = layout.tp_group(rank)[0]
        cfg = model.config
        self.hidden_size = cfg.hidden_size
        self.attn = attention_of(model)
        self.sliding_window = getattr(cfg, "sliding_window", None)
        self.dtype = next(p for p in model.parameters()).dtype
        self.eos = eos_token_ids(model)

    @property
    def is_writer(self) -> bool:
        return self.coords.is_writer

    def _stage_forward(
        self, ids: torch.Tensor, padding_mask: torch.Tensor, cache
    ) -> torch.Tensor | None:
        """This stage on the last ``ids.shape[1]`` tokens; the last stage returns normed hidden."""
        batch, q_len = ids.shape
        if self.first:
            hidden = self.inner.embed_tokens(ids)
        else:
            hidden = torch.empty(
                batch, q_len, self.hidden_size, dtype=self.dtype, device=padding_mask.device
            )
            dist.recv(hidden, src=self.prev)
        hidden = run_layers(self.inner, hidden, padding_mask, q_len, self.attn, cache)
        if not self.last:
            dist.send(hidden.contiguous(), dst=self.next)
            return None
        return self.inner.norm(hidden)

    def _check_length(self, total: int) -> None:
        if self.sliding_window and total > self.sliding_window:
            raise NotImplementedError(
                f"{total} tokens exceed the model's sliding window {self.sliding_window}; the "
                "pipeline decode loop builds full causal masks only"
            )

    @torch.inference_mode()
    def prefill_logits(self, batch: dict) -> torch.Tensor | None:
        """Full-vocabulary float32 logits ``[B, L, V]`` of the prompt forward, on the writer."""
        ids, pad = batch["input_ids"], batch["attention_mask"]
        self._check_length(ids.shape[1])
        hidden = self._stage_forward(ids, pad, None)
        logits: torch.Tensor | None = None
        if self.last:
            logits = self.model.lm_head(hidden).float()
        if self.layout.pp > 1 and self.coords.tp_rank == 0:
            if logits is not None:  # the last stage
                dist.send(logits.contiguous(), dst=self.pipe[0])
            elif self.first:
                shape = (*ids.shape, self.model.config.vocab_size)
                logits = torch.empty(shape, dtype=torch.float32, device=pad.device)
                dist.recv(logits, src=self.pipe[-1])
        return logits if self.is_writer else None

    def _next_token(self, hidden: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """Greedy token of every sequence, known on every rank of the pipeline afterwards."""
        if hidden is not None:  # the last stage (the others get the token below)
            logits = self.model.lm_head(hidden[:, -1:, :])[:, -1, :].float()
            if self.eos:
                logits[:, self.eos] = -float("inf")
            token = logits.argmax(-1)
            if self.tp_group is not None:
                # TP ranks hold bitwise-equal logits after the all-reduce; the broadcast makes the
                # stage agree even where a collective's rounding could differ between ranks.
                dist.broadcast(token, src=self.tp_root, group=self.tp_group)
        else:
            token = torch.empty(like.shape[0], dtype=torch.long, device=like.device)
        if self.pp_group is not None:
            dist.broadcast(token, src=self.pipe[-1], group=self.pp_group)
        return token

    @torch.inference_mode()
    def generate(self, batch: dict, max_new_tokens: int) -> list[list[int]] | None:
        """Exactly ``max_new_tokens`` greedy tokens per prompt (EOS suppressed) on the writer."""
        from transformers import DynamicCache

        ids, pad = batch["input_ids"], batch["attention_mask"]
        if max_new_tokens <= 0:
            return [[] for _ in range(ids.shape[0])] if self.is_writer else None
        self._check_length(ids.shape[1] + max_new_tokens - 1)
        cache = DynamicCache()
        hidden = self._stage_forward(ids, pad, cache)
        tokens = []
        for step in range(max_new_tokens):
            token = self._next_token(hidden, ids)
            tokens.append(token)
            if step == max_new_tokens - 1:
                break
            pad = torch.cat([pad, pad.new_ones(pad.shape[0], 1)], dim=-1)
            hidden = self._stage_forward(token[:, None], pad, cache)
        return torch.stack(tokens, dim=1).tolist() if self.is_writer else None

"""The forward of one pipeline stage: position ids, attention mask, the decoder layer loop.

Decoding (:class:`energysweep.torchpp.decode.StageRunner`) and training (:class:`TrainStage`) run
the same code: each stage rebuilds position ids and the 4-D attention mask from the 2-D padding
mask (left padding) and runs its layers (:func:`run_layers`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# A transformers causal LM, or its decoder stack: torchpp reads and replaces their submodules by
# name (``model.model.layers``, ``lm_head``, ``config``), which torch types as ``Tensor | Module``
# (nn.Module.__getattr__); they are duck-typed here, as transformers builds them at run time.
HFModule = Any

# Attention implementations whose masks we rebuild per stage (flash/flex take other mask forms).
SUPPORTED_ATTENTION = ("sdpa", "eager")


def position_ids_from_mask(padding_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of every token from a left-padded 2-D mask, as HF ``generate`` builds them.

    Real tokens count from 0 at the first unpadded token; padding gets position 0 (it is masked).

    Args:
        padding_mask: ``[batch, seen_tokens]``, 1 for real tokens, 0 for padding.

    Returns:
        ``[batch, seen_tokens]`` int64.
    """
    pos = padding_mask.long().cumsum(-1) - 1
    return pos.masked_fill(padding_mask == 0, 0)


def stage_attention_mask(
    padding_mask: torch.Tensor, q_len: int, attn_implementation: str, dtype: torch.dtype
) -> torch.Tensor | None:
    """The 4-D causal + padding mask for the last ``q_len`` tokens, in the form HF's layers take.

    Key ``j`` is visible to query ``i`` (absolute position ``past + i``) when it is not padding and
    ``j <= past + i``. Mirrors ``transformers.masking_utils``: for ``sdpa`` a boolean mask (True =
    attend), or ``None`` where SDPA's own ``is_causal`` handling is exact (no padding and either a
    single query or an empty cache); for ``eager`` an additive mask (0 / dtype min).

    Args:
        padding_mask: ``[batch, past + q_len]``, 1 for real tokens, 0 for padding.
        q_len: Number of new (query) tokens at the end of ``padding_mask``.
        attn_implementation: ``config._attn_implementation``: "sdpa" or "eager".
        dtype: Dtype of the hidden states (for the additive eager mask).

    Returns:
        ``[batch, 1, q_len, past + q_len]`` mask, or None.

    Raises:
        ValueError: For an attention implementation outside :data:`SUPPORTED_ATTENTION`.
    """
    if attn_implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"attention implementation {attn_implementation!r} is not supported by the pipeline "
            f"decode loop; use one of {SUPPORTED_ATTENTION}"
        )
    kv_len = padding_mask.shape[-1]
    past = kv_len - q_len
    if past < 0:
        raise ValueError(f"q_len={q_len} exceeds the mask length {kv_len}")
    no_padding = bool(padding_mask.all())
    if attn_implementation == "sdpa" and no_padding and (q_len == 1 or past == 0):
        return None
    device = padding_mask.device
    q_pos = torch.arange(q_len, device=device) + past
    kv_pos = torch.arange(kv_len, device=device)
    causal = kv_pos[None, :] <= q_pos[:, None]  # [q, kv]
    allowed = causal[None, None] & padding_mask.bool()[:, None, None, :]  # [b, 1, q, kv]
    if attn_implementation == "sdpa":
        return allowed
    zero = torch.zeros((), device=device, dtype=dtype)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def decoder(model: HFModule) -> HFModule:
    """The decoder stack (``model.model``) of a Llama-style ``*ForCausalLM``."""
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
        raise NotImplementedError(
            f"{type(model).__name__} is not a Llama-style causal LM (model.embed_tokens/layers/"
            "norm/rotary_emb + lm_head); the pytorch backend's TP/PP path supports only those"
        )
    return inner


def attention_of(model: HFModule) -> str:
    """``model.config._attn_implementation``, refused unless the stage loop rebuilds its masks."""
    attn = model.config._attn_implementation
    if attn not in SUPPORTED_ATTENTION:
        raise ValueError(f"attention {attn!r} unsupported; load with one of {SUPPORTED_ATTENTION}")
    return attn


def run_layers(
    inner: HFModule,
    hidden: torch.Tensor,
    padding_mask: torch.Tensor,
    q_len: int,
    attn: str,
    cache=None,
) -> torch.Tensor:
    """The stage's decoder layers on the last ``q_len`` tokens of ``padding_mask``.

    Args:
        inner: the decoder stack (:func:`decoder`) of the stage.
        hidden: ``[batch, q_len, hidden]`` input hidden states (embedded or received).
        padding_mask: ``[batch, past + q_len]``, 1 for real tokens, 0 for padding.
        q_len: number of new tokens.
        attn: the attention implementation (:func:`attention_of`).
        cache: the KV cache when decoding; None (no cache) when training.
    """
    position_ids = position_ids_from_mask(padding_mask)[:, -q_len:]
    mask = stage_attention_mask(padding_mask, q_len, attn, hidden.dtype)
    position_embeddings = inner.rotary_emb(hidden, position_ids)
    for layer in inner.layers:
        hidden = layer(
            hidden,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=position_embeddings,
        )
        if isinstance(hidden, tuple):
            hidden = hidden[0]
    return hidden


class TrainStage(nn.Module):
    """One pipeline stage of a Llama-style causal LM for training (the whole model when pp = 1).

    Wraps the (pruned, possibly TP-sharded) HF model so its parameters keep their checkpoint
    names under ``model.``; the first stage takes token ids, later ones hidden states; the last
    returns logits. Sequences are unpadded and start at position 0 (training data is packed).
    """

    def __init__(self, model: HFModule, first: bool, last: bool):
        super().__init__()
        self.model = model
        self.first, self.last = first, last
        decoder(model)  # refuses non-Llama-style models with a clear message
        self.attn = attention_of(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.model.model
        hidden = inner.embed_tokens(x) if self.first else x
        batch, seq = hidden.shape[:2]
        pad = torch.ones(batch, seq, dtype=torch.long, device=hidden.device)
        hidden = run_layers(inner, hidden, pad, seq, self.attn)
        if self.last:
            return self.model.lm_head(inner.norm(hidden))
        return hidden

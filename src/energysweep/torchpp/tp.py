"""Tensor parallelism of one pipeline stage over the mesh's ``"tp"`` axis (see the package doc).

Why ``parallelize_module`` and not transformers' own TP: :mod:`energysweep.torchpp`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from energysweep.job.layout import ModelDims, ParallelLayout
from energysweep.torchpp.stage import HFModule, decoder


def layer_tp_plan() -> dict:
    """The TP plan of one Llama-style decoder layer (a fresh dict of fresh styles per call)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


TP_MODES = ("local", "dtensor")


class _ColwiseLocal(nn.Module):
    """A column-sharded Linear on plain local tensors; optionally all-gathers its output."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, gather: bool):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group, self.gather = group, gather

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight, self.bias)
        if not self.gather:
            return y
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


class _RowwiseLocal(nn.Module):
    """A row-sharded Linear on plain local tensors: local matmul, all-reduce, then the bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight)
        dist.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias


class _VocabEmbeddingLocal(nn.Module):
    """A vocabulary-sharded embedding: look up own rows, zero the others, all-reduce."""

    def __init__(self, weight: torch.Tensor, start: int, group):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start, self.group = start, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        y = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        y = y.masked_fill(outside[..., None], 0)
        dist.all_reduce(y, group=self.group)
        return y


def _local(t):
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


def _localize(parent: nn.Module, name: str, kind: str, tp_mesh) -> None:
    """Swap a module sharded by ``parallelize_module`` for its plain-tensor equivalent.

    The shards are the DTensor's own local tensors (no copy); the collectives are the ones the
    DTensor redistribution would issue, minus its per-op dispatch on the host.
    """
    mod = getattr(parent, name)
    group = tp_mesh.get_group()
    weight, bias = _local(mod.weight), _local(getattr(mod, "bias", None))
    new: nn.Module
    if kind in ("colwise", "colwise_gather"):
        new = _ColwiseLocal(weight, bias, group, gather=kind == "colwise_gather")
    elif kind == "rowwise":
        new = _RowwiseLocal(weight, bias, group)
    else:  # vocab-sharded embedding: even shards (tp divides the vocabulary)
        new = _VocabEmbeddingLocal(weight, tp_mesh.get_local_rank() * weight.shape[0], group)
    setattr(parent, name, new)


def apply_tensor_parallel(model: HFModule, tp_mesh, mode: str = "local") -> None:
    """Shard a (pruned) stage over a 1-D ``tp_mesh`` in place.

    ``parallelize_module`` shards every module of the plan. In ``"dtensor"`` mode the modules stay
    as it leaves them (DTensor weights, redistribution hooks). In ``"local"`` mode (the default)
    each sharded module is then swapped for one that runs on the same local shards with the same
    explicit collective (all-reduce after o/down, all-gather after lm_head): identical numbers,
    without DTensor's per-op host dispatch, which on CPU makes a decode step of the 4-layer test
    model ~10x slower and on a GPU would put host overhead into the energy being measured.

    Raises:
        ValueError: tp does not divide the head counts or the intermediate size; unknown mode.
        RuntimeError: after sharding, the local q_proj does not hold heads / tp heads.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if mode not in TP_MODES:
        raise ValueError(f"tp mode {mode!r} unknown; use one of {TP_MODES}")
    tp = tp_mesh.size()
    cfg = model.config
    heads = cfg.num_attention_heads
    # The one "tp divides the heads" rule (the grid skips such layouts before any job exists).
    reasons = ParallelLayout(tp=tp).unrunnable_reasons(ModelDims.from_hf_config(cfg.to_dict()))
    if reasons:
        raise ValueError("; ".join(reasons))
    inner = decoder(model)
    sharded: list[tuple[nn.Module, str, str]] = []
    for layer in inner.layers:
        plan = layer_tp_plan()
        parallelize_module(layer, tp_mesh, plan)
        attn = layer.self_attn
        local_rows = _local(attn.q_proj.weight).shape[0]
        if local_rows != heads // tp * attn.head_dim:
            raise RuntimeError(
                f"q_proj shard has {local_rows} rows, expected {heads // tp} heads x "
                f"{attn.head_dim}: the attention would not split its heads with the weights"
            )
        for path, style in plan.items():
            parent, name = layer.get_submodule(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1]
            sharded.append(
                (parent, name, "rowwise" if isinstance(style, RowwiseParallel) else "colwise")
            )
    if cfg.vocab_size % tp == 0:
        if inner.embed_tokens is not None:
            parallelize_module(
                inner.embed_tokens, tp_mesh, RowwiseParallel(input_layouts=Replicate())
            )
            sharded.append((inner, "embed_tokens", "vocab_embedding"))
        if model.lm_head is not None:
            parallelize_module(model.lm_head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))
            sharded.append((model, "lm_head", "colwise_gather"))
    if mode == "local":
        for parent, name, kind in sharded:
            _localize(parent, name, kind, tp_mesh)

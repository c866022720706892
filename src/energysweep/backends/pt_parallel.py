"""Tensor and pipeline parallelism for the PyTorch backend, and its one greedy decode loop.

One replica of the model is ``tp * pp`` ranks of the 3-D mesh ``("dp", "pp", "tp")`` built by
:func:`energysweep.dist.make_context`:

* **PP**: pipeline stage ``s`` owns the contiguous decoder layers ``layout.stage_layers(L, s)``;
  the embedding lives on stage 0, the final norm and ``lm_head`` on the last stage. Only the owned
  tensors are read from the checkpoint (:func:`load_stage_model`).
* **TP**: inside a stage, every decoder layer is sharded over the mesh's ``"tp"`` axis with
  ``torch.distributed.tensor.parallel.parallelize_module``: q/k/v and gate/up ``ColwiseParallel``,
  o/down ``RowwiseParallel``. The attention heads divide with the weights because HF Llama-style
  attention reshapes with ``view(*shape, -1, head_dim)`` (local heads = heads / tp) and keeps
  ``num_key_value_groups`` (a ratio, unchanged by an even split); the embedding (vocab rows) and
  ``lm_head`` (vocab columns, gathered) are sharded too when tp divides the vocabulary. By default
  each sharded module is then swapped for a plain-tensor twin on the same shards with the same
  explicit collective ("local" mode, :func:`apply_tensor_parallel`): identical numbers, without
  DTensor's per-op host dispatch in the measured decode loop.

Why ``parallelize_module`` rather than transformers' ``DistributedConfig(tp_size=...)``:
transformers derives its own ("pp", "fsdp", "tp") mesh over the whole launched world inside
``from_pretrained`` and has no axis for independent inference replicas, whereas here a TP group
must be the "tp" slice of one stage of one replica of *our* 3-D mesh, and our stage split decides
which layers a rank loads at all. ``parallelize_module`` takes exactly that sub-mesh and composes
with the split. ``DistributedConfig(pp_size=...)`` is not used: its KV-cache generation gives
wrong tokens on left-padded batches (/work/shared/reference/cpu-parallel.md).

Decoding (:class:`StageRunner`) is the same loop for every layout, tp = pp = 1 included: each stage
rebuilds position ids and the 4-D attention mask from the 2-D padding mask (left padding), runs its
layers with its own KV cache, and sends its hidden states to the next stage (point to point between
equal tp ranks, global ranks from ``layout.pp_group``). The last stage takes the argmax (EOS
suppressed, as HF's ``min_new_tokens`` does) and broadcasts the token to every stage of its
pipeline. It reproduces ``model.generate(do_sample=False, min_new_tokens=n, max_new_tokens=n)``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

# Attention implementations whose masks we rebuild per stage (flash/flex take other mask forms).
SUPPORTED_ATTENTION = ("sdpa", "eager")


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


# ----------------------------------------------------------------------------------------------
# Loading one pipeline stage


def _decoder(model: nn.Module) -> nn.Module:
    """The decoder stack (``model.model``) of a Llama-style ``*ForCausalLM``."""
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
        raise NotImplementedError(
            f"{type(model).__name__} is not a Llama-style causal LM (model.embed_tokens/layers/"
            "norm/rotary_emb + lm_head); the pytorch backend's TP/PP path supports only those"
        )
    return inner


def prune_to_stage(model: nn.Module, layers: range, first: bool, last: bool) -> nn.Module:
    """Keep only what one pipeline stage runs: its decoder layers, embedding if first, head if last.

    Kept layers keep their global ``layer_idx`` (the KV cache indexes by it and fills lazily).
    """
    inner = _decoder(model)
    inner.layers = nn.ModuleList([inner.layers[i] for i in layers])
    if not first:
        inner.embed_tokens = None
    if not last:
        inner.norm = None
        model.lm_head = None
    return model


def checkpoint_key(key: str, layers: range) -> str:
    """Checkpoint name of a pruned stage's tensor: local layer ``j`` is global ``layers[j]``."""
    prefix = "model.layers."
    if not key.startswith(prefix):
        return key
    local, rest = key[len(prefix) :].split(".", 1)
    return f"{prefix}{layers[int(local)]}.{rest}"


def _checkpoint_files(model_dir: Path) -> dict[str, str] | None:
    """Tensor name -> safetensors file of a checkpoint, or None if it is not safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: str(model_dir / v) for k, v in weight_map.items()}
    single = model_dir / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {k: str(single) for k in f.keys()}
    return None


def _load_stage_only(
    model_dir: Path,
    dtype: torch.dtype,
    device: torch.device,
    layers: range,
    first: bool,
    last: bool,
) -> nn.Module | None:
    """Build the stage on the meta device and read only its tensors; None if that cannot work."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    files = _checkpoint_files(model_dir)
    if files is None:
        return None
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    prune_to_stage(model, layers, first, last)
    wanted = list(model.state_dict().keys())
    source = {}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for key in wanted:
        name = checkpoint_key(key, layers)
        if name in files:
            source[key] = name
        elif name == "lm_head.weight" and tied and "model.embed_tokens.weight" in files:
            source[key] = "model.embed_tokens.weight"
        else:
            log.warning("checkpoint has no tensor %r; loading the whole model instead", name)
            return None
    inner = _decoder(model)
    persistent = set(wanted)
    for name, _ in model.named_buffers():
        if name not in persistent and not name.startswith("model.rotary_emb."):
            log.warning("non-persistent buffer %r cannot be rebuilt; loading the whole model", name)
            return None
    model.to_empty(device=device)
    by_file: dict[str, list[str]] = {}
    for key, src in source.items():
        by_file.setdefault(files[src], []).append(key)
    state = {}
    for path, keys in by_file.items():
        with safe_open(path, framework="pt", device="cpu") as f:
            for key in keys:
                state[key] = f.get_tensor(source[key])
    model.load_state_dict(state, strict=True)
    # Non-persistent buffers (RoPE inverse frequencies) were left uninitialised by to_empty.
    inner.rotary_emb = type(inner.rotary_emb)(config=model.config).to(device)
    return model


def load_stage_model(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    layers: range,
    first: bool,
    last: bool,
) -> nn.Module:
    """Load the part of a causal LM that one pipeline stage owns, in eval mode on ``device``.

    Reads only the stage's tensors from a safetensors checkpoint; falls back to loading the whole
    model and pruning it where the checkpoint's names do not map one to one onto the model's.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    model_dir = Path(model_dir)
    model = _load_stage_only(model_dir, dtype, device, layers, first, last)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        prune_to_stage(model, layers, first, last)
        model.to(device)
    try:
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    return model.eval()


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
    if kind in ("colwise", "colwise_gather"):
        new = _ColwiseLocal(weight, bias, group, gather=kind == "colwise_gather")
    elif kind == "rowwise":
        new = _RowwiseLocal(weight, bias, group)
    else:  # vocab-sharded embedding: even shards (tp divides the vocabulary)
        new = _VocabEmbeddingLocal(weight, tp_mesh.get_local_rank() * weight.shape[0], group)
    setattr(parent, name, new)


def apply_tensor_parallel(model: nn.Module, tp_mesh, mode: str = "local") -> None:
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
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    for name, value in (
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if value % tp:
            raise ValueError(f"tp={tp} does not divide {name}={value}")
    inner = _decoder(model)
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


def eos_token_ids(model: nn.Module) -> list[int]:
    """EOS ids HF ``generate`` would suppress under ``min_new_tokens`` (generation config's)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


# ----------------------------------------------------------------------------------------------
# The decode loop


class StageRunner:
    """Runs one rank's share of a replica: prefill, greedy decode, hidden-state hand-off.

    Every rank of a replica is called with the same batch; outputs come back on the replica's
    writer (tp rank 0 of stage 0), None elsewhere.
    """

    def __init__(self, model: nn.Module, layout, rank: int, mesh=None):
        self.model = model
        self.inner = _decoder(model)
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
        self.attn = cfg._attn_implementation
        if self.attn not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"attention {self.attn!r} unsupported; load with one of {SUPPORTED_ATTENTION}"
            )
        self.sliding_window = getattr(cfg, "sliding_window", None)
        self.dtype = next(p for p in model.parameters()).dtype
        self.eos = eos_token_ids(model)

    @property
    def is_writer(self) -> bool:
        return self.coords.is_writer

    def _stage_forward(self, ids: torch.Tensor, padding_mask: torch.Tensor, cache) -> torch.Tensor:
        """This stage on the last ``ids.shape[1]`` tokens; the last stage returns normed hidden."""
        batch, q_len = ids.shape
        if self.first:
            hidden = self.inner.embed_tokens(ids)
        else:
            hidden = torch.empty(
                batch, q_len, self.hidden_size, dtype=self.dtype, device=padding_mask.device
            )
            dist.recv(hidden, src=self.prev)
        position_ids = position_ids_from_mask(padding_mask)[:, -q_len:]
        mask = stage_attention_mask(padding_mask, q_len, self.attn, hidden.dtype)
        position_embeddings = self.inner.rotary_emb(hidden, position_ids)
        for layer in self.inner.layers:
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
        logits = None
        if self.last:
            logits = self.model.lm_head(hidden).float()
        if self.layout.pp > 1 and self.coords.tp_rank == 0:
            if self.last:
                dist.send(logits.contiguous(), dst=self.pipe[0])
            elif self.first:
                shape = (*ids.shape, self.model.config.vocab_size)
                logits = torch.empty(shape, dtype=torch.float32, device=pad.device)
                dist.recv(logits, src=self.pipe[-1])
        return logits if self.is_writer else None

    def _next_token(self, hidden: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """Greedy token of every sequence, known on every rank of the pipeline afterwards."""
        if self.last:
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

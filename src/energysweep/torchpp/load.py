"""Loading the part of a checkpoint one rank computes: its pipeline stage, TP-sharded if tp > 1.

Only the stage's tensors are read from a safetensors checkpoint (:func:`load_stage_model`);
:func:`load_rank_stage` is what the PyTorch backend and the training scenario call.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from energysweep.torchpp.stage import HFModule, decoder

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def prune_to_stage(model: HFModule, layers: range, first: bool, last: bool) -> HFModule:
    """Keep only what one pipeline stage runs: its decoder layers, embedding if first, head if last.

    Kept layers keep their global ``layer_idx`` (the KV cache indexes by it and fills lazily).
    """
    inner = decoder(model)
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
) -> HFModule | None:
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
    inner = decoder(model)
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
) -> HFModule:
    """Load the part of a causal LM that one pipeline stage owns, in eval mode on ``device``.

    Reads only the stage's tensors from a safetensors checkpoint; falls back to loading the whole
    model and pruning it where the checkpoint's names do not map one to one onto the model's.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    model_dir = Path(model_dir)
    model: HFModule = _load_stage_only(model_dir, dtype, device, layers, first, last)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        prune_to_stage(model, layers, first, last)
        model.to(device)
    try:
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    return model.eval()


def load_rank_stage(ctx, tp_mode: str, purpose: str = "run") -> tuple[HFModule, range]:
    """This rank's stage of ``ctx.model_dir`` (eval mode), TP-sharded over ``ctx.mesh["tp"]``.

    Args:
        ctx: the rank's :class:`energysweep.dist.RankContext`.
        tp_mode: see :func:`energysweep.torchpp.tp.apply_tensor_parallel`.
        purpose: the verb of the error when the layout cannot split the model ("run", "train").

    Returns:
        (model, the global indices of the decoder layers it holds).

    Raises:
        ValueError: the layout cannot split this model (naming every reason).
    """
    from transformers import AutoConfig

    from energysweep.job.layout import ModelDims
    from energysweep.torchpp.tp import apply_tensor_parallel

    layout, c = ctx.layout, ctx.coords
    config = AutoConfig.from_pretrained(ctx.model_dir)
    reasons = layout.unrunnable_reasons(ModelDims.from_hf_config(config.to_dict()))
    if reasons:
        raise ValueError(f"layout {layout} cannot {purpose} {ctx.model_dir}: " + "; ".join(reasons))
    layers = layout.stage_layers(config.num_hidden_layers, c.pp_rank)
    model = load_stage_model(
        ctx.model_dir,
        DTYPES[ctx.dtype],
        torch.device(ctx.device),
        layers,
        first=c.pp_rank == 0,
        last=c.pp_rank == layout.pp - 1,
    )
    if layout.tp_enabled:
        apply_tensor_parallel(model, ctx.mesh["tp"], tp_mode)
    return model, layers

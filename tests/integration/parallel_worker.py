"""Per-rank worker for test_pytorch_parallel.py, run under real torchrun.

Runs several layouts of one world size in a single launch (start-up dominates a torchrun here):
the process group starts once, each layout builds its own mesh and backend. For each layout,
every rank writes ``OUT/<layout>/rank<r>.pt`` with its coordinates, what it holds of the model,
and (writers only) the token ids and prefill logits of its replica's batches.

Usage: torchrun --standalone --nproc-per-node N parallel_worker.py
           --model-dir D --prompts P.json --out OUT --layouts tp2-pp1-dp1,tp2-pp1-dp1@dtensor,...
A layout may carry ``@<tp mode>`` (see torchpp.tp.apply_tensor_parallel); its results go to
``OUT/<layout>@<mode>``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from jobspec import job_spec, limits, rank_context

from energysweep import dist
from energysweep.backends.pytorch import PyTorchBackend
from energysweep.job.layout import ParallelLayout, split_contiguous


def parse_layout(text: str) -> tuple[ParallelLayout, str | None]:
    """``tp2-pp1-dp2[@mode]`` (the layout's str, optional tp mode) -> (layout, mode)."""
    text, _, mode = text.partition("@")
    parts = {p[:2]: int(p[2:]) for p in text.split("-")}
    return ParallelLayout(parts["tp"], parts["pp"], parts["dp"]), mode or None


def replica_batches(n_prompts: int, batch_size: int, layout: ParallelLayout, dp_rank: int):
    """The prompt-index batches of one replica: its contiguous slice, cut into batch_size."""
    mine = list(split_contiguous(n_prompts, layout.dp, dp_rank))
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def holdings(backend: PyTorchBackend) -> dict:
    """What this rank holds of the model: layers, embedding/head, local shard shapes and bytes."""
    model = backend.model
    inner = model.model
    out = {
        "layer_idx": [layer.self_attn.layer_idx for layer in inner.layers],
        "has_embed": inner.embed_tokens is not None,
        "has_head": model.lm_head is not None,
        "n_params_local": sum(_local(p).numel() for p in model.parameters()),
    }
    weights = {
        name: getattr(inner.layers[0].self_attn, name).weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    weights["down_proj"] = inner.layers[0].mlp.down_proj.weight
    if inner.embed_tokens is not None:
        weights["embed_tokens"] = inner.embed_tokens.weight
    if model.lm_head is not None:
        weights["lm_head"] = model.lm_head.weight
    for name, w in weights.items():
        local = _local(w)
        out[f"{name}_local_shape"] = list(local.shape)
        out[f"{name}_is_dtensor"] = hasattr(w, "to_local")
        # Bytes of the storage behind the shard: a view into a full tensor would show it.
        out[f"{name}_storage_bytes"] = local.untyped_storage().nbytes()
        out[f"{name}_shard_bytes"] = local.numel() * local.element_size()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layouts", required=True)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    prompts = json.loads(Path(args.prompts).read_text())
    # Each layout as the workflow builds its job (validated config, JobSpec.from_config).
    layouts = [
        (job_spec(layout=layout), mode)
        for layout, mode in map(parse_layout, args.layouts.split(","))
    ]
    first = layouts[0][0]
    dist.init(first.placement, "cpu", timeout_s=limits().collective_timeout_s)
    for job, mode in layouts:
        layout = job.layout
        ctx = rank_context(job, "cpu", args.model_dir, tp_mode=mode or "local")
        audits = dist.gather(ctx.audit())
        dist.check_world(audits, job.placement)
        backend = PyTorchBackend(ctx)
        results = []
        for idx in replica_batches(len(prompts), args.batch_size, layout, ctx.coords.dp_rank):
            batch = backend.encode([prompts[i] for i in idx])
            logits = backend.prefill_logits(batch)
            tokens = backend.generate(batch, args.new_tokens)
            results.append({"indices": idx, "tokens": tokens, "logits": logits})
        record = {
            "layout": str(layout),
            "tp_mode": mode,
            "audit": ctx.audit(),
            "holdings": holdings(backend),
            "results": results,
        }
        out = Path(args.out) / (f"{layout}@{mode}" if mode else str(layout))
        out.mkdir(parents=True, exist_ok=True)
        torch.save(record, out / f"rank{ctx.rank}.pt")
        backend.close()
        dist.barrier()
    dist.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

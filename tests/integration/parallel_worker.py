"""Per-rank worker for test_pytorch_parallel.py, run under real torchrun.

Runs several layouts of one world size in a single launch (start-up dominates a torchrun here):
the process group starts once, each layout builds its own mesh and backend. For each layout,
every rank writes ``OUT/<layout>/rank<r>.pt`` with its coordinates, what it holds of the model,
and (writers only) the token ids and prefill logits of its replica's batches.

Usage: torchrun --standalone --nproc-per-node N parallel_worker.py
           --model-dir D --prompts P.json --out OUT --layouts tp2-pp1-dp1,... [--batch-size 3]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from energysweep import dist
from energysweep.backends.pytorch import PyTorchBackend
from energysweep.grid import ParallelLayout, split_contiguous


def parse_layout(text: str) -> ParallelLayout:
    """``tp2-pp1-dp2`` (the layout's str) -> ParallelLayout."""
    parts = dict((p[:2], int(p[2:])) for p in text.split("-"))
    return ParallelLayout(parts["tp"], parts["pp"], parts["dp"])


def replica_batches(n_prompts: int, batch_size: int, layout: ParallelLayout, dp_rank: int):
    """The prompt-index batches of one replica: its contiguous slice, cut into batch_size."""
    mine = list(split_contiguous(n_prompts, layout.dp, dp_rank))
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]


def holdings(backend: PyTorchBackend) -> dict:
    """What this rank holds of the model: layers, embedding/head, local shard shapes."""
    inner = backend.model.model
    first = inner.layers[0] if len(inner.layers) else None
    out = {
        "layer_idx": [layer.self_attn.layer_idx for layer in inner.layers],
        "has_embed": inner.embed_tokens is not None,
        "has_head": backend.model.lm_head is not None,
        "n_params_local": 0,
    }
    for p in backend.model.parameters():
        out["n_params_local"] += (p.to_local() if hasattr(p, "to_local") else p).numel()
    if first is not None:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w = getattr(first.self_attn, name).weight
            out[f"{name}_local_shape"] = list((w.to_local() if hasattr(w, "to_local") else w).shape)
            out[f"{name}_is_dtensor"] = hasattr(w, "to_local")
        w = first.mlp.down_proj.weight
        out["down_proj_local_shape"] = list((w.to_local() if hasattr(w, "to_local") else w).shape)
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
    layouts = [parse_layout(t) for t in args.layouts.split(",")]
    dist.init(layouts[0], "cpu")
    for layout in layouts:
        ctx = dist.make_context(layout, "cpu", model_dir=args.model_dir, max_input_tokens=64)
        audits = dist.gather(ctx.audit())
        dist.check_world(audits, layout)
        backend = PyTorchBackend(ctx)
        results = []
        for idx in replica_batches(len(prompts), args.batch_size, layout, ctx.coords.dp_rank):
            batch = backend.encode([prompts[i] for i in idx])
            logits = backend.prefill_logits(batch)
            tokens = backend.generate(batch, args.new_tokens)
            results.append({"indices": idx, "tokens": tokens, "logits": logits})
        record = {
            "layout": str(layout),
            "audit": ctx.audit(),
            "holdings": holdings(backend),
            "results": results,
        }
        out = Path(args.out) / str(layout)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(record, out / f"rank{ctx.rank}.pt")
        backend.close()
        dist.barrier()
    dist.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

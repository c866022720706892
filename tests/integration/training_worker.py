"""Per-rank worker for test_training.py, run under real torchrun (or alone for the reference).

Trains several layouts of one world size in one launch (start-up dominates a torchrun here) with
the production code of :mod:`energysweep.scenarios.training`, set up as ``run.main`` sets it up
(rank context, process audit, JobMonitor, TrainingScenario). For each layout:

1. a fresh copy of the checkpoint trains ``--steps`` optimizer steps at per-replica batch
   ``--global-batch / dp``; rank 0 writes ``OUT/<layout>/losses.json`` (per-step global-batch
   losses), and tp rank 0 of each stage of replica 0 writes ``OUT/<layout>/params-pp<s>.pt``
   (full parameters by checkpoint name);
2. with ``--measure``, one measured grid point (``TrainingScenario.point``) whose rows, merged
   by ``measure.combine.combine_ranks``, rank 0 writes as a real shard
   ``OUT/<layout>/shard.parquet``.

``--mistake accelerate-no-cpu`` reproduces the silent single-process trap: it replaces
``training.make_accelerator`` by a plain ``Accelerator()`` (no ``cpu=True``) before the
TrainingScenario is built; the audit must fail the job.

Usage: torchrun --standalone --nproc-per-node N training_worker.py --model-dir D --out OUT
           --layouts tp1-pp1-dp2,tp2-pp1-dp1 [--global-batch 4] [--steps 3] [--measure]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from jobspec import launched_job, rank_context

from energysweep import dist
from energysweep.job.layout import ParallelLayout
from energysweep.scenarios import training
from energysweep.scenarios.trainers import make_trainer
from energysweep.tables import shards


def parse_layout(text: str) -> ParallelLayout:
    """``tp2-pp1-dp2`` (the layout's str) -> ParallelLayout."""
    parts = dict((p[:2], int(p[2:])) for p in text.split("-"))
    return ParallelLayout(parts["tp"], parts["pp"], parts["dp"])


def job_for(args, layout: ParallelLayout):
    """The launched job of ``layout`` as the workflow builds it (no energy: CPU ranks)."""
    return launched_job(
        args.out,
        args.model_dir,
        job_id="worker",
        layout=layout,
        scenario="training",
        reps=1,
        measurement={"energy_source": "none", "host_energy_source": "none", "prefill_pass": False},
        training={
            "steps": args.steps,
            "warmup_steps": 0,
            "seq_len": args.seq_len,
            "data": args.data,
            "optimizer": args.optimizer,
            "lr": args.lr,
            "microbatches": args.microbatches,
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layouts", required=True)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--data", default="prompts")
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--mistake", choices=["accelerate-no-cpu"])
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from energysweep.measure.combine import combine_ranks
    from energysweep.measure.monitor import JobMonitor
    from energysweep.scenarios.prompts import load_prompts

    prompts = load_prompts()
    jobs = [job_for(args, parse_layout(t)) for t in args.layouts.split(",")]
    dist.init(jobs[0].placement, "cpu", timeout_s=jobs[0].limits.collective_timeout_s)
    if args.mistake == "accelerate-no-cpu":
        from accelerate import Accelerator

        training.make_accelerator = lambda device: Accelerator()  # the documented mistake
    for job in jobs:
        layout = job.layout
        ctx = rank_context(job, "cpu", args.model_dir)
        dist.check_world(dist.gather(ctx.audit()), job.placement)
        monitor = JobMonitor(job, ctx)
        measurer = training.TrainingScenario(job, ctx, prompts, monitor)
        monitor.start()
        bs = args.global_batch // layout.dp
        trainer = make_trainer(
            ctx, measurer.cfg, bs, measurer.samples, args.steps, measurer.accelerator
        )
        for _ in range(args.steps):
            trainer.step()
        losses = trainer.take_losses()
        params = trainer.full_parameters()  # collective over TP: every rank calls it
        trainer.close()
        out = Path(args.out) / str(layout)
        out.mkdir(parents=True, exist_ok=True)
        if ctx.rank == 0:
            (out / "losses.json").write_text(json.dumps(losses))
        c = ctx.coords
        if c.dp_rank == 0 and c.tp_rank == 0:
            torch.save(params, out / f"params-pp{c.pp_rank}.pt")
        if args.measure:
            (rows,) = measurer.point(bs)
            gathered = dist.gather(rows)
            if ctx.rank == 0:
                shards.write_shard(combine_ranks(gathered), out / "shard.parquet")
        monitor.finish()
        measurer.close()
        monitor.close()
        dist.barrier()
    dist.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

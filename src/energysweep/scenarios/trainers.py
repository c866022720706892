"""Trainers: one optimizer step per call, the same interface for both ways a layout trains.

* **tp = pp = 1 (pure DP, dp >= 1)**: :class:`AccelerateTrainer`. Model, optimizer and dataloader
  go through ``prepare`` (DDP over the world, the dataloader sharded per process), the step
  through ``accelerator.backward``, the loss through ``accelerator.gather``, and ``free_memory``
  releases everything between grid points.
* **tp > 1 or pp > 1**: :class:`MeshTrainer` on our own 3-D mesh (``dist.make_context``). TP uses
  the inference backend's plan (:func:`energysweep.torchpp.tp.apply_tensor_parallel`, DTensor
  mode); PP splits the decoder layers as inference does (``layout.stage_layers``) and runs
  ``torch.distributed.pipelining`` ``PipelineStage`` + ``ScheduleGPipe`` with a ``loss_fn`` over
  the mesh's ``"pp"`` axis. DP, when also > 1, is one flat all-reduce of the gradients over the
  mesh's ``"dp"`` axis after the schedule. Accelerate is not used here because its ``prepare``
  wraps DDP over the whole world (a DP group of a 3-D layout is a sub-group) and its TP goes
  through transformers' own ``tp_plan``, which builds its own mesh over the whole world and cannot
  compose with our stage split (see :mod:`energysweep.torchpp`).

Both run the same stage forward (:class:`energysweep.torchpp.stage.TrainStage`) and loss
(:func:`causal_lm_loss`: mean next-token cross entropy over all tokens).
"""

from __future__ import annotations

import gc
import logging

import torch
import torch.nn.functional as F

from energysweep import dist
from energysweep.job.layout import ParallelLayout
from energysweep.job.sections import Training
from energysweep.scenarios.base import prompt_indices
from energysweep.scenarios.train_data import TokenDataset
from energysweep.torchpp.load import checkpoint_key, load_rank_stage
from energysweep.torchpp.stage import HFModule, TrainStage

log = logging.getLogger(__name__)

# Length of the Accelerate dataloader when the step count is not known in advance.
UNBOUNDED_STEPS = 2**40


def uses_accelerate(layout: ParallelLayout) -> bool:
    """Pure data parallelism trains through Accelerate; any model parallelism through our mesh."""
    return not (layout.tp_enabled or layout.pp_enabled)


def effective_microbatches(batch_size: int, requested: int) -> int:
    """GPipe micro-batches of a step: the largest divisor of ``batch_size`` not above ``requested``.

    Equal micro-batches keep the mean of micro-batch losses equal to the batch's mean loss (the
    schedule divides gradients by the micro-batch count), so PP matches one process exactly.
    """
    if batch_size < 1 or requested < 1:
        raise ValueError(f"batch_size ({batch_size}) and microbatches ({requested}) must be >= 1")
    return max(d for d in range(1, min(batch_size, requested) + 1) if batch_size % d == 0)


def window_loss(per_replica: list[list[float]]) -> tuple[float, list[float]]:
    """(mean over steps, per-step) global-batch loss from each replica's per-step batch losses.

    Replicas train on equally many tokens, so the global batch's mean loss is the mean of theirs.

    Raises:
        ValueError: no replica reported, or replicas disagree on the number of steps.
    """
    if not per_replica or not per_replica[0]:
        raise ValueError("no losses were reported for the window")
    steps = {len(r) for r in per_replica}
    if len(steps) != 1:
        raise ValueError(f"replicas report different step counts {sorted(steps)}")
    per_step = [sum(vals) / len(vals) for vals in zip(*per_replica, strict=True)]
    return sum(per_step) / len(per_step), per_step


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position of every sequence (float32)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, vocab).float(), input_ids[:, 1:].reshape(-1).to(logits.device)
    )


def _load_stage(ctx: dist.RankContext) -> tuple[HFModule, range]:
    """This rank's stage of the checkpoint, in train mode (weights as stored, same on every run)."""
    # DTensor mode: its redistributions are differentiable. The inference default ("local")
    # swaps in plain modules whose weights do not require grad and whose collectives have
    # no backward.
    model, layers = load_rank_stage(ctx, "dtensor", purpose="train")
    return model.train(), layers


def _optimizer(cfg: Training, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    raise ValueError(f"training.optimizer {cfg.optimizer!r} is not adamw or sgd")


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter as one full CPU tensor (DTensor shards gathered: collective over its mesh)."""
    t = t.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.cpu().clone()


class AccelerateTrainer:
    """Pure data parallelism through Accelerate (``prepare``, ``backward``, ``gather``)."""

    def __init__(
        self, accelerator, ctx, cfg, batch_size: int, samples: torch.Tensor, n_steps: int | None
    ):
        from torch.utils.data import DataLoader

        self.acc = accelerator
        self.ctx = ctx
        model, self.layers = _load_stage(ctx)
        self.hf_model = model
        stage = TrainStage(model, first=True, last=True)
        optimizer = _optimizer(cfg, stage.parameters())
        # Unshuffled; prepare() shards it per process: process d of step s reads global samples
        # [s*G + d*bs, s*G + (d+1)*bs), G = bs*dp — the same split as scenarios.base.prompt_indices.
        # n_steps None: the window rule decides the step count at run time (samplers are lazy).
        steps = UNBOUNDED_STEPS if n_steps is None else n_steps
        loader = DataLoader(
            TokenDataset(samples, steps * batch_size * ctx.layout.dp), batch_size=batch_size
        )
        self.model, self.optimizer, self.loader = accelerator.prepare(stage, optimizer, loader)
        self._batches = iter(self.loader)
        self._losses: list[torch.Tensor] = []

    def step(self) -> None:
        ids = next(self._batches)
        loss = causal_lm_loss(self.model(ids), ids)
        self.acc.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._losses.append(loss.detach())

    def take_losses(self) -> list[float]:
        """Per-step global-batch losses since the last call, gathered across replicas."""
        mine = torch.stack(self._losses).float()
        self._losses = []
        gathered = self.acc.gather(mine).view(self.acc.num_processes, -1)
        return window_loss(gathered.tolist())[1]

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Checkpoint name -> full parameter (for checking against one process)."""
        return {n: _full(p) for n, p in self.hf_model.named_parameters()}

    def close(self) -> None:
        self.model, self.optimizer, self.loader = self.acc.free_memory(
            self.model, self.optimizer, self.loader
        )
        self._batches = self.hf_model = None


class MeshTrainer:
    """TP and/or PP over our mesh; DP (if any) by one gradient all-reduce over the ``dp`` axis."""

    def __init__(self, ctx, cfg, batch_size: int, samples: torch.Tensor, microbatches: int):
        layout, c = ctx.layout, ctx.coords
        self.ctx = ctx
        self.batch_size = batch_size
        self.samples = samples
        self.device = torch.device(ctx.device)
        self.first = c.pp_rank == 0
        self.last = c.pp_rank == layout.pp - 1
        model, self.layers = _load_stage(ctx)
        self.hf_model = model
        self.stage = TrainStage(model, self.first, self.last)
        self.optimizer = _optimizer(cfg, self.stage.parameters())
        self.dp_group = ctx.mesh.get_group("dp") if layout.dp_enabled else None
        self.schedule = None
        if layout.pp_enabled:
            self.schedule = self._gpipe(cfg.seq_len, microbatches)
        self._step = 0
        self._losses: list[torch.Tensor] = []

    def _gpipe(self, seq_len: int, microbatches: int):
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        layout, c = self.ctx.layout, self.ctx.coords
        cfg = self.hf_model.config
        dtype = next(self.stage.parameters()).dtype
        mb = self.batch_size // microbatches

        def meta(*shape, dtype=dtype, grad=True):
            return torch.empty(*shape, dtype=dtype, device="meta").requires_grad_(grad)

        # Static shapes: no shape-inference forward. A received hidden state must be marked as
        # requiring grad, or the stage would send no input gradient back to the previous one.
        hidden = (mb, seq_len, cfg.hidden_size)
        stage = PipelineStage(
            self.stage,
            c.pp_rank,
            layout.pp,
            self.device,
            input_args=meta(mb, seq_len, dtype=torch.long, grad=False)
            if self.first
            else meta(*hidden),
            output_args=meta(mb, seq_len, cfg.vocab_size) if self.last else meta(*hidden),
            group=self.ctx.mesh.get_group("pp"),
        )
        return ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=causal_lm_loss)

    def _batch(self) -> torch.Tensor:
        idx = prompt_indices(
            self._step,
            self.batch_size,
            self.ctx.layout.dp,
            self.ctx.coords.dp_rank,
            len(self.samples),
        )
        return self.samples[idx].to(self.device)

    def step(self) -> None:
        ids = self._batch()
        self._step += 1
        loss: torch.Tensor | None
        if self.schedule is None:
            loss = causal_lm_loss(self.stage(ids), ids)
            loss.backward()
        else:
            losses: list[torch.Tensor] | None = [] if self.last else None
            args = (ids,) if self.first else ()
            target = ids if self.last else None
            self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
            loss = torch.stack(losses).mean() if losses is not None else None
        if self.dp_group is not None:
            self._all_reduce_grads()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if loss is not None:
            self._losses.append(loss.detach())

    def _all_reduce_grads(self) -> None:
        """Average gradients over DP replicas: one flat all-reduce per dtype (DTensors: local)."""
        grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in local:
            by_dtype.setdefault(g.dtype, []).append(g)
        for tensors in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            torch.distributed.all_reduce(flat, group=self.dp_group)
            flat /= self.ctx.layout.dp
            offset = 0
            for t in tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def take_losses(self) -> list[float]:
        """Per-step global-batch losses since the last call (every rank gets them; collective)."""
        c = self.ctx.coords
        holder = self.last and c.tp_rank == 0  # TP ranks of the last stage hold equal losses
        mine = (c.dp_rank, torch.stack(self._losses).float().tolist()) if holder else None
        self._losses = []
        per_replica = dict(r for r in dist.gather(mine) if r is not None)
        return window_loss([per_replica[d] for d in sorted(per_replica)])[1]

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Checkpoint name -> full parameter of this stage (collective over the TP group)."""
        return {
            checkpoint_key(n, self.layers): _full(p) for n, p in self.hf_model.named_parameters()
        }

    def close(self) -> None:
        # The model, its optimizer and schedule go (a closed trainer is not used again).
        if hasattr(self, "stage"):
            del self.schedule, self.stage, self.optimizer, self.hf_model
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def make_trainer(
    ctx,
    cfg: Training,
    batch_size: int,
    samples: torch.Tensor,
    n_steps: int | None,
    accelerator=None,
) -> AccelerateTrainer | MeshTrainer:
    """The trainer for this rank's layout at one batch size (a fresh copy of the checkpoint).

    Args:
        n_steps: optimizer steps the trainer will run (sizes the Accelerate dataloader); None:
            not known in advance.
        accelerator: required for pure-DP layouts (see :func:`uses_accelerate`).
    """
    from accelerate.utils import set_seed

    set_seed(ctx.seed)
    if uses_accelerate(ctx.layout):
        if accelerator is None:
            raise ValueError(f"layout {ctx.layout} trains through Accelerate; pass the accelerator")
        return AccelerateTrainer(accelerator, ctx, cfg, batch_size, samples, n_steps)
    micro = effective_microbatches(batch_size, cfg.microbatches)
    if ctx.layout.pp_enabled and micro != cfg.microbatches:
        log.warning(
            "batch_size %d: %d GPipe micro-batches instead of %d (must divide the batch)",
            batch_size,
            micro,
            cfg.microbatches,
        )
    return MeshTrainer(ctx, cfg, batch_size, samples, micro)

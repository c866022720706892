"""The ``training`` scenario: energy per training token of fixed optimizer steps, per layout.

:class:`TrainingMeasurer` has the shape of :class:`energysweep.run.Measurer` — ``point(batch_size)``
returns, per repetition, this rank's rows in the shard schema — so ``run.main`` only picks one or
the other by the job's scenario. Each grid point (batch size) is a fresh short training run: the
checkpoint is loaded again, ``warmup_steps`` unmeasured optimizer steps run, then ``repetitions``
windows of ``steps`` optimizer steps each, training continuing from window to window.

How a layout trains (one rank = one process under torchrun; ``batch_size`` is per replica and the
global batch is ``batch_size * dp`` sequences of ``seq_len`` tokens):

* **tp = pp = 1 (pure DP, dp >= 1)**: HuggingFace Accelerate. The ``Accelerator`` is created inside
  :func:`make_accelerator` (never at import), with ``cpu=True`` on CPU: without it Accelerate does
  not join the torchrun world and every rank silently trains alone (``DistributedType.NO``).
  :func:`audit_accelerator` gathers what Accelerate sees on every rank and fails the job
  (:class:`energysweep.dist.LayoutMismatch`) unless it is exactly the layout's DP world. Model,
  optimizer and dataloader go through ``prepare`` (DDP over the world, the dataloader sharded
  per process), the step through ``accelerator.backward``, the loss through ``accelerator.gather``,
  and ``free_memory`` releases everything between grid points.
* **tp > 1 or pp > 1**: our own 3-D mesh (``dist.make_context``). TP uses the inference backend's
  plan (:func:`energysweep.backends.pt_parallel.apply_tensor_parallel`: q/k/v/gate/up colwise,
  o/down rowwise) on the mesh's ``"tp"`` axis; PP splits the decoder layers as inference does
  (``layout.stage_layers``) and runs ``torch.distributed.pipelining`` ``PipelineStage`` +
  ``ScheduleGPipe`` with a ``loss_fn`` over the mesh's ``"pp"`` axis. DP, when also > 1, is one
  flat all-reduce of the gradients over the mesh's ``"dp"`` axis after the schedule. Accelerate is
  not used here because its ``prepare`` wraps DDP over the whole world (a DP group of a 3-D layout
  is a sub-group) and its TP goes through transformers' own ``tp_plan``, which builds its own mesh
  over the whole world and cannot compose with our stage split (see pt_parallel's docstring).

Every layout runs the same stage forward (:class:`TrainStage`) and loss (:func:`causal_lm_loss`:
mean next-token cross entropy over all tokens), and every sequence has exactly ``seq_len`` tokens,
so a global batch gives the same mean loss and gradient however it is split over replicas or
micro-batches; the integration tests check DP/TP/PP against one process within 1e-4.

Row mapping (schema in :mod:`energysweep.shards`): ``phase = "train"``, ``iterations`` = optimizer
steps in the window, ``requests`` = sequences trained on (all replicas), ``input_tokens`` = tokens
trained on (all replicas), ``output_tokens`` = null (training generates nothing), ``loss`` = mean
over the window's steps of the global-batch loss (gathered across DP replicas).
"""

from __future__ import annotations

import gc
import logging

import torch
import torch.nn.functional as F
from torch import nn

from energysweep import dist, faults
from energysweep.grid import ParallelLayout
from energysweep.oom import is_oom
from energysweep.run import PHASE_GENERATE, Measurer, _prompt_indices

log = logging.getLogger(__name__)

PHASE = "train"
OPTIMIZERS = ("adamw", "sgd")
# Length of the Accelerate dataloader when the step count is not known in advance.
UNBOUNDED_STEPS = 2**40


# ----------------------------------------------------------------------------------------------
# Pure helpers


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


def accelerate_view(accelerator, rank: int) -> dict:
    """What Accelerate believes about this process (gathered for :func:`check_accelerate_world`)."""
    dtype = accelerator.distributed_type
    return {
        "rank": rank,
        "num_processes": int(accelerator.num_processes),
        "process_index": int(accelerator.process_index),
        "distributed_type": str(getattr(dtype, "value", dtype)),
        "device": str(accelerator.device),
    }


def same_device(a: str, b: str) -> bool:
    """Same device type, and same index for accelerators (Accelerate names CPU ``cpu:0``)."""
    da, db = torch.device(a), torch.device(b)
    return da.type == db.type and (da.type == "cpu" or (da.index or 0) == (db.index or 0))


def check_accelerate_world(views: list[dict], layout: ParallelLayout, devices: list[str]) -> None:
    """Fail unless Accelerate sees exactly the layout's data-parallel world on every rank.

    Args:
        views: :func:`accelerate_view` of every rank, in rank order.
        layout: the job's layout (tp = pp = 1 on this path).
        devices: the torch device each rank computes on, in rank order.

    Raises:
        LayoutMismatch: naming the expected and observed world sizes (the CPU-without-``cpu=True``
            mistake reads "expects world size 2 ... observed world size 1 (NO)").
    """
    expected = layout.dp
    observed = sorted({v["num_processes"] for v in views})
    types = sorted({v["distributed_type"] for v in views})
    problems = []
    if observed != [expected]:
        problems.append(
            f"layout {layout} expects Accelerate world size {expected} (one process per DP "
            f"replica) but Accelerate observed world size {'/'.join(map(str, observed))} "
            f"(distributed_type {'/'.join(types)}) on ranks {[v['rank'] for v in views]}"
        )
    elif expected > 1 and "NO" in types:
        problems.append(f"layout {layout} has dp={expected} but Accelerate reports NO distribution")
    indices = [v["process_index"] for v in views]
    if not problems and indices != [v["rank"] for v in views]:
        problems.append(f"Accelerate process indices {indices} differ from the torchrun ranks")
    bad_dev = [
        (v["rank"], v["device"], d)
        for v, d in zip(views, devices, strict=True)
        if not same_device(v["device"], d)
    ]
    if bad_dev:
        problems.append(
            "Accelerate placed ranks on other devices than the job chose (rank, accelerate, job): "
            f"{bad_dev}"
        )
    if problems:
        raise dist.LayoutMismatch(
            "; ".join(problems)
            + ". On CPU, create Accelerator(cpu=True) (or set ACCELERATE_USE_CPU=1): otherwise "
            "every rank trains the whole batch alone. Refusing to train."
        )


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position of every sequence (float32)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, vocab).float(), input_ids[:, 1:].reshape(-1).to(logits.device)
    )


def training_config(spec: dict) -> dict:
    """The job spec's ``training`` section (validated and defaulted by the config schema)."""
    cfg = spec.get("training")
    if not isinstance(cfg, dict):
        raise ValueError(
            "the job spec has no `training` section; rules/common.smk get_job_spec must pass "
            "config['training'] for scenario=training jobs"
        )
    missing = {"steps", "warmup_steps", "seq_len", "data", "optimizer", "lr", "microbatches"} - set(
        cfg
    )
    if missing:
        raise ValueError(f"training section lacks {sorted(missing)} (validate the config first)")
    if cfg["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"training.optimizer {cfg['optimizer']!r} is not one of {OPTIMIZERS}")
    return cfg


# ----------------------------------------------------------------------------------------------
# Data


class TokenDataset(torch.utils.data.Dataset):
    """``length`` fixed-length token sequences; sample ``i`` is ``samples[i % len(samples)]``.

    Every layout reads the same samples by global index, so a global batch is the same data
    whether one process or ``dp`` replicas train on it.
    """

    def __init__(self, samples: torch.Tensor, length: int):
        self.samples = samples
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.samples[index % len(self.samples)]


def synthetic_samples(vocab_size: int, seq_len: int, seed: int, n: int = 256) -> torch.Tensor:
    """``n`` sequences of uniformly random token ids from a seeded generator (same on all ranks)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n, seq_len), generator=gen, dtype=torch.long)


def packed_prompt_samples(prompts: list[str], tokenizer, seq_len: int) -> torch.Tensor:
    """The prompts tokenized, joined with EOS, and cut into full ``seq_len`` chunks (no padding).

    Raises:
        ValueError: the prompts hold fewer than ``seq_len`` tokens.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in prompts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos is not None:
            ids.append(int(eos))
    n = len(ids) // seq_len
    if n == 0:
        raise ValueError(
            f"the prompts hold {len(ids)} tokens, fewer than training.seq_len={seq_len}; "
            "lower seq_len or use training.data: synthetic"
        )
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def load_samples(cfg: dict, model_dir: str, prompts: list[str], seed: int) -> torch.Tensor:
    """The job's unique training sequences (``training.data``: prompts or synthetic)."""
    if cfg["data"] == "synthetic":
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        return synthetic_samples(vocab, cfg["seq_len"], seed)
    if cfg["data"] == "prompts":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        return packed_prompt_samples(prompts, tokenizer, cfg["seq_len"])
    raise ValueError(f"training.data {cfg['data']!r} is not prompts or synthetic")


# ----------------------------------------------------------------------------------------------
# The model of one stage


class TrainStage(nn.Module):
    """One pipeline stage of a Llama-style causal LM (the whole model when pp = 1).

    Wraps the (pruned, possibly TP-sharded) HF model so its parameters keep their checkpoint
    names under ``model.``; the first stage takes token ids, later ones hidden states; the last
    returns logits. Sequences are unpadded and start at position 0 (training data is packed).
    """

    def __init__(self, model: nn.Module, first: bool, last: bool):
        super().__init__()
        from energysweep.backends import pt_parallel

        self.model = model
        self.first, self.last = first, last
        pt_parallel._decoder(model)  # refuses non-Llama-style models with a clear message
        self.attn = model.config._attn_implementation
        if self.attn not in pt_parallel.SUPPORTED_ATTENTION:
            raise ValueError(
                f"attention {self.attn!r} unsupported; use {pt_parallel.SUPPORTED_ATTENTION}"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from energysweep.backends.pt_parallel import position_ids_from_mask, stage_attention_mask

        inner = self.model.model
        hidden = inner.embed_tokens(x) if self.first else x
        batch, seq = hidden.shape[:2]
        pad = torch.ones(batch, seq, dtype=torch.long, device=hidden.device)
        position_ids = position_ids_from_mask(pad)
        mask = stage_attention_mask(pad, seq, self.attn, hidden.dtype)
        position_embeddings = inner.rotary_emb(hidden, position_ids)
        for layer in inner.layers:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
            )
            if isinstance(hidden, tuple):
                hidden = hidden[0]
        if self.last:
            return self.model.lm_head(inner.norm(hidden))
        return hidden


def _load_stage(ctx: dist.RankContext) -> tuple[nn.Module, range]:
    """This rank's stage of the checkpoint, in train mode (weights as stored, same on every run)."""
    from transformers import AutoConfig

    from energysweep.backends import pt_parallel
    from energysweep.backends.pytorch import DTYPES
    from energysweep.grid import ModelDims

    layout, c = ctx.layout, ctx.coords
    config = AutoConfig.from_pretrained(ctx.model_dir)
    reasons = layout.unrunnable_reasons(ModelDims.from_hf_config(config.to_dict()))
    if reasons:
        raise ValueError(f"layout {layout} cannot train {ctx.model_dir}: " + "; ".join(reasons))
    layers = layout.stage_layers(config.num_hidden_layers, c.pp_rank)
    model = pt_parallel.load_stage_model(
        ctx.model_dir,
        DTYPES[ctx.dtype],
        torch.device(ctx.device),
        layers,
        first=c.pp_rank == 0,
        last=c.pp_rank == layout.pp - 1,
    )
    if layout.tp_enabled:
        # DTensor mode: its redistributions are differentiable. The inference default ("local")
        # swaps in plain modules whose weights do not require grad and whose collectives have
        # no backward.
        pt_parallel.apply_tensor_parallel(model, ctx.mesh["tp"], mode="dtensor")
    return model.train(), layers


def _optimizer(cfg: dict, params) -> torch.optim.Optimizer:
    if cfg["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=cfg["lr"])
    return torch.optim.SGD(params, lr=cfg["lr"])


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter as one full CPU tensor (DTensor shards gathered: collective over its mesh)."""
    t = t.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.cpu().clone()


# ----------------------------------------------------------------------------------------------
# Trainers: one optimizer step per call, the same interface for both paths


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
        # [s*G + d*bs, s*G + (d+1)*bs), G = bs*dp — the same split as run._prompt_indices.
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
            self.schedule = self._gpipe(cfg["seq_len"], microbatches)
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
        idx = _prompt_indices(
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
        if self.schedule is None:
            loss = causal_lm_loss(self.stage(ids), ids)
            loss.backward()
        else:
            losses: list[torch.Tensor] | None = [] if self.last else None
            args = (ids,) if self.first else ()
            target = ids if self.last else None
            self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
            loss = torch.stack(losses).mean() if self.last else None
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
        from energysweep.backends.pt_parallel import checkpoint_key

        return {
            checkpoint_key(n, self.layers): _full(p) for n, p in self.hf_model.named_parameters()
        }

    def close(self) -> None:
        self.schedule = self.stage = self.optimizer = self.hf_model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def make_accelerator(device: str):
    """The job's Accelerator, created here and not at import (it starts Accelerate's state).

    ``cpu=True`` on CPU is what makes Accelerate join the torchrun world over gloo; without it
    every rank reports ``DistributedType.NO`` and trains alone (:func:`audit_accelerator` fails
    such a job).
    """
    from accelerate import Accelerator

    return Accelerator(cpu=device == "cpu")


def audit_accelerator(accelerator, ctx: dist.RankContext) -> dict:
    """Gather Accelerate's view from every rank and fail unless it is the layout's world.

    Returns this rank's view. Raises :class:`energysweep.dist.LayoutMismatch` on every rank alike
    (the views are all-gathered), so no rank is left waiting in a collective.
    """
    view = accelerate_view(accelerator, ctx.rank)
    gathered = dist.gather((view, ctx.device))
    check_accelerate_world([v for v, _ in gathered], ctx.layout, [d for _, d in gathered])
    return view


def make_trainer(
    ctx, cfg: dict, batch_size: int, samples: torch.Tensor, n_steps: int | None, accelerator=None
):
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
    micro = effective_microbatches(batch_size, cfg["microbatches"])
    if ctx.layout.pp_enabled and micro != cfg["microbatches"]:
        log.warning(
            "batch_size %d: %d GPipe micro-batches instead of %d (must divide the batch)",
            batch_size,
            micro,
            cfg["microbatches"],
        )
    return MeshTrainer(ctx, cfg, batch_size, samples, micro)


# ----------------------------------------------------------------------------------------------
# The measurer


class TrainingMeasurer(Measurer):
    """Runs the training windows of one job on one rank; ``run.main`` drives it like a Measurer.

    Reuses :class:`energysweep.run.Measurer`'s set-up (the monitor's GPU and host sources, the
    parameter count) and row builder; replaces what a point runs. ``generations`` stays empty
    (training generates nothing). Window rule as for inference (run's module docstring): a window
    runs at least ``training.steps`` optimizer steps and repeats steps until it also lasts
    ``measurement.min_window_s``; all ranks stop after the same step.
    """

    def __init__(self, spec: dict, ctx: dist.RankContext, prompts: list[str], monitor):
        super().__init__(spec, ctx, None, prompts, monitor)
        self.cfg = training_config(spec)
        self.last_step_losses: list[list[float]] = []  # per window of the last point (for tests)
        self.accelerator = None
        if uses_accelerate(ctx.layout):
            # Outside any per-point error handling: a wrong world fails the job, not one point.
            self.accelerator = make_accelerator(ctx.device)
            audit_accelerator(self.accelerator, ctx)
        self.samples = load_samples(self.cfg, ctx.model_dir, prompts, spec["seed"])

    def _sync(self) -> None:
        self.monitor.synchronize()

    def train_window(self, trainer, bs: int) -> dict:
        """One measured window of optimizer steps; the run.Measurer.window dict plus the loss."""
        w = self.measured(lambda _: trainer.step(), self.cfg["steps"], self._sync)
        per_step_loss = trainer.take_losses()  # after the window: a collective + host sync
        # Per-rank counts are non-zero only on each replica's writer; run._finalize_window sums
        # them over ranks into the window total (all replicas).
        steps = w["iterations"]
        tokens = bs * steps * self.cfg["seq_len"] if self.ctx.coords.is_writer else 0
        return {
            **w,
            "tin": tokens,
            "tout": None,
            "loss": sum(per_step_loss) / len(per_step_loss),
            "step_losses": per_step_loss,
        }

    def _failed_rows(self, bs: int, rep: int, status: str, msg: str) -> list[dict]:
        # Inference's failed rows cover its phases; a training point has the one phase.
        rows = super()._failed_rows(bs, rep, status, msg)
        return [{**r, "phase": PHASE} for r in rows if r["phase"] == PHASE_GENERATE]

    def point(self, bs: int) -> list[list[dict]]:
        """All windows of one batch size: a list (one per repetition) of this rank's rows."""
        reps = self.wl["repetitions"]
        cooldown_s = float(self.m.get("cooldown_s", 0))
        windows: list[list[dict]] = []
        self.last_step_losses = []
        error = None
        trainer = None
        try:
            faults.inject(self.ctx.rank, bs, "training")  # test-only; off unless env var set
            trainer = make_trainer(self.ctx, self.cfg, bs, self.samples, None, self.accelerator)
            for _ in range(self.cfg["warmup_steps"]):
                trainer.step()
            if self.cfg["warmup_steps"]:
                trainer.take_losses()
            for rep in range(reps):
                self.sleep(cooldown_s)
                w = self.train_window(trainer, bs)
                self.last_step_losses.append(w["step_losses"])
                windows.append([{**r, "loss": w["loss"]} for r in self._rows(bs, rep, PHASE, w)])
        except dist.LayoutMismatch:
            raise
        except Exception as exc:  # agreed across ranks: the point's status, or the job aborts
            error = self.point_error(exc, is_oom(exc))
        finally:
            if trainer is not None:
                trainer.close()
            if self.accelerator is not None:
                self.accelerator.free_memory()
        return self.agree_on_failure(error, bs, windows)

    def close(self) -> None:
        if self.accelerator is not None:
            self.accelerator.free_memory()
        self.samples = None

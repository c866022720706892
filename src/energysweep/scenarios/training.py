"""The ``training`` scenario: energy per training token of fixed optimizer steps, per layout.

:class:`TrainingScenario` runs the point loop of :class:`energysweep.scenarios.base.Scenario`; each
grid point (batch size) is a fresh short training run: the checkpoint is loaded again,
unmeasured optimizer steps run until step time is steady (at least ``warmup_steps``;
energysweep.measure.warmup), then ``repetitions`` windows of ``steps``
optimizer steps each, training continuing from window to window.

How a layout trains (one rank = one process under torchrun; ``batch_size`` is per replica and the
global batch is ``batch_size * dp`` sequences of ``seq_len`` tokens): pure DP through HuggingFace
Accelerate, checked by :mod:`.accelerate_world`; any model parallelism over our mesh
(:mod:`.trainers`). Every layout runs the same stage forward and loss, and every sequence has
exactly ``seq_len`` tokens, so a global batch gives the same mean loss and gradient however it is
split over replicas or micro-batches; the integration tests check DP/TP/PP against one process
within 1e-4.

Row mapping (schema in :mod:`energysweep.tables.shards`): ``phase = "train"``, ``iterations`` =
optimizer steps in the window, ``requests`` = sequences trained on (all replicas),
``input_tokens`` = tokens trained on (all replicas), ``output_tokens`` = null (training generates
nothing), ``loss`` = mean over the window's steps of the global-batch loss (gathered across DP
replicas).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from energysweep import dist
from energysweep.job.sections import Training
from energysweep.job.spec import LaunchedJob
from energysweep.measure.phase_clock import during
from energysweep.scenarios.accelerate_world import audit_accelerator, make_accelerator
from energysweep.scenarios.base import Scenario
from energysweep.scenarios.train_data import load_samples
from energysweep.scenarios.trainers import make_trainer, uses_accelerate

if TYPE_CHECKING:
    import torch

    from energysweep.scenarios.trainers import AccelerateTrainer, MeshTrainer
from energysweep.tables.phases import JobPhase, Phase


def training_config(job: LaunchedJob) -> Training:
    """The job's ``training`` section (validated and defaulted by the config schema)."""
    if job.training is None:
        raise ValueError(
            "the job has no `training` section; rules/common.smk get_job_spec builds it "
            "(JobSpec.from_config) with config['training'] for scenario=training jobs"
        )
    return job.training


class TrainingScenario(Scenario):
    """Runs the training windows of one job on one rank (no backend: it loads per point).

    ``generations`` stays empty (training generates nothing). Window rule as for inference
    (:mod:`energysweep.measure.window`): a window runs at least ``training.steps`` optimizer steps
    and repeats steps until it also lasts ``measurement.min_window_s``; all ranks stop after the
    same step.
    """

    name = "training"
    prepare_what = "model load and warm-up"

    def __init__(self, job: LaunchedJob, ctx: dist.RankContext, prompts: list[str], monitor):
        super().__init__(job, ctx, None, prompts, monitor)
        self.cfg = training_config(job)
        self.last_step_losses: list[list[float]] = []  # per window of the last point (for tests)
        self.accelerator = None
        if uses_accelerate(ctx.layout):
            # Outside any per-point error handling: a wrong world fails the job, not one point.
            self.accelerator = make_accelerator(ctx.device)
            audit_accelerator(self.accelerator, ctx)
        self.samples: torch.Tensor | None = load_samples(self.cfg, ctx.model_dir, prompts, job.seed)
        self.trainer: AccelerateTrainer | MeshTrainer | None = None

    def _sync(self) -> None:
        self.monitor.synchronize()

    def train_window(self, trainer, bs: int) -> dict:
        """One measured window of optimizer steps: :meth:`measured`'s dict, tokens, the loss."""
        w = self.measured(lambda _: trainer.step(), self.cfg.steps, self._sync)
        per_step_loss = trainer.take_losses()  # after the window: a collective + host sync
        # Per-rank counts are non-zero only on each replica's writer; combine_ranks
        # (energysweep.measure.combine) sums them over ranks into the window total.
        steps = w["iterations"]
        tokens = bs * steps * self.cfg.seq_len if self.ctx.coords.is_writer else 0
        return {
            **w,
            "tin": tokens,
            "tout": None,
            "loss": sum(per_step_loss) / len(per_step_loss),
            "step_losses": per_step_loss,
        }

    def phases(self) -> list[Phase]:
        return [Phase.TRAIN]

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, dist.LayoutMismatch)

    def prepare(self, bs: int) -> None:
        self.last_step_losses = []
        if self.samples is None:
            raise RuntimeError("the training scenario was closed")
        with during(JobPhase.LOAD):  # a trainable copy of the model per point
            trainer = make_trainer(self.ctx, self.cfg, bs, self.samples, None, self.accelerator)
        self.trainer = trainer
        self.warm_up_until_steady(bs, lambda _: trainer.step(), self._sync, self.cfg.warmup_steps)
        if self.cfg.warmup_steps:
            trainer.take_losses()

    def repetition(self, bs: int, rep: int, cooldown_s: float) -> list[dict]:
        self.cool_down(cooldown_s)
        w = self.train_window(self.trainer, bs)
        self.last_step_losses.append(w["step_losses"])
        return [{**r, "loss": w["loss"]} for r in self._rows(bs, rep, Phase.TRAIN, w)]

    def end_point(self) -> None:
        if self.trainer is not None:
            # An Accelerate trainer's close() is Accelerator.free_memory (its prepared objects
            # dropped, one garbage collection): not a second one per point.
            self.trainer.close()
            self.trainer = None
        elif self.accelerator is not None:
            self.accelerator.free_memory()

    def close(self) -> None:
        if self.accelerator is not None:
            self.accelerator.free_memory()
        self.samples = None

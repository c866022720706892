"""Jobs for tests, built through the production constructors: a small config validated by
``energysweep.sweep.config`` (the schema fills every default), then ``JobSpec.from_config``
(what rules/common.smk does) and, for ranks, ``JobSpec.launched`` (what the launcher does).

No test writes a job spec by hand: a spec that the validated config cannot make cannot appear.
"""

from __future__ import annotations

import copy
from pathlib import Path

from energysweep.job.layout import ParallelLayout
from energysweep.job.sections import Limits, load_section
from energysweep.job.spec import JobDir, JobKey, JobSpec, LaunchedJob
from energysweep.sweep import config as es_config

# CPU ranks, no idle baseline, cooldown or sampler, and windows as short as one iteration:
# what a test job needs unless it says otherwise.
FAST = {
    "min_window_s": 0,
    "idle_baseline_s": 0,
    "cooldown_s": 0,
    "sampler_hz": 0,
    "device": "cpu",
}
# Windows of a few iterations (the schema asks for 32, what a publishable point needs).
FAST_WORKLOAD = {"iterations": 2}
FAST_TRAINING = {"steps": 4}


def validated_config(**sections) -> dict:
    """A config of one builtin tiny model named ``tiny`` plus ``sections``, validated (defaults
    filled) as the workflow validates it."""
    cfg = {"models": [{"name": "tiny", "path": "builtin:tiny"}], **copy.deepcopy(sections)}
    return es_config.validate_schema(cfg)


def job_spec(
    layout: ParallelLayout | None = None,
    scenario: str = "inference",
    backend: str = "pytorch",
    batch_sizes=(1,),
    reps: int = 1,
    measurement: dict | None = None,
    workload: dict | None = None,
    training: dict | None = None,
    engine: dict | None = None,
    power_limit_w: str | None = None,
    gpu_clock: str | None = None,
    **config,
) -> JobSpec:
    """The spec of one job of the tiny model; ``measurement`` overrides :data:`FAST`, ``workload``
    and ``training`` :data:`FAST_WORKLOAD` and :data:`FAST_TRAINING`, the other sections the
    schema's defaults, ``config`` sets top-level keys (``dtype``, ...).
    ``layout`` defaults to one rank; ``power_limit_w``/``gpu_clock`` are the key's GPU setting
    axes as text (None: not swept), their values in ``config``'s ``gpu`` section."""
    layout = layout or ParallelLayout()
    cfg = validated_config(
        workload={
            "batch_sizes": list(batch_sizes),
            "repetitions": reps,
            **FAST_WORKLOAD,
            **(workload or {}),
        },
        measurement={**FAST, **(measurement or {})},
        training={**FAST_TRAINING, **(training or {})},
        engine=engine or {},
        **config,
    )
    degrees = (layout.tp, layout.pp, layout.dp)
    key = JobKey("tiny", backend, scenario, *degrees, power_limit_w, gpu_clock)
    return JobSpec.from_config(cfg, key)


def limits(**overrides) -> Limits:
    """The schema's ``limits`` with ``overrides``."""
    return load_section(Limits, validated_config(limits=overrides)["limits"], "limits")


def launched_job(
    out: str | Path, model_dir: str | Path = "no-checkpoint", job_id: str = "test", **spec
) -> LaunchedJob:
    """:func:`job_spec` as the ranks read it, its outputs in ``out`` (a JobDir)."""
    s = job_spec(**spec)
    return s.launched(
        model_dir=str(model_dir),
        outputs=JobDir(str(out)).outputs(
            s.batch_sizes, s.workload.repetitions, emulated=s.measurement.device == "emulated"
        ),
        limits=limits(),
        code_version="test",
        launch_argv=[],
        job_id=job_id,
    )


def rank_context(job: JobSpec, device: str, model_dir: str | Path, tp_mode: str = "local"):
    """This process's rank context for ``job``, as energysweep.run makes it (dist.make_context)."""
    from energysweep import dist

    return dist.make_context(
        job.placement,
        device,
        model_dir=str(model_dir),
        dtype=job.dtype,
        seed=job.seed,
        max_input_tokens=job.workload.max_input_tokens,
        tp_mode=tp_mode,
    )

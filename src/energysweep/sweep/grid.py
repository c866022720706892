"""The sweep grid: the cross product of models, backends, scenarios and layouts, split into
the jobs that will run (each a :class:`energysweep.job.spec.JobKey`) and the points left out,
each with its reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from energysweep.job.backends import BACKENDS, SERVING
from energysweep.job.layout import ModelDims, ParallelLayout
from energysweep.job.sections import Engine
from energysweep.job.spec import JobKey


def engine_unsupported(
    backend: str, layout: ParallelLayout, engine: Engine | None, on_cpu: bool, scenario: str = ""
) -> list[str]:
    """Why ``backend``'s engine cannot run ``layout`` in ``scenario`` with these engine options
    (empty: it can): the reasons of its registry record's ``unsupported`` entries that hold
    (energysweep.job.backends), decided here from the config instead of hanging a job at run time.

    Args:
        engine: the config section ``engine`` (None: no engine options to check).
        on_cpu: the ranks compute on CPUs (measurement.device, see config.runs_on_cpu).
    """
    features = {f"{dim}>1" for dim in ("tp", "pp", "dp") if getattr(layout, dim) > 1}
    features.add("on_cpu" if on_cpu else "on_gpu")
    if engine is not None and engine.enforce_eager:
        features.add("eager")
    return BACKENDS[backend].unsupported_reasons(
        features, scenario or "inference", layout.tp, layout.pp, layout.dp
    )


@dataclass
class Grid:
    """The expanded grid: jobs that will run, and combinations left out with their reason."""

    jobs: list[JobKey] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)


def expand_grid(
    models: dict[str, ModelDims | None],
    backends: list[str],
    scenarios: list[str],
    tp: list[int],
    pp: list[int],
    dp: list[int],
    max_gpus_per_job: int,
    gpus_per_node: int | None = None,
    engine: Engine | None = None,
    on_cpu: bool = False,
    serving_parallel: dict | None = None,
) -> Grid:
    """Cross product of the grid's dimensions, split into runnable jobs and skipped points.

    A point that can never run (tp not dividing heads, more ranks than a job may have, a backend
    without that dimension or scenario, a layout the backend cannot launch on nodes of
    ``gpus_per_node`` GPUs, an engine limit of :func:`engine_unsupported` given the ``engine``
    options and whether ranks run ``on_cpu``) is not an error: it is returned in ``skipped`` with
    a reason. Serving jobs sweep ``serving_parallel``'s layouts (config ``serving.parallel``)
    where given.
    """
    grid = Grid()
    for (model, dims), backend, scenario, layout in (
        (m, b, sc, lay)
        for m, b, sc in itertools.product(models.items(), backends, scenarios)
        for lay in _layouts(serving_parallel if sc == SERVING and serving_parallel else
                            {"tp": tp, "pp": pp, "dp": dp})
    ):  # fmt: skip
        job = JobKey(model, backend, scenario, layout.tp, layout.pp, layout.dp)
        reasons = []
        caps = BACKENDS[backend]
        for dim in ("tp", "pp", "dp"):
            if getattr(layout, dim) > 1 and dim not in caps.dims:
                reasons.append(f"backend {backend} does not support {dim}>1")
        if scenario not in caps.scenarios:
            reasons.append(f"backend {backend} does not support scenario {scenario}")
        if layout.world_size > max_gpus_per_job:
            reasons.append(
                f"tp*pp*dp={layout.world_size} exceeds parallel.max_gpus_per_job={max_gpus_per_job}"
            )
        if gpus_per_node is not None:
            reasons += job.placement_on(gpus_per_node).unsupported()
        reasons += layout.unrunnable_reasons(dims)
        if scenario in caps.scenarios:
            reasons += engine_unsupported(backend, layout, engine, on_cpu, scenario)
        if reasons:
            grid.skipped.append({**job.wildcards(), "reason": "; ".join(reasons)})
        else:
            grid.jobs.append(job)
    return grid


def _layouts(parallel: dict) -> list[ParallelLayout]:
    """The layouts of tp x pp x dp lists, each sorted and once."""
    return [
        ParallelLayout(t, p, d)
        for t, p, d in itertools.product(
            sorted(set(parallel["tp"])), sorted(set(parallel["pp"])), sorted(set(parallel["dp"]))
        )
    ]

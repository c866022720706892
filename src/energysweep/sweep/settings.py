"""The GPU setting axes of the grid (``gpu.power_limit_w``, ``gpu.clock``) and the ``facility``
estimates: checks when the workflow loads, the grid's product, and what a job's submission asks.

A swept axis becomes a path part of its jobs (``power_limit_w~300/gpu_clock~medium``; ``unset``
for a null value: the GPU as the node has it). Values a job cannot have are decided here, before
anything is submitted: a clock word Slurm does not know is a config error; a setting on CPU ranks
(no GPU to set) is a skipped point with its reason.
"""

from __future__ import annotations

import dataclasses
import itertools

from energysweep.hw.gpu_freq import ClockSyntaxError, parse_clock
from energysweep.job.placement import Placement
from energysweep.sweep.grid import UNSET, Grid, wildcard_value

# Wildcard name of each axis -> its config key under `gpu:`.
AXES = {"power_limit_w": "power_limit_w", "gpu_clock": "clock"}
# Characters a setting may bring into a path or an sbatch argument (checked: parse_clock).
WILDCARD_CONSTRAINTS = {
    "power_limit_w": r"unset|\d+(\.\d+)?",
    "gpu_clock": r"unset|[a-z0-9]+(,memory=[a-z0-9]+)?|memory=[a-z0-9]+",
}


def check(config: dict) -> list[str]:
    """Problems with ``gpu`` and ``facility`` the schema cannot see, each naming the key."""
    problems = []
    for i, clock in enumerate(config["gpu"]["clock"]):
        if clock is None:
            continue
        try:
            spec = parse_clock(clock)
        except ClockSyntaxError as exc:
            problems.append(f"config key gpu.clock[{i}]: {exc}")
            continue
        if spec.text != str(clock):
            problems.append(f"config key gpu.clock[{i}]: write {spec.text!r} without spaces")
    return problems + _check_estimates(config["facility"])


def _check_estimates(facility: dict) -> list[str]:
    """An estimate is usable only with its source, year and band (low <= value <= high)."""
    problems = []
    for name, entry in facility.items():
        key = f"facility.{name}"
        if entry["value"] is None:
            extra = [k for k in ("low", "high") if entry[k] is not None]
            if extra:
                problems.append(
                    f"config key {key}.{extra[0]}: a band without a value; set {key}.value too"
                )
            continue
        for part in ("source", "year"):
            if entry[part] in (None, ""):
                problems.append(
                    f"config key {key}.{part}: {key}.value {entry['value']:g} needs its {part} "
                    "(an estimate without provenance cannot be cited); add it"
                )
        low, high = entry["low"], entry["high"]
        if low is None or high is None:
            problems.append(
                f"config key {key}.low/high: {key}.value {entry['value']:g} needs an "
                "uncertainty band (low <= value <= high)"
            )
        elif not low <= entry["value"] <= high:
            problems.append(
                f"config key {key}: the band must hold the value: low {low:g} <= value "
                f"{entry['value']:g} <= high {high:g}"
            )
    return problems


def swept_axes(config: dict) -> list[str]:
    """The wildcard names of the axes the config sweeps (in :data:`AXES` order)."""
    return [axis for axis, key in AXES.items() if config["gpu"][key]]


def no_gpu_reason(device: str, gpus_here: bool) -> str | None:
    """Why ranks on ``device`` have no GPU to set (None: they have one).

    Args:
        device: ``measurement.device``.
        gpus_here: this host has NVIDIA GPU device nodes (what ``auto`` resolves by).
    """
    if device == "cpu" or (device == "auto" and not gpus_here):
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
    axes = swept_axes(config)
    if not axes:
        return grid
    values = [config["gpu"][AXES[a]] for a in axes]
    out = Grid(skipped=[])
    for entry in grid.skipped:
        for combo in itertools.product(*values):
            out.skipped.append(_with_axes(entry, axes, combo))
    for job, combo in itertools.product(grid.jobs, itertools.product(*values)):
        setting = tuple(zip(axes, combo, strict=True))
        job = dataclasses.replace(job, setting=setting)
        reason = no_gpu if any(v is not None for v in combo) else None
        reason = reason or _launcher_node_only(job, dict(setting), config)
        if reason:
            out.skipped.append({**job.wildcards(), "reason": reason})
        else:
            out.jobs.append(job)
    return out


def _launcher_node_only(job, setting: dict, config: dict) -> str | None:
    """An NVML power limit is set by the launcher on its own node: a multi-node job's other
    nodes would run unset (energysweep.launch.gpu_guard)."""
    gpu, par = config["gpu"], config["parallel"]
    if setting.get("power_limit_w") is None or gpu["power_limit_method"] != "nvml":
        return None
    nodes = Placement(job.layout, job.backend, par["gpus_per_node"]).nodes
    if nodes == 1:
        return None
    return (
        f"gpu.power_limit_method nvml sets the power limit on the launcher's node only; this "
        f"layout spans {nodes} nodes: use slurm-prolog (the site's Prolog sets every node)"
    )


def _with_axes(entry: dict, axes: list[str], combo) -> dict:
    reason = entry["reason"]
    keys = {k: v for k, v in entry.items() if k != "reason"}
    return {
        **keys,
        **{a: wildcard_value(v) for a, v in zip(axes, combo, strict=True)},
        "reason": reason,
    }


def request(wildcards) -> dict | None:
    """A job's setting from its wildcards: ``{"power_limit_w": W|None, "clock": str|None}``;
    None when neither is set (the job changes nothing, and its spec says nothing)."""
    power = wildcards.get("power_limit_w", UNSET)
    clock = wildcards.get("gpu_clock", UNSET)
    out = {
        "power_limit_w": None if power == UNSET else float(power),
        "clock": None if clock == UNSET else str(clock),
    }
    return out if any(v is not None for v in out.values()) else None


def slurm_extra(wildcards) -> str | None:
    """``--gpu-freq=<clock>`` for the job's sbatch (Slurm sets and resets the clocks), or None.

    The value passed :func:`check` (Slurm's vocabulary: letters, digits, ``,memory=``), so it
    is safe on the plugin's sbatch command line.
    """
    req = request(wildcards) or {}
    if req.get("clock") is None:
        return None
    return f"--gpu-freq={parse_clock(req['clock']).text}"


def constraint(wildcards, config: dict) -> str | None:
    """The node feature asking the site's prolog for the job's power limit, or None."""
    req = request(wildcards) or {}
    gpu = config["gpu"]
    if req.get("power_limit_w") is None or gpu["power_limit_method"] != "slurm-prolog":
        return None
    return gpu["prolog_constraint"].replace("{watts}", str(round(req["power_limit_w"])))

"""Settings that can give a valid point: a config's workload and measurement against its own
``validity`` thresholds, before any job.

A point's verdict (energysweep.validity.verdict) is decided after the sweep, but some of its
checks follow from the settings alone. Each check here names a verdict reason that the settings
make certain (too few repetitions, no GPU energy, no power timeline), or that only windows
running longer than asked could avoid (``repetitions x min_window_s`` short of the steady state,
windows shorter than the counter periods asked for, fewer iterations than asked for): a figure
to publish must meet the thresholds by its settings, not by luck. Each problem names the keys
and the smallest fix.

:func:`problems` is pure; energysweep.sweep.config.check refuses such a config where its ranks
compute on GPUs (its figures are meant to be cited) unless ``validity.exploratory`` is set, and
warns otherwise (CPU ranks and the emulated node give no valid point anyway).
"""

from __future__ import annotations

import math

# Scenarios whose windows run fixed iterations (serving windows count finished requests).
BATCH_SCENARIOS = ("inference", "training")


def _at_least(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{math.ceil(x * 100) / 100:g}"


def problems(config: dict) -> list[str]:
    """What keeps every point of the validated ``config`` from being valid (empty: nothing)."""
    wl, m, v = config["workload"], config["measurement"], config["validity"]
    out = []
    reps, window = wl["repetitions"], float(m["min_window_s"])
    if reps < v["min_ok_repetitions"]:
        out.append(
            f"workload.repetitions {reps} < validity.min_ok_repetitions "
            f"{v['min_ok_repetitions']} (few_repetitions on every point): set "
            f"workload.repetitions >= {v['min_ok_repetitions']}"
        )
    steady = float(v["min_steady_state_s"])
    if reps * window < steady:
        fix = f"workload.repetitions >= {math.ceil(steady / window)}, or " if window > 0 else ""
        out.append(
            f"workload.repetitions {reps} x measurement.min_window_s {window:g} s = "
            f"{reps * window:g} s < validity.min_steady_state_s {steady:g} s "
            f"(steady_state_short unless every window runs longer than asked): set {fix}"
            f"measurement.min_window_s >= {_at_least(steady / reps)}"
        )
    shortest = float(v["min_counter_periods"]) * float(v["counter_period_s"])
    if window < shortest:
        out.append(
            f"measurement.min_window_s {window:g} s < validity.min_counter_periods "
            f"{v['min_counter_periods']:g} x validity.counter_period_s {v['counter_period_s']:g} s "
            f"= {shortest:g} s (window_short unless windows run longer than asked): set "
            f"measurement.min_window_s >= {_at_least(shortest)}"
        )
    out += _iterations(config)
    if m["energy_source"] == "none":
        out.append(
            "measurement.energy_source none measures no GPU energy (no_gpu_energy on every "
            "point): set measurement.energy_source auto, nvml or cross-check"
        )
    if v["require_timeline"] and float(m["sampler_hz"]) == 0:
        out.append(
            "measurement.sampler_hz 0 records no power timeline, and validity.require_timeline "
            "is true (no_timeline on every point): set measurement.sampler_hz 10"
        )
    return out


def _iterations(config: dict) -> list[str]:
    """Windows asked for fewer iterations than ``validity.min_iterations`` (few_iterations
    unless they run longer than asked)."""
    need = config["validity"]["min_iterations"]
    asked = []
    if "inference" in config["scenarios"]:
        asked.append(("workload.iterations", config["workload"]["iterations"]))
    if "training" in config["scenarios"]:
        asked.append(("training.steps", config["training"]["steps"]))
    return [
        f"{key} {n} < validity.min_iterations {need} (few_iterations unless windows run "
        f"longer than asked): set {key} >= {need}"
        for key, n in asked
        if n < need
    ]


def refuse(config: dict, on_gpus: bool) -> bool:
    """Whether :func:`problems` refuse the config (a GPU sweep, not ``validity.exploratory``)
    rather than warn."""
    return on_gpus and not config["validity"]["exploratory"]


def message(found: list[str], refused: bool) -> str:
    """The refusal or the warning, one problem a line."""
    head = (
        "these settings can give no valid point (validity.exploratory: true runs them anyway, "
        "every point flagged):"
        if refused
        else "warning: these settings can give no valid point (fine for trying things out):"
    )
    return head + "\n  " + "\n  ".join(found)

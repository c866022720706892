"""A validity verdict on every summary point: ``valid`` and stable ``invalid_reasons`` codes.

A point is valid when every check below that applies to it passes; each failing check adds its
code to ``invalid_reasons`` (joined with ``;`` in the order of :data:`REASONS`). A check that
cannot run on a point (no GPU energy, no timeline) is listed in ``validity_unchecked`` instead,
and the point is never valid without GPU energy (``no_gpu_energy``). Thresholds come from the
config section ``validity:`` (config/config.schema.yaml, README "Validity verdict", where each
default's source is cited).

Inputs are the point summary (energysweep.aggregate.points.summarize), the merged shard rows,
and the re-check table (energysweep.validity.recheck: timeline vs counter per window, observed
counter period, clock event reasons, idle stability).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from energysweep.job.spec import JobDir
from energysweep.tables import power as tp
from energysweep.tables.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS
from energysweep.tables.status import ACCEPTED, NOT_IN_EFFECT, EnergyStatus, Status
from energysweep.validity import recheck as rc
from energysweep.validity import serving as sv
from energysweep.validity import shared as sh
from energysweep.validity import stages as st
from energysweep.validity.perpoint import per_point as _per_point
from energysweep.validity.perpoint import point_index as _point_index
from energysweep.validity.thresholds import Thresholds

# Every reason code, in the order invalid_reasons lists them: code -> what it means.
REASONS: dict[str, str] = {
    "emulated": "measured on the emulated GPU node (measurement.device emulated): a test of the "
    "method, never a figure to cite",
    "cap_not_applied": "the point's gpu.power_limit_w was refused, or not read back as asked",
    "clock_not_applied": "the point's gpu.clock was refused, or not read back as asked",
    "no_gpu_energy": "no GPU energy was measured for the point (CPU run, no NVML, or disabled)",
    "partial_gpus": "a GPU of the layout has no energy figure, or fewer GPUs than tp*pp*dp",
    "gpu_shared": sh.REASONS["gpu_shared"],
    "counter_stuck": "a GPU's energy counter did not move over a window spanning 2+ periods",
    "edge_read_slow": sh.REASONS["edge_read_slow"],
    "window_short": "median window < validity.min_counter_periods x counter period",
    "few_iterations": "median window ran < validity.min_iterations iterations",
    "steady_state_short": "steady state behind the figure < validity.min_steady_state_s",
    "few_repetitions": "ok repetitions < validity.min_ok_repetitions",
    "ci_wide": "95% CI half-width of energy per token > validity.max_ci_half_width x median",
    "batch_not_full": "requests per iteration < validity.min_batch_fill x batch_size x dp",
    "idle_unstable": "a GPU's idle-baseline power std > validity.max_idle_std_w",
    "throttled": "a validity.throttle_reasons clock event reason was seen during a window",
    "no_timeline": "a window could not be re-checked against the power timeline",
    "recheck_mismatch": "|timeline / counter - 1| > validity.max_recheck_deviation in a window",
    **sv.REASONS,
}
# Checks that need GPU energy (listed as unchecked on points without it).
GPU_CHECKS = (
    "partial_gpus",
    "gpu_shared",
    "counter_stuck",
    "edge_read_slow",
    "ci_wide",
    "idle_unstable",
    "throttled",
    "no_timeline",
    "recheck_mismatch",
)

# Checks that need at least one ok window.
WINDOW_CHECKS = ["window_short", "few_iterations", "steady_state_short", "batch_not_full"]


# New summary columns -> status columns that explain a null in them (aggregate.nulls).
_GPU = ("gpu_energy_status", "status")
NULL_STATUS: dict[str, tuple[str, ...]] = {
    "steady_state_s": ("status",),
    "batch_fill": ("status", "serving_status"),
    "ci_half_width_fraction": ("ci_status", *_GPU),
    "observed_counter_period_s": ("recheck_status", *_GPU),
    "recheck_ratio": ("recheck_status", *_GPU),
    "recheck_max_deviation": ("recheck_status", *_GPU),
    "idle_gpu_power_std_w": ("idle_check_status", *_GPU),
    "stage_gpu_energy_share_max": ("stage_status", *_GPU),
    "stage_gpu_energy_share_min": ("stage_status", *_GPU),
    "stage_gpu_energy_max_min_ratio": ("stage_status", *_GPU),
    "stage_cpu_time_max_min_ratio": ("stage_status", "status"),
    "gpu_energy_max_min_ratio": _GPU,
    "gpu_model": _GPU,
    **sh.NULL_STATUS,
    **sv.NULL_STATUS,
}
# Free text where empty means "nothing to report".
INFO_COLUMNS = {
    "invalid_reasons",
    "validity_unchecked",
    "clock_event_reasons_seen",
    *sh.INFO_COLUMNS,
    *sv.INFO_COLUMNS,
}

ROW_COLUMNS = sorted(
    set(rc.ROW_COLUMNS)
    | set(st.ROW_COLUMNS)
    | set(sh.ROW_COLUMNS)
    | {"requests", "iterations", "gpu_name", "gpu_energy_method"}
)


def _throttle_mask(names) -> int:
    return int(sum(tp.CLOCK_EVENT_REASONS[n] for n in names))


def annotate(
    summary: pd.DataFrame,
    rows: pd.DataFrame,
    validation: pd.DataFrame,
    c: Thresholds,
    overlaps: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """``summary`` with the verdict, re-check, stage and ML.ENERGY-parity columns added.

    Args:
        summary: one row per point (energysweep.aggregate.points.summarize).
        rows: merged shard rows with at least :data:`ROW_COLUMNS`.
        validation: the re-check table (energysweep.validity.recheck.recheck).
        c: the thresholds (the config's ``validity:`` section, :meth:`Thresholds.from_config`).
        overlaps: windows of different jobs on one GPU at once
            (energysweep.aggregate.overlap.shared_windows; None: none found).
    """
    if summary.empty:
        return summary
    s = summary.copy()
    ok_head = rows[(rows["status"] == Status.OK) & rows["phase"].isin(HEADLINE_PHASES)]
    win = ok_head.drop_duplicates(WINDOW_KEYS).copy()
    win["batch_fill"] = win["requests"] / (win["iterations"] * win["batch_size"] * win["dp"])
    s["batch_fill"] = _per_point(win, s, "batch_fill", "median")
    # Serving: the engine's batch use, mean requests running / (cap x dp) (no validity check:
    # the load, not a full batch, is what a serving point sets).
    serving = sv.is_serving(s)
    if serving.any():
        use = s["achieved_concurrency"] / (s["batch_size"] * s["dp"])
        s["batch_fill"] = np.where(serving, use, s["batch_fill"])
    # Steady state behind the point's figure: the ok windows' total time. A window runs only
    # full batches after the warm-up iterations, so all of it is steady state (batch_fill
    # says whether the batches were full).
    s["steady_state_s"] = _per_point(
        win.assign(_d=(win["window_end_ns"] - win["window_start_ns"]) / 1e9), s, "_d", "sum"
    )

    gpu_status = s["gpu_energy_status"].astype(str)
    has_energy = gpu_status.str.contains("|".join(ACCEPTED)) & s["energy_per_iteration_j"].notna()
    checks = _recheck_columns(s, validation, win, has_energy, c)
    _idle_columns(s, rows, validation[validation["scope"] == "idle"], has_energy)
    s["ci_half_width_fraction"] = _ci_half_width_fraction(s)
    layout_gpus = (s["tp"] * s["pp"] * s["dp"]).astype(int)
    # Every row measured on the emulated node says so (hw.nvml.label): never a valid point.
    emu = rows["gpu_energy_method"].astype(str).str.startswith("emulated:").astype(float)
    checks["emulated"] = _per_point(rows.assign(_emu=emu), s, "_emu", "any") > 0
    # Every ok window feeds the point, not only the headline phase's: decode is generate minus
    # prefill, and stages.csv holds each phase. A prefill window on a shared GPU, or with a
    # slow edge read, moves the point's figures as much (CI run 54: a prefill window's start
    # extrapolated 253 ms past a missed refresh, its stage 23% over the truth, unflagged).
    ok_rows = rows[rows["status"] == Status.OK]
    checks["shared"] = sh.columns(
        s, ok_rows, overlaps if overlaps is not None else pd.DataFrame(), checks["period"]
    )
    _verdict(s, c, gpu_status, has_energy, layout_gpus, **checks)

    s = pd.concat([s, st.summary_columns(rows, s)], axis=1)
    s = sv.knee(s, c)
    # ML.ENERGY v3 parity (README, "ML.ENERGY v3 parity"): GPUs of the layout and GPU model.
    s["gpu_count"] = layout_gpus
    names = ok_head[ok_head["gpu_name"].notna()].drop_duplicates([*POINT_KEYS, "gpu_name"])
    model = names.groupby(POINT_KEYS)["gpu_name"].agg(lambda x: ",".join(sorted(set(x))))
    s["gpu_model"] = (
        s[POINT_KEYS].merge(model.reset_index(), on=POINT_KEYS, how="left")["gpu_name"].to_numpy()
    )
    return s


def _recheck_columns(
    s: pd.DataFrame,
    validation: pd.DataFrame,
    win: pd.DataFrame,
    has_energy: pd.Series,
    c: Thresholds,
) -> dict:
    """Adds the re-check columns to ``s`` (in place); returns what the verdict needs from them:
    the counter period, and per point whether a window was unchecked, stuck or throttled."""
    vw = validation[(validation["scope"] == "window") & validation["phase"].isin(HEADLINE_PHASES)]
    vw = vw.merge(win[WINDOW_KEYS], on=WINDOW_KEYS, how="inner")  # ok windows only
    vg = validation[(validation["scope"] == "gpu") & validation["phase"].isin(HEADLINE_PHASES)]
    vg = vg.merge(win[WINDOW_KEYS], on=WINDOW_KEYS, how="inner")
    observed = _per_point(vg, s, "observed_counter_period_s", "max")
    period = np.fmax(float(c.counter_period_s), np.nan_to_num(observed, nan=0.0))
    s["counter_period_s"] = period
    s["observed_counter_period_s"] = observed
    vw_ratio = vw.assign(_dev=(vw["timeline_counter_ratio"] - 1).abs())
    s["recheck_ratio"] = _per_point(vw_ratio, s, "timeline_counter_ratio", "median")
    s["recheck_max_deviation"] = _per_point(vw_ratio, s, "_dev", "max")
    not_ok = vw.assign(_bad=(vw["status"] != rc.OK).astype(float))
    any_unchecked = _per_point(not_ok, s, "_bad", "any") > 0
    s["recheck_status"] = np.where(
        ~has_energy,
        "not-applicable (no GPU energy)",
        np.where(
            any_unchecked,
            "incomplete (a window could not be re-checked: validation.parquet says why)",
            Status.OK,
        ),
    )
    stuck = vg["counter_stuck"].fillna(False).astype(bool) | (
        (vg["counter_energy_j"] == 0) & (vg["duration_s"] >= 2 * c.counter_period_s)
    )
    s_stuck = _per_point(vg.assign(_stuck=stuck.astype(float)), s, "_stuck", "any") > 0
    reasons_or = vg["clock_event_reasons"].astype("Float64").fillna(0).astype(np.int64)
    mask = _throttle_mask(c.throttle_reasons)
    throttled = (
        _per_point(vg.assign(_t=((reasons_or & mask) != 0).astype(float)), s, "_t", "any") > 0
    )
    seen_pos = _point_index(vg, s)
    seen_mask = np.zeros(len(s), dtype=np.int64)
    keep = seen_pos >= 0
    np.bitwise_or.at(seen_mask, seen_pos[keep], reasons_or.to_numpy()[keep])
    s["clock_event_reasons_seen"] = [tp.reason_names(m) or None for m in seen_mask]
    return {
        "period": period,
        "any_unchecked": any_unchecked,
        "s_stuck": s_stuck,
        "throttled": throttled,
    }


def _idle_columns(
    s: pd.DataFrame, rows: pd.DataFrame, vi: pd.DataFrame, has_energy: pd.Series
) -> None:
    """Adds idle stability to ``s``: GPUs of the point's job(s), over the job's idle baseline."""
    jobs = rows[["job_id", *POINT_KEYS]].drop_duplicates()
    idle = (
        vi[["job_id", "gpu_uuid", "power_std_w", "samples"]].merge(jobs, on="job_id", how="inner")
        if len(vi)
        else pd.DataFrame(columns=["job_id", "gpu_uuid", "power_std_w", "samples", *POINT_KEYS])
    )
    s["idle_gpu_power_std_w"] = _per_point(idle, s, "power_std_w", "max") if len(idle) else np.nan
    s["idle_check_status"] = np.where(
        ~has_energy,
        "not-applicable (no GPU energy)",
        np.where(
            s["idle_gpu_power_std_w"].notna(),
            Status.OK,
            "unavailable (no idle baseline or no power samples in it)",
        ),
    )


def _ci_half_width_fraction(s: pd.DataFrame) -> np.ndarray:
    """Per point the CI half-width of its headline energy per token over its median."""
    metric = np.where(
        s["scenario"] == "training", "energy_per_train_token_j", "energy_per_output_token_j"
    )
    med = np.array([s.at[i, m] for i, m in zip(s.index, metric, strict=True)], dtype=float)
    lo = np.array(
        [s.at[i, f"{m}_ci_low"] for i, m in zip(s.index, metric, strict=True)], dtype=float
    )
    hi = np.array(
        [s.at[i, f"{m}_ci_high"] for i, m in zip(s.index, metric, strict=True)], dtype=float
    )
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero median: no fraction
        return np.where(med > 0, (hi - lo) / 2 / med, np.nan)


def _verdict(
    s: pd.DataFrame,
    c: Thresholds,
    gpu_status: pd.Series,
    has_energy: pd.Series,
    layout_gpus: pd.Series,
    period: np.ndarray,
    any_unchecked: np.ndarray,
    s_stuck: np.ndarray,
    throttled: np.ndarray,
    emulated: np.ndarray,
    shared: tuple[dict, dict],
) -> None:
    """Adds ``valid``, ``invalid_reasons`` and ``validity_unchecked`` to ``s`` (in place)."""
    n = len(s)
    window_s = s["window_s"].to_numpy(dtype=float)
    fails = {
        "emulated": emulated,
        **_setting_fails(s),
        "no_gpu_energy": ~has_energy & ~gpu_status.str.contains(EnergyStatus.PARTIAL),
        "partial_gpus": gpu_status.str.contains(EnergyStatus.PARTIAL)
        | (has_energy & (s["n_gpus"] < layout_gpus)),
        "counter_stuck": has_energy & s_stuck,
        "window_short": ~(window_s >= c.min_counter_periods * period),
        "few_iterations": ~(s["iterations_per_window"] >= c.min_iterations),
        "steady_state_short": ~(s["steady_state_s"] >= c.min_steady_state_s),
        "few_repetitions": s["repetitions_ok"] < c.min_ok_repetitions,
        "ci_wide": has_energy & (s["ci_half_width_fraction"] > c.max_ci_half_width),
        "batch_not_full": ~(s["batch_fill"] >= c.min_batch_fill - 1e-9),
        "idle_unstable": has_energy & (s["idle_gpu_power_std_w"] > c.max_idle_std_w),
        "throttled": has_energy & throttled,
        "no_timeline": has_energy & any_unchecked & bool(c.require_timeline),
        "recheck_mismatch": has_energy & (s["recheck_max_deviation"] > c.max_recheck_deviation),
        **{k: has_energy & v for k, v in shared[0].items()},
    }
    serving_fails, serving_unknown = sv.fails(s, c)
    fails.update(serving_fails)
    fails["batch_not_full"] &= ~sv.is_serving(s)
    fails = {k: np.array(v, dtype=bool) for k, v in fails.items()}
    # A point with no ok window has nothing to time: few_repetitions says it, and the window
    # checks are listed as unchecked rather than failed.
    no_ok = (s["repetitions_ok"] == 0).to_numpy()
    for k in WINDOW_CHECKS:
        fails[k] &= ~no_ok
    codes = [";".join(k for k in REASONS if fails[k][i]) for i in range(n)]
    unchecked = []
    for i in range(n):
        skip = [] if has_energy.iloc[i] else list(GPU_CHECKS)
        if no_ok[i]:
            skip += WINDOW_CHECKS
        if has_energy.iloc[i] and s["idle_check_status"].iloc[i] != Status.OK:
            skip.append("idle_unstable")
        if has_energy.iloc[i] and any_unchecked[i]:
            skip += ["counter_stuck", "throttled", "recheck_mismatch"]
        skip += [k for k, unknown in serving_unknown.items() if unknown[i]]
        if has_energy.iloc[i]:
            skip += [k for k, unknown in shared[1].items() if unknown[i] and not fails[k][i]]
        unchecked.append(";".join(k for k in REASONS if k in skip))
    s["valid"] = [not x for x in codes]
    s["invalid_reasons"] = codes
    s["validity_unchecked"] = unchecked


def _setting_fails(s: pd.DataFrame) -> dict:
    """``cap_not_applied``/``clock_not_applied``: a setting asked for is not what was measured
    at (refused, read back otherwise, or not verifiable: energysweep.aggregate.gpu_setting)."""
    bad = [str(x) for x in NOT_IN_EFFECT]
    out = {}
    for code, column in (
        ("cap_not_applied", "gpu_power_limit_status"),
        ("clock_not_applied", "gpu_clock_status"),
    ):
        out[code] = s[column].isin(bad) if column in s else np.zeros(len(s), dtype=bool)
    return out


def evaluate(
    summary: pd.DataFrame,
    rows: pd.DataFrame,
    jobs: list[str | Path],
    thresholds: Thresholds,
    overlaps: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Re-check (validation table), stages and verdict: the merge step's hook.

    Returns the annotated summary, the validation table and the per-stage table; the merge
    writes them together with its other outputs (all or nothing).
    """
    power_files = [JobDir.of(j).power for j in jobs]
    power = tp.load_power([p for p in power_files if Path(p).is_file()])
    validation = rc.recheck(rows, power, rc.idle_bounds(jobs), thresholds.power_average_s)
    return (
        annotate(summary, rows, validation, thresholds, overlaps),
        validation,
        st.stage_table(rows),
    )

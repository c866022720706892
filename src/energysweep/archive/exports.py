"""A sweep's figures in the units other benchmarks publish (``results/exports/``).

Three tables, each from ``summary.csv`` (and, for the spread over windows, ``energy.parquet``),
units in every column name, never a 0 where nothing was measured (the figure is null and its
``gpu_energy_status`` says why); docs/exports.md says where each one's format comes from:

- :func:`mlenergy` — ML.ENERGY Leaderboard style: model, GPU, engine, batch, J/output token,
  J/request, output tokens/s per inference and serving point;
- :func:`ai_energy_score` — AI Energy Score's unit, GPU Wh per 1,000 queries, for batch-1
  inference points, each labelled with how our protocol differs from theirs;
- :func:`mlcommons` — the fields of MLCommons' proposed LLM energy schema per point:
  ``measurement_method``, ``sampling_rate_hz``, ``thermal_stabilization_seconds``, J/token mean
  and standard deviation over the point's measured windows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from energysweep.aggregate.windows import MEASURED, WINDOW_COLUMNS, windows
from energysweep.tables.io import atomic_path
from energysweep.tables.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS
from energysweep.tables.status import Status

EXPORT_FILES = {
    "mlenergy": "mlenergy.csv",
    "ai_energy_score": "ai_energy_score.csv",
    "mlcommons": "mlcommons.csv",
}
J_PER_WH = 3600.0
SPREAD_COLUMNS = (
    "energy_per_token_J_mean",
    "energy_per_token_J_std",
    "energy_per_token_windows",
    "output_tokens_per_request",
)
EMULATED_PREFIX = "emulated"

# How our batch-1 inference windows differ from AI Energy Score's protocol (Hugging Face's
# optimum-benchmark, PyTorch backend, batch 1, 1,000 prompts of its own data set, one H100,
# energy from CodeCarbon): said on every row of that export.
AI_ENERGY_SCORE_DIFFERENCES = (
    "not AI Energy Score's protocol: our prompts (workload.prompts) and fixed output length "
    "(workload.output_tokens, EOS ignored) instead of its 1,000-prompt data set; our engine and "
    "layout (see engine, tp, pp, dp) instead of optimum-benchmark's PyTorch backend on one GPU; "
    "GPU energy from the board energy counter over repeated timed windows (median over "
    "repetitions), not CodeCarbon over one pass; a query is one prompt of the window"
)
THERMAL_NOTE = (
    "measurement.cooldown_s of idle before every window, after workload.warmup_iterations "
    "unmeasured iterations; no temperature-based settling"
)


def _emulated(summary: pd.DataFrame) -> pd.Series:
    source = summary.get("energy_source", pd.Series("", index=summary.index))
    return source.fillna("").astype(str).str.contains(EMULATED_PREFIX)


def _layout_columns(summary: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": summary["model"],
            "gpu_model": summary.get("gpu_model"),
            "gpu_count": summary.get("gpu_count"),
            "engine": summary["backend"],
            "scenario": summary["scenario"],
            "tp": summary["tp"],
            "pp": summary["pp"],
            "dp": summary["dp"],
            "power_limit_w": summary["power_limit_w"],
            "gpu_clock": summary["gpu_clock"],
        }
    )


def _provenance_columns(summary: pd.DataFrame) -> dict:
    return {
        "energy_source": summary["energy_source"],
        "gpu_energy_status": summary["gpu_energy_status"],
        "emulated_gpu": _emulated(summary),
        "valid": summary["valid"],
        "invalid_reasons": summary["invalid_reasons"],
    }


def mlenergy(summary: pd.DataFrame) -> pd.DataFrame:
    """ML.ENERGY-style rows: one per inference or serving point (training is not theirs)."""
    s = summary[summary["scenario"].isin(["inference", "serving"])].reset_index(drop=True)
    out = _layout_columns(s)
    out["batch_size"] = s["batch_size"]
    out["load"] = s["load"]
    out["energy_per_output_token_J"] = s["energy_per_output_token_j"]
    out["energy_per_output_token_J_ci_low"] = s["energy_per_output_token_j_ci_low"]
    out["energy_per_output_token_J_ci_high"] = s["energy_per_output_token_j_ci_high"]
    out["energy_per_request_J"] = s["energy_per_request_j"]
    out["output_throughput_tokens_per_s"] = s["output_tokens_per_s"]
    out["avg_gpu_power_W"] = s["mean_gpu_power_w"]
    for k, v in _provenance_columns(s).items():
        out[k] = v
    return out


def _with_spread(s: pd.DataFrame, spread: pd.DataFrame) -> pd.DataFrame:
    """``spread``'s columns for the points of ``s``, in its order (null where none)."""
    return s[POINT_KEYS].astype(str).merge(spread, on=POINT_KEYS, how="left")


def ai_energy_score(summary: pd.DataFrame, spread: pd.DataFrame) -> pd.DataFrame:
    """GPU Wh per 1,000 queries for batch-1 inference points (a query: one prompt)."""
    s = summary[(summary["scenario"] == "inference") & (summary["batch_size"] == 1)]
    s = s.reset_index(drop=True)
    out = _layout_columns(s)
    out["batch_size"] = s["batch_size"]
    j_per_query = s["energy_per_request_j"]
    out["gpu_energy_per_query_J"] = j_per_query
    out["gpu_energy_per_1000_queries_Wh"] = j_per_query * 1000.0 / J_PER_WH
    out["output_tokens_per_query"] = _with_spread(s, spread)["output_tokens_per_request"]
    for k, v in _provenance_columns(s).items():
        out[k] = v
    out["protocol_differences"] = AI_ENERGY_SCORE_DIFFERENCES
    return out


def window_spread(energy: pd.DataFrame) -> pd.DataFrame:
    """Per point: mean, standard deviation and count of J/token over its ok headline windows."""
    win = windows(energy[WINDOW_COLUMNS]) if len(energy) else pd.DataFrame(columns=POINT_KEYS)
    if win.empty:
        return pd.DataFrame(columns=[*POINT_KEYS, *SPREAD_COLUMNS])
    win = win[win["phase"].isin(HEADLINE_PHASES) & (win["status"] == Status.OK)].copy()
    per_token = win["energy_per_output_token_j"].where(
        win["phase"] != "train", win["energy_per_train_token_j"]
    )
    win["j_per_token"] = per_token
    win["tokens_per_request"] = win["output_tokens"] / win["requests"]
    keys = list(POINT_KEYS)
    for k in keys:
        win[k] = win[k].astype(str)
    grouped = win.groupby(keys, sort=True)
    return pd.DataFrame(
        {
            "energy_per_token_J_mean": grouped["j_per_token"].mean(),
            # Sample standard deviation (ddof 1); null with one window.
            "energy_per_token_J_std": grouped["j_per_token"].std(ddof=1),
            "energy_per_token_windows": grouped["j_per_token"].count(),
            "output_tokens_per_request": grouped["tokens_per_request"].median(),
        }
    ).reset_index()


def _counter(summary: pd.DataFrame) -> pd.Series:
    """Points whose GPU energy came from a counter (a source that reads one, and a figure)."""
    source = summary["energy_source"].fillna("none").astype(str)
    return source.str.contains("nvml|zeus|cross-check") & summary["gpu_energy_status"].isin(
        MEASURED
    )


def _method(summary: pd.DataFrame) -> pd.Series:
    source = summary["energy_source"].fillna("none").astype(str)
    counter = _counter(summary)
    return pd.Series(
        np.where(
            counter,
            source + ": cumulative GPU board energy counter, window edges aligned to refreshes",
            source + ": no GPU energy measured",
        ),
        index=summary.index,
    )


def mlcommons(summary: pd.DataFrame, spread: pd.DataFrame, measurement: dict) -> pd.DataFrame:
    """MLCommons' proposed per-point fields (mlcommons/inference #2558), units in the names."""
    s = summary.reset_index(drop=True)
    out = _layout_columns(s)
    out["batch_size"] = s["batch_size"]
    out["load"] = s["load"]
    out["measurement_method"] = _method(s)
    period = pd.to_numeric(s.get("counter_period_s"), errors="coerce")
    # The counter's refresh rate is the rate at which energy is resolved; no counter read: null.
    out["sampling_rate_hz"] = (1.0 / period).where((period > 0) & _counter(s))
    out["power_timeline_sampling_rate_hz"] = float(measurement["sampler_hz"])
    out["thermal_stabilization_seconds"] = float(measurement["cooldown_s"])
    out["thermal_stabilization_method"] = THERMAL_NOTE
    spread = _with_spread(s, spread)
    for c in SPREAD_COLUMNS[:3]:
        out[c] = spread[c].to_numpy()
    out["energy_per_token_unit"] = np.where(
        s["scenario"] == "training", "J per trained token", "J per output token"
    )
    for k, v in _provenance_columns(s).items():
        out[k] = v
    return out


def write_exports(
    summary_csv: str | Path, energy_dir: str | Path, measurement: dict, out_dir: str | Path
) -> dict[str, Path]:
    """Write the three exports into ``out_dir``; returns their paths by name."""
    summary = pd.read_csv(summary_csv)
    spread = window_spread(pd.read_parquet(energy_dir))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = {
        "mlenergy": mlenergy(summary),
        "ai_energy_score": ai_energy_score(summary, spread),
        "mlcommons": mlcommons(summary, spread, measurement),
    }
    paths = {}
    for name, frame in tables.items():
        paths[name] = out_dir / EXPORT_FILES[name]
        with atomic_path(paths[name]) as tmp:
            frame.to_csv(tmp, index=False)
    return paths

"""Shards -> merged rows -> one row per window -> one row per grid point.

Counting rule: a window's GPU energy is the sum over its *distinct* GPU UUIDs, so a GPU reported
by two ranks counts once, and every node's GPUs of a multi-node job are included. If any GPU
of the window has no measured energy the window's energy is null (never a partial sum).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from energysweep import shards

POINT_KEYS = ["model", "backend", "scenario", "tp", "pp", "dp", "batch_size"]
WINDOW_KEYS = ["job_id", *POINT_KEYS, "repetition", "phase"]
MEASURED = {"measured", "short-window"}


def merge(paths: list[str | Path]) -> pa.Table:
    """Read every shard once, check its schema, and concatenate."""
    return pa.concat_tables([shards.read_shard(p) for p in paths]) if paths else shards.SCHEMA.empty_table()


def _window(group: pd.DataFrame) -> pd.Series:
    first = group.iloc[0]
    ok = first["status"] == "ok"
    gpus = group.dropna(subset=["gpu_uuid"]).drop_duplicates("gpu_uuid")
    statuses = set(group["gpu_energy_status"])
    if ok and len(gpus) and statuses <= MEASURED and gpus["gpu_energy_mj"].notna().all():
        energy_j = gpus["gpu_energy_mj"].sum() / 1e3
        estatus = "short-window" if "short-window" in statuses else "measured"
    else:
        energy_j = np.nan
        estatus = "unavailable" if statuses <= {"unavailable"} else "partial"
    details = sorted({d for d in group["gpu_energy_detail"].dropna()})
    dur = (first["window_end_ns"] - first["window_start_ns"]) / 1e9 if ok else np.nan
    out_tok = first["output_tokens"] if ok else np.nan
    return pd.Series(
        {
            "status": first["status"],
            "error": first["error"],
            "duration_s": dur,
            "iterations": first["iterations"],
            "requests": first["requests"],
            "input_tokens": first["input_tokens"],
            "output_tokens": out_tok,
            "n_ranks": group["rank"].nunique(),
            "n_processes": group[["host", "pid"]].drop_duplicates().shape[0],
            "n_gpus": len(gpus),
            "gpu_energy_j": energy_j,
            "gpu_energy_status": estatus,
            "gpu_energy_method": ",".join(sorted(set(group["gpu_energy_method"]))),
            "gpu_energy_detail": "; ".join(details) or None,
            "cpu_time_s": group.drop_duplicates(["host", "pid"])["cpu_time_s"].sum(min_count=1),
            "config_hash": first["config_hash"],
            "code_version": first["code_version"],
            "device": ",".join(sorted(set(group["device"]))),
        }
    )


def windows(energy: pd.DataFrame) -> pd.DataFrame:
    """One row per measured window, with derived per-token and per-second figures."""
    w = energy.groupby(WINDOW_KEYS, sort=True, dropna=False).apply(_window, include_groups=False)
    w = w.reset_index()
    w["energy_per_output_token_j"] = w["gpu_energy_j"] / w["output_tokens"]
    w["energy_per_request_j"] = w["gpu_energy_j"] / w["requests"]
    w["output_tokens_per_s"] = w["output_tokens"] / w["duration_s"]
    w["mean_gpu_power_w"] = w["gpu_energy_j"] / w["duration_s"]
    return w


def summarize(win: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point: medians over repetitions; status says what happened."""
    rows = []
    for key, g in win.groupby(POINT_KEYS, sort=True):
        ok = g[g["status"] == "ok"]
        if len(ok) == len(g):
            status = "ok"
        elif len(ok):
            status = "partial"
        else:
            status = ",".join(sorted(set(g["status"])))
        energy_statuses = sorted(set(ok["gpu_energy_status"])) if len(ok) else ["unavailable"]
        rows.append(
            {
                **dict(zip(POINT_KEYS, key)),
                "status": status,
                "error": "; ".join(sorted(set(g["error"].dropna()))) or None,
                "repetitions": len(g),
                "repetitions_ok": len(ok),
                "energy_per_output_token_j": ok["energy_per_output_token_j"].median(),
                "energy_per_request_j": ok["energy_per_request_j"].median(),
                "output_tokens_per_s": ok["output_tokens_per_s"].median(),
                "mean_gpu_power_w": ok["mean_gpu_power_w"].median(),
                "window_s": ok["duration_s"].median(),
                "output_tokens_per_window": ok["output_tokens"].median(),
                "n_processes": int(g["n_processes"].max()),
                "n_gpus": int(g["n_gpus"].max()),
                "gpu_energy_status": ",".join(energy_statuses),
                "gpu_energy_detail": "; ".join(sorted(set(ok["gpu_energy_detail"].dropna())))
                or None,
                "cpu_time_s": ok["cpu_time_s"].median(),
                "device": ",".join(sorted(set(g["device"]))),
                "config_hash": ",".join(sorted(set(g["config_hash"]))),
                "code_version": ",".join(sorted(set(g["code_version"]))),
            }
        )
    return pd.DataFrame(rows)


def aggregate(paths: list[str | Path], energy_out: str | Path, summary_out: str | Path) -> None:
    """Merge shards into ``energy_out`` (Parquet) and write the per-point ``summary_out`` (CSV)."""
    table = merge(paths)
    shards.write_atomic(table, energy_out)
    summary = summarize(windows(table.to_pandas()))
    tmp = Path(summary_out).with_suffix(".csv.tmp")
    summary.to_csv(tmp, index=False)
    tmp.replace(summary_out)

"""Energy per pipeline stage and per GPU: what per-GPU counters reveal about PP imbalance.

Each shard row names its rank's pipeline stage (``pp_rank``) and the GPU it measured, so a
window's GPU energy splits by stage with no extra measurement: a stage's energy is the sum over
its *distinct* GPUs (the same counting rule as the window total), null if any of them has none.
Its share is its energy over the sum of all stages' energy in that window. CPU time (measured,
``os.times`` per process) splits the same way, so CPU runs show the stages' compute balance
with energy left null.

``results/stages.csv`` holds one row per (point, phase, pp_rank): medians over the point's ok
repetitions. The summary gains, per point (headline phase): the largest and smallest stage
share, their max/min ratio, the same ratio over single GPUs, and the CPU-time ratio.
Engine backends measure every GPU of a replica from one process (all rows have pp_rank 0), so
their stages cannot be told apart: ``stage_status`` says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.tables.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS
from energysweep.tables.status import ACCEPTED, EnergyStatus, Status

ROW_COLUMNS = [
    *WINDOW_KEYS,
    "status",
    "host",
    "pid",
    "pp_rank",
    "gpu_uuid",
    "gpu_energy_mj",
    "gpu_energy_status",
    "cpu_time_s",
]
STAGE_COLUMNS = [
    *POINT_KEYS,
    "phase",
    "pp_rank",
    "repetitions_ok",
    "n_gpus",
    "gpu_energy_j",
    "gpu_energy_share",
    "gpu_energy_status",
    "cpu_time_s",
    "cpu_time_share",
]
MEASURED = ACCEPTED


def _complete_sum(g, column: str) -> pd.Series:
    """Per group the sum of ``column``, null unless every row has a value."""
    return g[column].sum(min_count=1).where(g[column].count() == g.size())


def per_window(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (ok window, pp_rank): GPU energy (J), GPU count and CPU time of the stage."""
    ok = rows[rows["status"] == Status.OK]
    keys = [*WINDOW_KEYS, "pp_rank"]
    gpus = ok[ok["gpu_uuid"].notna()].drop_duplicates([*WINDOW_KEYS, "gpu_uuid"]).copy()
    gpus["_j"] = (gpus["gpu_energy_mj"] / 1e3).where(gpus["gpu_energy_status"].isin(MEASURED))
    g = gpus.groupby(keys, sort=True)
    # A GPU counts once per window, so the stage's GPUs are its rows here.
    energy = pd.DataFrame({"gpu_energy_j": _complete_sum(g, "_j"), "n_gpus": g.size()})
    procs = ok.drop_duplicates([*WINDOW_KEYS, "host", "pid"])
    cpu = procs.groupby(keys, sort=True)["cpu_time_s"].sum(min_count=1).rename("cpu_time_s")
    out = pd.concat([energy, cpu], axis=1).reset_index()
    out["n_gpus"] = out["n_gpus"].fillna(0).astype(int)
    window = out.groupby(WINDOW_KEYS, sort=False)
    for col, share in (("gpu_energy_j", "gpu_energy_share"), ("cpu_time_s", "cpu_time_share")):
        total = (
            window[col]
            .transform("sum")
            .where(window[col].transform("count") == window[col].transform("size"))
        )
        out[share] = out[col] / total
    return out


def stage_table(rows: pd.DataFrame) -> pd.DataFrame:
    """``results/stages.csv``: per (point, phase, pp_rank) medians over ok repetitions."""
    w = per_window(rows)
    if w.empty:
        return pd.DataFrame(columns=STAGE_COLUMNS)
    g = w.groupby([*POINT_KEYS, "phase", "pp_rank"], sort=True)
    out = g.agg(
        repetitions_ok=("repetition", "nunique"),
        n_gpus=("n_gpus", "max"),
        gpu_energy_j=("gpu_energy_j", "median"),
        gpu_energy_share=("gpu_energy_share", "median"),
        cpu_time_s=("cpu_time_s", "median"),
        cpu_time_share=("cpu_time_share", "median"),
    ).reset_index()
    out["gpu_energy_status"] = np.where(
        out["gpu_energy_j"].notna(),
        EnergyStatus.MEASURED,
        np.where(
            out["n_gpus"] == 0,
            "unavailable (no GPU energy measured)",
            "partial (a GPU of the stage has no energy)",
        ),
    )
    return out[STAGE_COLUMNS]


def _per_gpu_ratio(rows: pd.DataFrame) -> pd.DataFrame:
    """Per ok window the max/min ratio of its single GPUs' energy (null unless all measured)."""
    ok = rows[(rows["status"] == Status.OK) & rows["gpu_uuid"].notna()]
    gpus = ok.drop_duplicates([*WINDOW_KEYS, "gpu_uuid"]).copy()
    gpus["_j"] = gpus["gpu_energy_mj"].where(gpus["gpu_energy_status"].isin(MEASURED))
    g = gpus.groupby(WINDOW_KEYS, sort=True)
    lo, hi = g["_j"].min(), g["_j"].max()
    ratio = (hi / lo).where((g["_j"].count() == g.size()) & (lo > 0))
    return ratio.rename("gpu_energy_max_min_ratio").reset_index()


def summary_columns(rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per summary point (headline phase) the stage columns, aligned with ``summary``'s rows."""
    w = per_window(rows)
    w = w[w["phase"].isin(HEADLINE_PHASES)]
    cols = {}
    if len(w):
        g = w.groupby(WINDOW_KEYS, sort=False)

        def mm(column: str) -> pd.Series:
            """max/min over the window's stages: 2 or more, all present, min > 0."""
            lo, hi = g[column].min(), g[column].max()
            n = g.size()
            return (hi / lo).where((n >= 2) & (g[column].count() == n) & (lo > 0))

        per = pd.DataFrame(
            {
                "share_max": g["gpu_energy_share"].max(),
                "share_min": g["gpu_energy_share"].min(),
                "energy_ratio": mm("gpu_energy_j"),
                "cpu_ratio": mm("cpu_time_s"),
                "stages": g["pp_rank"].nunique(),
            }
        ).reset_index()
        gpu_ratio = _per_gpu_ratio(rows)
        per = per.merge(gpu_ratio, on=WINDOW_KEYS, how="left")
        cols = (
            per.groupby(POINT_KEYS, sort=True)
            .agg(
                stage_gpu_energy_share_max=("share_max", "median"),
                stage_gpu_energy_share_min=("share_min", "median"),
                stage_gpu_energy_max_min_ratio=("energy_ratio", "median"),
                gpu_energy_max_min_ratio=("gpu_energy_max_min_ratio", "median"),
                stage_cpu_time_max_min_ratio=("cpu_ratio", "median"),
                stages_seen=("stages", "max"),
            )
            .reset_index()
        )
    keys = summary[POINT_KEYS]
    out = (
        keys.merge(cols, on=POINT_KEYS, how="left")
        if len(cols)
        else keys.assign(
            stage_gpu_energy_share_max=np.nan,
            stage_gpu_energy_share_min=np.nan,
            stage_gpu_energy_max_min_ratio=np.nan,
            gpu_energy_max_min_ratio=np.nan,
            stage_cpu_time_max_min_ratio=np.nan,
            stages_seen=np.nan,
        )
    )
    status = []
    for pp, seen, energy, gpu_status in zip(
        out["pp"],
        out["stages_seen"],
        out["stage_gpu_energy_max_min_ratio"],
        summary["gpu_energy_status"],
        strict=True,
    ):
        if pd.isna(seen):
            status.append("point-failed")
        elif int(pp) == 1:
            status.append("single-stage (pp 1)")
        elif int(seen) < int(pp):
            status.append("stages-not-separable (one process measures every stage's GPUs)")
        elif pd.isna(energy):
            status.append(f"no-stage-energy (GPU energy {gpu_status}; cpu_time measured)")
        else:
            status.append(Status.OK)
    out["stage_status"] = status
    return out.drop(columns=["stages_seen", *POINT_KEYS]).set_index(summary.index)

"""Independent re-check of every window's GPU energy from the power timeline.

A window's GPU energy is a counter delta (``nvmlDeviceGetTotalEnergyConsumption`` at the window
edges). The power timeline (``power.parquet``, written by energy/sampler.py at
``measurement.sampler_hz``) is a second, independent reading of the same GPUs: integrating each
GPU's sampled power over the window (trapezoid rule, power linearly interpolated at the window
edges) gives a second energy figure. Their ratio, per GPU and per window, is what this module
records; the validity verdict (energysweep.validity.verdict) flags windows where they disagree.

It needs only published data, so a reviewer can recompute it::

    python -m energysweep.validity.recheck results/energy.parquet results/shards \
        -o validation.parquet

(the merge rule writes the same table to ``results/validation.parquet``). The timeline also gives
what the counter cannot: the counter's observed update period, a counter that stopped moving,
clock event (throttle) reasons during the window, and the idle baseline's stability.

Limits, stated where a reader will look (README, "Independent re-check"): NVML's power reading is
a ~1 s moving average on Ampere (except GA100) and newer, so it lags a step in load by up to 1 s;
windows of a few seconds or more keep that edge effect small. At 10 Hz the observed counter
period cannot be shorter than the sampling interval (it is an upper bound).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from energysweep.job.spec import JobDir
from energysweep.tables.power import CLOCK_EVENT_REASONS, load_power, reason_names
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS
from energysweep.tables.status import ACCEPTED, Status
from energysweep.validity.timeline import (
    NO_COUNTER,
    NO_TIMELINE,
    OK,
    timelines,
)

VALIDATION_COLUMNS = [
    "scope",
    *WINDOW_KEYS,
    "gpu_uuid",
    "pp_rank",
    "window_start_ns",
    "window_end_ns",
    "duration_s",
    "counter_energy_j",
    "timeline_energy_j",
    "timeline_counter_ratio",
    "samples",
    "max_sample_gap_s",
    "power_std_w",
    "observed_counter_period_s",
    "counter_stuck",
    "clock_event_reasons",
    "clock_event_reason_names",
    "status",
    "detail",
]


def idle_bounds(job_records: Sequence[str | Path]) -> pd.DataFrame:
    """Per job the idle baseline's wall-clock bounds (job.json ``timing``); null where none."""
    rows = []
    for p in job_records:
        rec = json.loads(Path(p).read_text())
        timing = rec.get("timing") or {}
        rows.append(
            {
                "job_id": rec["job_id"],
                "idle_start_ns": timing.get("idle_start_ns"),
                "idle_end_ns": timing.get("idle_end_ns"),
            }
        )
    return pd.DataFrame(rows, columns=["job_id", "idle_start_ns", "idle_end_ns"])


def _gpu_windows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (window, GPU UUID): its counter energy (J); GPU-less windows keep one row."""
    r = rows[[c for c in ROW_COLUMNS if c != "idle_gpu_power_w"]].copy()
    r["_has_gpu"] = r["gpu_uuid"].notna()
    # A GPU counts once per window (two ranks may report it); GPU-less windows keep one row.
    r = r.sort_values([*WINDOW_KEYS, "gpu_uuid", "pp_rank"], na_position="last", kind="stable")
    with_gpu = r[r["_has_gpu"]].drop_duplicates([*WINDOW_KEYS, "gpu_uuid"])
    gpu_less = r[~r["_has_gpu"]].drop_duplicates(WINDOW_KEYS)
    gpu_less = gpu_less.merge(
        with_gpu[WINDOW_KEYS].drop_duplicates(), on=WINDOW_KEYS, how="left", indicator=True
    )
    gpu_less = gpu_less[gpu_less["_merge"] == "left_only"].drop(columns="_merge")
    out = pd.concat([with_gpu, gpu_less], ignore_index=True).drop(columns="_has_gpu")
    measured = out["gpu_energy_status"].isin(ACCEPTED) & out["status"].eq(Status.OK)
    out["counter_energy_j"] = (out["gpu_energy_mj"] / 1e3).where(measured)
    return out


def recheck(
    rows: pd.DataFrame, power: pd.DataFrame, idle: pd.DataFrame | None, power_average_s: float
) -> pd.DataFrame:
    """The validation table: re-check rows per (window, GPU), per window, and per idle baseline.

    Args:
        rows: the merged energy table (shard rows) as pandas, or the columns this reads.
        power: power samples (:func:`load_power`).
        idle: per job the idle bounds (:func:`idle_bounds`); None skips the idle rows.
        power_average_s: the span NVML's power reading averages over (validity.power_average_s,
            undone as Timeline.windows says); 0: not averaged (the fake's constant power).

    Returns:
        :data:`VALIDATION_COLUMNS`; ``scope`` is ``gpu`` (one GPU in one window), ``window``
        (all the window's GPUs: sums, null unless every GPU was re-checked) or ``idle`` (one GPU
        over its job's idle baseline; counter energy = idle power x idle window).
    """
    gw = _gpu_windows(rows).reset_index(drop=True)
    tls = timelines(power)
    n = len(gw)
    table = gw[WINDOW_KEYS].copy()
    table["scope"] = "gpu"
    for c in ("gpu_uuid", "pp_rank", "window_start_ns", "window_end_ns", "counter_energy_j"):
        table[c] = gw[c]
    table["duration_s"] = (gw["window_end_ns"] - gw["window_start_ns"]) / 1e9
    res = {
        "samples": np.zeros(n, dtype=np.int64),
        "timeline_energy_j": np.full(n, np.nan),
        "max_sample_gap_s": np.full(n, np.nan),
        "power_std_w": np.full(n, np.nan),
        "observed_counter_period_s": np.full(n, np.nan),
        "counter_stuck": np.full(n, None, dtype=object),
        "clock_event_reasons": np.full(n, None, dtype=object),
        "status": np.full(n, NO_TIMELINE, dtype=object),
        "detail": np.full(
            n, "no power samples of this GPU (measurement.sampler_hz 0?)", dtype=object
        ),
    }
    no_counter = (table["counter_energy_j"].isna() | table["duration_s"].isna()).to_numpy()
    res["status"][no_counter] = NO_COUNTER
    res["detail"][no_counter] = np.where(
        gw["gpu_uuid"].isna(),
        "no GPU energy measured",
        "window status "
        + gw["status"].astype(str)
        + ", GPU energy "
        + gw["gpu_energy_status"].astype(str),
    )[no_counter]
    start = gw["window_start_ns"].to_numpy(dtype=float, na_value=np.nan)
    end = gw["window_end_ns"].to_numpy(dtype=float, na_value=np.nan)
    rest = gw[~no_counter]
    for (job, gpu), idx in rest.groupby(["job_id", "gpu_uuid"], sort=False).indices.items():
        tl = tls.get((job, gpu))
        if tl is None or not len(tl.t):
            continue  # stays no-timeline
        pos = rest.index.to_numpy()[idx]
        span = int(round(power_average_s * 1e9))
        windows = tl.windows(start[pos].astype(np.int64), end[pos].astype(np.int64), span)
        for k, v in windows.items():
            res[k][pos] = v
    for k, v in res.items():
        table[k] = v
    table = table.reindex(columns=[c for c in VALIDATION_COLUMNS if c != "timeline_counter_ratio"])
    table = pd.concat([table, _window_rows(table)], ignore_index=True)
    if idle is not None and len(idle) and len(rows):
        table = pd.concat([table, _idle_rows(rows, idle, tls)], ignore_index=True)
    table["timeline_counter_ratio"] = table["timeline_energy_j"] / table["counter_energy_j"].where(
        table["counter_energy_j"] > 0
    )
    table["clock_event_reason_names"] = [reason_names(m) for m in table["clock_event_reasons"]]
    return _typed(table[VALIDATION_COLUMNS])


def _window_rows(gpu_rows: pd.DataFrame) -> pd.DataFrame:
    """Per window the sums over its GPUs; the window's status is its worst GPU's."""
    if gpu_rows.empty:
        return gpu_rows.iloc[:0]
    g = gpu_rows.assign(
        _bad=gpu_rows["status"].ne(OK),
        _stuck=gpu_rows["counter_stuck"].astype(float),
        _reasons=gpu_rows["clock_event_reasons"].astype(float),
    ).groupby(WINDOW_KEYS, sort=True, dropna=False)
    size = g.size()

    def complete_sum(column: str) -> pd.Series:
        """The sum over the window's GPUs, null unless every GPU has a value."""
        return g[column].sum(min_count=1).where(g[column].count() == size)

    out = pd.DataFrame(
        {
            "window_start_ns": g["window_start_ns"].first(),
            "window_end_ns": g["window_end_ns"].first(),
            "duration_s": g["duration_s"].first(),
            "counter_energy_j": complete_sum("counter_energy_j"),
            "timeline_energy_j": complete_sum("timeline_energy_j").where(~g["_bad"].any()),
            "samples": g["samples"].min(),
            "max_sample_gap_s": g["max_sample_gap_s"].max(),
            "observed_counter_period_s": g["observed_counter_period_s"].max(),
            "counter_stuck": g["_stuck"].max().map(lambda v: None if pd.isna(v) else bool(v)),
        }
    )
    # OR over the window's GPUs, bit by bit (groupby max of each bit: no per-window Python).
    bits = gpu_rows["clock_event_reasons"].astype(float).fillna(0).astype(np.int64)
    known = g["_reasons"].count() > 0
    by_window = [gpu_rows[k] for k in WINDOW_KEYS]
    ored = sum(
        ((bits // 2**b) % 2).groupby(by_window, sort=True, dropna=False).max() * 2**b
        for b in range(max(CLOCK_EVENT_REASONS.values()).bit_length())
    )
    out["clock_event_reasons"] = [
        int(v) if k else None for v, k in zip(ored.reindex(out.index), known, strict=True)
    ]
    bad = gpu_rows[gpu_rows["status"] != OK]
    statuses = (
        bad.groupby(WINDOW_KEYS, sort=True, dropna=False)["status"].agg(
            lambda s: ",".join(sorted(set(s)))
        )
        if len(bad)
        else pd.Series(dtype=object)
    )
    out["status"] = statuses.reindex(out.index).fillna(OK) if len(bad) else OK
    out["detail"] = None
    out["scope"] = "window"
    out["gpu_uuid"] = None
    out["pp_rank"] = np.nan
    return out.reset_index()


def _idle_rows(rows: pd.DataFrame, idle: pd.DataFrame, timelines: dict) -> pd.DataFrame:
    """Per (job, GPU) the idle baseline re-checked: idle power x time against the timeline."""
    r = rows[rows["gpu_uuid"].notna()].drop_duplicates(["job_id", "gpu_uuid"])
    r = r.merge(idle, on="job_id", how="inner")
    records = []
    for rec in r.to_dict("records"):
        start, end = rec["idle_start_ns"], rec["idle_end_ns"]
        base = {k: rec[k] for k in ("job_id", *POINT_KEYS)}
        base.update(
            scope="idle",
            phase="idle",
            repetition=None,
            gpu_uuid=rec["gpu_uuid"],
            pp_rank=rec.get("pp_rank"),
            window_start_ns=start,
            window_end_ns=end,
            batch_size=None,
        )
        if pd.isna(start) or pd.isna(end):
            base.update(
                status=NO_COUNTER,
                detail="no idle baseline (idle_baseline_s 0, or no source could read it)",
                samples=0,
            )
            records.append(base)
            continue
        dur = (end - start) / 1e9
        idle_w = rec.get("idle_gpu_power_w")
        base.update(duration_s=dur, counter_energy_j=idle_w * dur if pd.notna(idle_w) else np.nan)
        tl = timelines.get((rec["job_id"], rec["gpu_uuid"]))
        if tl is None or not len(tl.t):
            base.update(status=NO_TIMELINE, samples=0, detail="no power samples of this GPU")
        else:
            base.update(tl.window(int(start), int(end)))
        records.append(base)
    return pd.DataFrame.from_records(records)


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    for c in (
        "window_start_ns",
        "window_end_ns",
        "clock_event_reasons",
        "tp",
        "pp",
        "dp",
        "batch_size",
        "repetition",
        "pp_rank",
        "samples",
    ):
        table[c] = pd.to_numeric(table[c], errors="coerce").astype("Int64")
    for c in (
        "duration_s",
        "counter_energy_j",
        "timeline_energy_j",
        "timeline_counter_ratio",
        "max_sample_gap_s",
        "power_std_w",
        "observed_counter_period_s",
    ):
        table[c] = pd.to_numeric(table[c], errors="coerce").astype(float)
    table["counter_stuck"] = table["counter_stuck"].astype("boolean")
    for c in (
        "scope",
        "job_id",
        "model",
        "backend",
        "scenario",
        "phase",
        "gpu_uuid",
        "status",
        "detail",
        "clock_event_reason_names",
    ):
        table[c] = table[c].astype(object).where(table[c].notna(), None)
    return table.reset_index(drop=True)


ROW_COLUMNS = [
    *WINDOW_KEYS,
    "status",
    "window_start_ns",
    "window_end_ns",
    "gpu_uuid",
    "gpu_energy_mj",
    "gpu_energy_status",
    "pp_rank",
    "idle_gpu_power_w",
]


def write(table: pd.DataFrame, path: str | Path) -> None:
    """Write the validation table atomically (Parquet)."""
    from energysweep.tables.io import write_atomic

    write_atomic(pa.Table.from_pandas(table, preserve_index=False), path)


def published_average_s(energy: str | Path) -> float:
    """validity.power_average_s of the sweep that published ``energy`` (its config.yaml)."""
    import yaml

    record = Path(energy).with_name("config.yaml")
    if not record.is_file():
        raise SystemExit(f"{record} is missing: give --power-average-s")
    return float(yaml.safe_load(record.read_text())["config"]["validity"]["power_average_s"])


def from_published(
    energy: str | Path, shards_dir: str | Path, power_average_s: float | None = None
) -> pd.DataFrame:
    """The validation table from the published dataset (results/energy.parquet) and the jobs'
    power.parquet and job.json files under ``shards_dir``; the power averaging span is the
    sweep's (results/config.yaml next to the dataset) unless given."""
    import pyarrow.dataset as ds

    rows = (
        ds.dataset(str(energy), format="parquet", partitioning="hive")
        .to_table(columns=ROW_COLUMNS)
        .to_pandas()
    )
    for k in ("model", "backend"):  # hive partition columns come back as dictionaries
        rows[k] = rows[k].astype(str)
    idle = idle_bounds(JobDir.find(shards_dir, "job_json"))
    span = published_average_s(energy) if power_average_s is None else power_average_s
    return recheck(rows, load_power(JobDir.find(shards_dir, "power")), idle, span)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Recompute the validation table (timeline vs counter energy per window) "
        "from the published energy dataset and the jobs' power timelines."
    )
    parser.add_argument("energy", help="the energy dataset (results/energy.parquet)")
    parser.add_argument("shards", help="the jobs' directory (results/shards) with power.parquet")
    parser.add_argument("-o", "--output", required=True, help="validation Parquet to write")
    span = "validity.power_average_s (default: the sweep's, in config.yaml next to ENERGY)"
    parser.add_argument("--power-average-s", type=float, default=None, help=span)
    args = parser.parse_args(argv)
    table = from_published(args.energy, args.shards, args.power_average_s)
    write(table, args.output)
    windows = table[table["scope"] == "window"]
    ratio = windows["timeline_counter_ratio"].dropna()
    print(f"{len(windows)} windows; {len(ratio)} re-checked", file=sys.stderr)
    if len(ratio):
        print(
            f"timeline/counter ratio: median {ratio.median():.4f}, "
            f"min {ratio.min():.4f}, max {ratio.max():.4f}",
            file=sys.stderr,
        )
    for status, n in windows["status"].value_counts().items():
        print(f"  {status}: {n} windows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Independent re-check of every window's GPU energy from the power timeline.

A window's GPU energy is a counter delta (``nvmlDeviceGetTotalEnergyConsumption`` at the window
edges). The power timeline (``power.parquet``, written by energy/sampler.py at
``measurement.sampler_hz``) is a second, independent reading of the same GPUs: integrating each
GPU's sampled power over the window (trapezoid rule, power linearly interpolated at the window
edges) gives a second energy figure. Their ratio, per GPU and per window, is what this module
records; the validity verdict (energysweep.validity) flags windows where they disagree.

It needs only published data, so a reviewer can recompute it::

    python -m energysweep.recheck results/energy.parquet results/shards -o validation.parquet

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
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from energysweep.tables.power import CLOCK_EVENT_REASONS, load_power, power_files, reason_names
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS

# Status of a re-check row.
OK = "ok"
NO_COUNTER = "no-counter-energy"  # the window has no counter figure to compare (CPU, failed)
NO_TIMELINE = "no-timeline"  # no power samples of this GPU in the job
NOT_COVERED = "timeline-not-covering"  # samples do not span the window
FEW_SAMPLES = "too-few-samples"  # fewer than 2 samples inside the window

VALIDATION_COLUMNS = [
    "scope", *WINDOW_KEYS, "gpu_uuid", "pp_rank", "window_start_ns", "window_end_ns",
    "duration_s", "counter_energy_j", "timeline_energy_j", "timeline_counter_ratio",
    "samples", "max_sample_gap_s", "power_std_w", "observed_counter_period_s",
    "counter_stuck", "clock_event_reasons", "clock_event_reason_names", "status", "detail",
]


def idle_bounds(job_records: list[str | Path]) -> pd.DataFrame:
    """Per job the idle baseline's wall-clock bounds (job.json ``timing``); null where none."""
    rows = []
    for p in job_records:
        rec = json.loads(Path(p).read_text())
        timing = rec.get("timing") or {}
        rows.append({"job_id": rec["job_id"], "idle_start_ns": timing.get("idle_start_ns"),
                     "idle_end_ns": timing.get("idle_end_ns")})
    return pd.DataFrame(rows, columns=["job_id", "idle_start_ns", "idle_end_ns"])


def _slice_reduce(ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``ufunc.reduce(values[lo[i]:hi[i]])`` for every i (empty slices give values' 0th or a
    filler: callers mask them)."""
    if not len(lo):
        return np.zeros(0, dtype=values.dtype)
    padded = np.append(values, values[:1] if len(values) else [0])  # hi may equal len(values)
    idx = np.empty(2 * len(lo), dtype=np.int64)
    idx[0::2], idx[1::2] = lo, np.maximum(hi, lo)
    # reduceat reduces [idx[k], idx[k+1]); for pairs (lo, hi) with lo < hi that is the slice.
    return ufunc.reduceat(padded, idx)[0::2]


def _slice_sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    cum = np.concatenate([[0], np.cumsum(values)])
    return cum[hi] - cum[lo]


class _Timeline:
    """One GPU's samples in one job: integral and statistics over any set of intervals."""

    def __init__(self, time_ns: np.ndarray, power_mw: np.ndarray, counter_mj: np.ndarray,
                 reasons: np.ndarray):
        """Arrays of one GPU's samples, sorted by time (nulls as NaN)."""
        p = power_mw / 1e3
        keep = ~np.isnan(p)
        self.t_ns = time_ns[keep]
        self.t0 = self.t_ns[0] if len(self.t_ns) else 0
        self.t = (self.t_ns - self.t0) / 1e9  # seconds from the first sample: float precision
        self.p = p[keep]
        self.counter = counter_mj[keep]
        reasons = reasons[keep]
        self.has_reasons = ~np.isnan(reasons)
        self.reasons = np.nan_to_num(reasons).astype(np.int64)
        steps = np.diff(self.t) * (self.p[1:] + self.p[:-1]) / 2
        self.cum = np.concatenate([[0.0], np.cumsum(steps)])
        # Prefix sums for each interval's mean and variance of power in O(1).
        self.cum_p = np.concatenate([[0.0], np.cumsum(self.p)])
        self.cum_p2 = np.concatenate([[0.0], np.cumsum(self.p**2)])
        # The counter's update period, observed over the whole job: the median time between
        # changes (an upper bound at the sampling rate; the driver's period is a GPU property).
        counted = ~np.isnan(self.counter)
        c, tc = self.counter[counted], self.t[counted]
        changed = tc[1:][np.diff(c) != 0]
        self.period = float(np.median(np.diff(changed))) if len(changed) >= 2 else np.nan

    def _integral_to(self, x: np.ndarray) -> np.ndarray:
        """Energy (J) from the first sample to each ``x`` (within the samples' span)."""
        t, p = self.t, self.p
        k = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 2)
        px = p[k] + (p[k + 1] - p[k]) * (x - t[k]) / (t[k + 1] - t[k])
        return self.cum[k] + (x - t[k]) * (p[k] + px) / 2

    def windows(self, start_ns: np.ndarray, end_ns: np.ndarray) -> dict:
        """Re-check figures of every [start, end] at once; ``status`` says where they cannot
        be had."""
        start_ns = np.asarray(start_ns, dtype=np.int64)
        end_ns = np.asarray(end_ns, dtype=np.int64)
        m = len(start_ns)
        lo = np.searchsorted(self.t_ns, start_ns, "left")  # samples are sorted: a slice each
        hi = np.searchsorted(self.t_ns, end_ns, "right")
        n_in = hi - lo
        out = {"samples": n_in, "observed_counter_period_s": np.full(m, self.period)}
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (self.cum_p[hi] - self.cum_p[lo]) / n_in
            var = np.maximum((self.cum_p2[hi] - self.cum_p2[lo]) / n_in - mean**2, 0)
        out["power_std_w"] = np.where(n_in >= 2, np.sqrt(var), np.nan)
        # Per window: the OR of the clock event reasons, and whether the counter moved between
        # the first and last sample (reduceat over (lo, hi) pairs: one pass, no Python loop).
        has = n_in > 0
        reasons = np.full(m, None, dtype=object)
        n_reasons = _slice_sum(self.has_reasons.astype(np.int64), lo, hi)
        ored = _slice_reduce(np.bitwise_or, self.reasons, lo, hi)
        with_reasons = has & (n_reasons > 0)
        reasons[with_reasons] = ored[with_reasons].tolist()
        stuck = np.full(m, None, dtype=object)
        counted = ~np.isnan(self.counter)
        all_counted = _slice_sum(counted.astype(np.int64), lo, hi) == n_in
        simple = (n_in >= 2) & all_counted
        if simple.any():
            stuck[simple] = (self.counter[lo[simple]] == self.counter[hi[simple] - 1]).tolist()
        for i in np.flatnonzero((n_in >= 2) & ~all_counted):  # some samples lack the counter
            c = self.counter[lo[i]:hi[i]][counted[lo[i]:hi[i]]]
            if len(c) >= 2:
                stuck[i] = bool(c[-1] == c[0])
        out["clock_event_reasons"], out["counter_stuck"] = reasons, stuck
        covered = (len(self.t) >= 2) & (start_ns >= (self.t_ns[0] if len(self.t) else 0)) & (
            end_ns <= (self.t_ns[-1] if len(self.t) else -1))
        ok = covered & (n_in >= 2)
        energy = np.full(m, np.nan)
        gap = np.full(m, np.nan)
        if ok.any():
            a = (start_ns[ok] - self.t0) / 1e9
            b = (end_ns[ok] - self.t0) / 1e9
            energy[ok] = self._integral_to(b) - self._integral_to(a)
            diffs = np.diff(self.t)
            lo_ok, hi_ok = lo[ok], hi[ok]
            inner = np.zeros(len(a))
            multi = hi_ok - lo_ok >= 2
            if multi.any():  # the largest gap between consecutive samples inside each window
                inner[multi] = _slice_reduce(np.maximum, diffs, lo_ok[multi], hi_ok[multi] - 1)
            gap[ok] = np.maximum.reduce([self.t[lo_ok] - a, b - self.t[hi_ok - 1], inner])
        out["timeline_energy_j"], out["max_sample_gap_s"] = energy, gap
        status = np.where(ok, OK, np.where(covered, FEW_SAMPLES, NOT_COVERED)).astype(object)
        out["status"] = status
        out["detail"] = np.where(
            ok, None, np.where(covered, [f"{k} power sample(s) inside the window" for k in n_in],
                               "the power samples do not span the window")).astype(object)
        return out

    def window(self, start_ns: int, end_ns: int) -> dict:
        """:meth:`windows` of one interval."""
        return {k: v[0] for k, v in self.windows(np.array([start_ns]),
                                                 np.array([end_ns])).items()}


def timelines(power: pd.DataFrame) -> dict:
    """(job_id, gpu_uuid) -> :class:`_Timeline`, built from one sort of all samples."""
    power = power[power["gpu_uuid"].notna() & power["time_ns"].notna()] if len(power) else power
    if not len(power):
        return {}
    job = pd.factorize(power["job_id"])
    gpu = pd.factorize(power["gpu_uuid"])
    t_ns = power["time_ns"].to_numpy(dtype=np.int64)
    order = np.lexsort((t_ns, gpu[0], job[0]))
    key = (job[0] * len(gpu[1]) + gpu[0])[order]
    cols = [t_ns[order]] + [power[c].to_numpy(dtype=float, na_value=np.nan)[order] for c in (
        "power_mw", "energy_counter_mj", "clock_event_reasons")]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(key)]
    out = {}
    for a, b in zip(starts, ends, strict=True):
        k = key[a]
        out[(job[1][k // len(gpu[1])], gpu[1][k % len(gpu[1])])] = _Timeline(
            *(c[a:b] for c in cols))
    return out


def _gpu_windows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (window, GPU UUID): its counter energy (J); GPU-less windows keep one row."""
    cols = [*WINDOW_KEYS, "status", "window_start_ns", "window_end_ns", "gpu_uuid",
            "gpu_energy_mj", "gpu_energy_status", "pp_rank"]
    r = rows[cols].copy()
    r["_has_gpu"] = r["gpu_uuid"].notna()
    # A GPU counts once per window (two ranks may report it); GPU-less windows keep one row.
    r = r.sort_values([*WINDOW_KEYS, "gpu_uuid", "pp_rank"], na_position="last", kind="stable")
    with_gpu = r[r["_has_gpu"]].drop_duplicates([*WINDOW_KEYS, "gpu_uuid"])
    gpu_less = r[~r["_has_gpu"]].drop_duplicates(WINDOW_KEYS)
    gpu_less = gpu_less.merge(with_gpu[WINDOW_KEYS].drop_duplicates(), on=WINDOW_KEYS,
                              how="left", indicator=True)
    gpu_less = gpu_less[gpu_less["_merge"] == "left_only"].drop(columns="_merge")
    out = pd.concat([with_gpu, gpu_less], ignore_index=True).drop(columns="_has_gpu")
    measured = out["gpu_energy_status"].isin(["measured", "short-window"]) & out["status"].eq("ok")
    out["counter_energy_j"] = (out["gpu_energy_mj"] / 1e3).where(measured)
    return out


def recheck(rows: pd.DataFrame, power: pd.DataFrame,
            idle: pd.DataFrame | None = None) -> pd.DataFrame:
    """The validation table: re-check rows per (window, GPU), per window, and per idle baseline.

    Args:
        rows: the merged energy table (shard rows) as pandas, or the columns this reads.
        power: power samples (:func:`load_power`).
        idle: per job the idle bounds (:func:`idle_bounds`); None skips the idle rows.

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
    res = {"samples": np.zeros(n, dtype=np.int64), "timeline_energy_j": np.full(n, np.nan),
           "max_sample_gap_s": np.full(n, np.nan), "power_std_w": np.full(n, np.nan),
           "observed_counter_period_s": np.full(n, np.nan),
           "counter_stuck": np.full(n, None, dtype=object),
           "clock_event_reasons": np.full(n, None, dtype=object),
           "status": np.full(n, NO_TIMELINE, dtype=object),
           "detail": np.full(n, "no power samples of this GPU (measurement.sampler_hz 0?)",
                             dtype=object)}
    no_counter = (table["counter_energy_j"].isna() | table["duration_s"].isna()).to_numpy()
    res["status"][no_counter] = NO_COUNTER
    res["detail"][no_counter] = np.where(
        gw["gpu_uuid"].isna(), "no GPU energy measured",
        "window status " + gw["status"].astype(str) + ", GPU energy "
        + gw["gpu_energy_status"].astype(str))[no_counter]
    start = gw["window_start_ns"].to_numpy(dtype=float, na_value=np.nan)
    end = gw["window_end_ns"].to_numpy(dtype=float, na_value=np.nan)
    rest = gw[~no_counter]
    for (job, gpu), idx in rest.groupby(["job_id", "gpu_uuid"], sort=False).indices.items():
        tl = tls.get((job, gpu))
        if tl is None or not len(tl.t):
            continue  # stays no-timeline
        pos = rest.index.to_numpy()[idx]
        for k, v in tl.windows(start[pos].astype(np.int64), end[pos].astype(np.int64)).items():
            res[k][pos] = v
    for k, v in res.items():
        table[k] = v
    table = table.reindex(columns=[c for c in VALIDATION_COLUMNS
                                   if c != "timeline_counter_ratio"])
    table = pd.concat([table, _window_rows(table)], ignore_index=True)
    if idle is not None and len(idle) and len(rows):
        table = pd.concat([table, _idle_rows(rows, idle, tls)], ignore_index=True)
    table["timeline_counter_ratio"] = table["timeline_energy_j"] / table["counter_energy_j"].where(
        table["counter_energy_j"] > 0)
    table["clock_event_reason_names"] = [reason_names(m) for m in table["clock_event_reasons"]]
    return _typed(table[VALIDATION_COLUMNS])


def _window_rows(gpu_rows: pd.DataFrame) -> pd.DataFrame:
    """Per window the sums over its GPUs; the window's status is its worst GPU's."""
    if gpu_rows.empty:
        return gpu_rows.iloc[:0]
    g = gpu_rows.assign(_bad=gpu_rows["status"].ne(OK),
                        _stuck=gpu_rows["counter_stuck"].astype(float),
                        _reasons=gpu_rows["clock_event_reasons"].astype(float),
                        ).groupby(WINDOW_KEYS, sort=True, dropna=False)
    size = g.size()

    def complete_sum(column: str) -> pd.Series:
        """The sum over the window's GPUs, null unless every GPU has a value."""
        return g[column].sum(min_count=1).where(g[column].count() == size)

    out = pd.DataFrame({
        "window_start_ns": g["window_start_ns"].first(),
        "window_end_ns": g["window_end_ns"].first(), "duration_s": g["duration_s"].first(),
        "counter_energy_j": complete_sum("counter_energy_j"),
        "timeline_energy_j": complete_sum("timeline_energy_j").where(~g["_bad"].any()),
        "samples": g["samples"].min(), "max_sample_gap_s": g["max_sample_gap_s"].max(),
        "observed_counter_period_s": g["observed_counter_period_s"].max(),
        "counter_stuck": g["_stuck"].max().map(lambda v: None if pd.isna(v) else bool(v)),
    })
    # OR over the window's GPUs, bit by bit (groupby max of each bit: no per-window Python).
    bits = gpu_rows["clock_event_reasons"].astype(float).fillna(0).astype(np.int64)
    known = g["_reasons"].count() > 0
    by_window = [gpu_rows[k] for k in WINDOW_KEYS]
    ored = sum(
        ((bits // 2**b) % 2).groupby(by_window, sort=True, dropna=False).max() * 2**b
        for b in range(max(CLOCK_EVENT_REASONS.values()).bit_length())
    )
    out["clock_event_reasons"] = [int(v) if k else None for v, k in zip(
        ored.reindex(out.index), known, strict=True)]
    bad = gpu_rows[gpu_rows["status"] != OK]
    statuses = bad.groupby(WINDOW_KEYS, sort=True, dropna=False)["status"].agg(
        lambda s: ",".join(sorted(set(s)))) if len(bad) else pd.Series(dtype=object)
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
        base.update(scope="idle", phase="idle", repetition=None, gpu_uuid=rec["gpu_uuid"],
                    pp_rank=rec.get("pp_rank"), window_start_ns=start, window_end_ns=end,
                    batch_size=None)
        if pd.isna(start) or pd.isna(end):
            base.update(status=NO_COUNTER, detail="no idle baseline (idle_baseline_s 0, or no "
                        "source could read it)", samples=0)
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
    for c in ("window_start_ns", "window_end_ns", "clock_event_reasons", "tp", "pp", "dp",
              "batch_size", "repetition", "pp_rank", "samples"):
        table[c] = pd.to_numeric(table[c], errors="coerce").astype("Int64")
    for c in ("duration_s", "counter_energy_j", "timeline_energy_j", "timeline_counter_ratio",
              "max_sample_gap_s", "power_std_w", "observed_counter_period_s"):
        table[c] = pd.to_numeric(table[c], errors="coerce").astype(float)
    table["counter_stuck"] = table["counter_stuck"].astype("boolean")
    for c in ("scope", "job_id", "model", "backend", "scenario", "phase", "gpu_uuid", "status",
              "detail", "clock_event_reason_names"):
        table[c] = table[c].astype(object).where(table[c].notna(), None)
    return table.reset_index(drop=True)


ROW_COLUMNS = [*WINDOW_KEYS, "status", "window_start_ns", "window_end_ns", "gpu_uuid",
               "gpu_energy_mj", "gpu_energy_status", "pp_rank", "idle_gpu_power_w"]


def write(table: pd.DataFrame, path: str | Path) -> None:
    """Write the validation table atomically (Parquet)."""
    from energysweep.tables.io import write_atomic

    write_atomic(pa.Table.from_pandas(table, preserve_index=False), path)


def from_published(energy: str | Path, shards_dir: str | Path) -> pd.DataFrame:
    """The validation table from the published dataset (results/energy.parquet) and the jobs'
    power.parquet and job.json files under ``shards_dir``."""
    import pyarrow.dataset as ds

    rows = ds.dataset(str(energy), format="parquet", partitioning="hive").to_table(
        columns=ROW_COLUMNS).to_pandas()
    for k in ("model", "backend"):  # hive partition columns come back as dictionaries
        rows[k] = rows[k].astype(str)
    idle = idle_bounds(sorted(Path(shards_dir).rglob("job.json")))
    return recheck(rows, load_power(power_files(shards_dir)), idle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Recompute the validation table (timeline vs counter energy per window) "
                    "from the published energy dataset and the jobs' power timelines.")
    parser.add_argument("energy", help="the energy dataset (results/energy.parquet)")
    parser.add_argument("shards", help="the jobs' directory (results/shards) with power.parquet")
    parser.add_argument("-o", "--output", required=True, help="validation Parquet to write")
    args = parser.parse_args(argv)
    table = from_published(args.energy, args.shards)
    write(table, args.output)
    windows = table[table["scope"] == "window"]
    ratio = windows["timeline_counter_ratio"].dropna()
    print(f"{len(windows)} windows; {len(ratio)} re-checked", file=sys.stderr)
    if len(ratio):
        print(f"timeline/counter ratio: median {ratio.median():.4f}, "
              f"min {ratio.min():.4f}, max {ratio.max():.4f}", file=sys.stderr)
    for status, n in windows["status"].value_counts().items():
        print(f"  {status}: {n} windows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The verdict's checks on what else touched a point's GPUs and edges: ``gpu_shared`` and
``edge_read_slow``.

``gpu_shared``: another process computed on a measured GPU during one of the point's ok windows:
seen by the rank in NVML's process list at a window edge (row column ``gpu_processes_status``
``shared``, energysweep.measure.gpu_processes), or found by the merge as another job's window
overlapping in time on the same GPU UUID (energysweep.aggregate.overlap). The window's energy
then holds the other's too: the point is invalid, and ``gpu_shared_detail`` names the pids and
jobs. Nothing is dropped: every row stays in the shards and in energy.parquet.

``edge_read_slow``: a read of the energy counter that fixed a refresh at a window edge took
longer than :data:`energysweep.energy.ticks.SLOW_READ_FRACTION` of the counter period (its
bracketing timestamps, a late wake-up of the poll before it included; the H200 took 2.8 ms
median, 185 ms once under load), even after the source's retries: the refresh's time, and so
the edge correction, is uncertain by that much. So does a start value extrapolated that long
past a refresh the source did not use (energysweep.energy.nvml), and a rank that took its edges
that much later than the window's (late out of a barrier, descheduled on a busy host: its GPUs'
energy starts late or runs past the end; energysweep.measure.combine.combine_ranks).

Summary columns: ``gpu_shared_windows`` (ok windows of the point on a shared GPU),
``gpu_shared_detail``, ``gpu_process_check`` (ok, or why the process list could not be read),
``edge_read_max_ms`` (the slowest such read of the point's ok windows) and ``edge_read_status``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.energy.ticks import SLOW_READ_FRACTION
from energysweep.tables.shards import WINDOW_KEYS
from energysweep.tables.status import Status
from energysweep.validity.perpoint import per_point, point_index

REASONS = {
    "gpu_shared": "another process computed on a measured GPU during a window (NVML's process "
    "list at a window edge, or another job's window on the same GPU UUID at the same time)",
    "edge_read_slow": "an energy-counter read at a window edge took longer than "
    f"{SLOW_READ_FRACTION:g} x the counter period, even after retries; or the start value "
    "(in serving also the end value) extrapolated that long past a missed refresh, or a rank "
    "took its edges that much later than the window's (late out of a barrier)",
}
ROW_COLUMNS = ["gpu_processes_status", "gpu_processes_foreign", "gpu_edge_read_max_ms"]
# Summary columns -> the status columns that explain a null in them.
NULL_STATUS = {
    "gpu_shared_windows": ("gpu_process_check",),
    "edge_read_max_ms": ("edge_read_status", "gpu_energy_status", "status"),
}
INFO_COLUMNS = {"gpu_shared_detail"}


def columns(
    s: pd.DataFrame, ok_rows: pd.DataFrame, overlaps: pd.DataFrame, counter_period_s
) -> tuple[dict, dict]:
    """Adds the summary columns to ``s`` (in place); returns (fails, unknown) per reason.

    Args:
        ok_rows: the ok headline rows (every GPU of every window).
        overlaps: energysweep.aggregate.overlap.shared_windows of every row.
        counter_period_s: per point, the counter period the verdict uses.
    """
    rows = ok_rows.copy()
    status = rows["gpu_processes_status"].astype(str)
    rows["_seen"] = (status == "shared").astype(float)
    rows["_checked"] = status.isin(["ok", "shared"]).astype(float)
    if len(overlaps):
        keyed = overlaps.assign(_overlap=1.0)
        rows = rows.merge(keyed, on=[*WINDOW_KEYS, "gpu_uuid"], how="left")
    else:
        rows["_overlap"], rows["other_jobs"] = np.nan, None
    rows["_shared"] = ((rows["_seen"] > 0) | (rows["_overlap"].fillna(0) > 0)).astype(float)
    win = rows.groupby(WINDOW_KEYS, sort=False).agg(
        _shared=("_shared", "max"), _checked=("_checked", "min")
    )
    win = win.reset_index()
    shared_n = per_point(win, s, "_shared", "sum")
    checked = per_point(win, s, "_checked", "min") > 0
    overlap_any = per_point(rows.assign(_o=rows["_overlap"].fillna(0)), s, "_o", "any") > 0
    s["gpu_shared_windows"] = np.where(checked | overlap_any, shared_n, np.nan)
    s["gpu_process_check"] = np.where(checked, Status.OK, _why_unchecked(rows, s))
    s["gpu_shared_detail"] = _details(rows, s)
    slow_ms = per_point(rows, s, "gpu_edge_read_max_ms", "max")
    s["edge_read_max_ms"] = slow_ms
    s["edge_read_status"] = np.where(
        np.isnan(slow_ms), "not-read (no counter read at aligned edges: Zeus or no energy)", "ok"
    )
    bound_ms = np.asarray(counter_period_s, dtype=float) * SLOW_READ_FRACTION * 1e3
    fails = {
        "gpu_shared": np.nan_to_num(s["gpu_shared_windows"].to_numpy(float)) > 0,
        "edge_read_slow": np.nan_to_num(slow_ms) > bound_ms,
    }
    # A null edge read is no counter read at aligned edges (edge_read_status says so).
    unknown = {"gpu_shared": ~(checked | overlap_any)}
    return fails, unknown


def _why_unchecked(rows: pd.DataFrame, s: pd.DataFrame) -> list[str]:
    """Per point the first status that is not ok/shared (why the process list was not read)."""
    out = ["not-applicable (no ok window)"] * len(s)
    bad = rows[~rows["gpu_processes_status"].astype(str).isin(["ok", "shared"])]
    if len(bad):
        pos = point_index(bad, s)
        for p, text in zip(pos, bad["gpu_processes_status"].astype(str), strict=True):
            if p >= 0 and out[p].startswith("not-applicable (no ok"):
                out[p] = text
    return out


def _details(rows: pd.DataFrame, s: pd.DataFrame) -> list[str]:
    """Per point what shared its GPUs: pids at edges, and other jobs' overlapping windows."""
    parts: list[set[str]] = [set() for _ in range(len(s))]
    flagged = rows[rows["_shared"] > 0]
    if len(flagged):
        pos = point_index(flagged, s)
        for p, (_, r) in zip(pos, flagged.iterrows(), strict=True):
            if p < 0:
                continue
            if isinstance(r["gpu_processes_foreign"], str) and r["gpu_processes_foreign"]:
                parts[p].add(f"{r['gpu_uuid']}: {r['gpu_processes_foreign']}")
            if isinstance(r.get("other_jobs"), str) and r["other_jobs"]:
                parts[p].add(f"{r['gpu_uuid']}: job(s) {r['other_jobs']} in the same window")
    return ["; ".join(sorted(p))[:2000] for p in parts]

"""Windows of different jobs that overlap in time on one GPU (the merge's shared-GPU check).

A GPU's energy counter counts whatever runs on it: two jobs measuring one GPU at the same time
both count the other's energy. Each rank checks NVML's process list at its window's edges
(energysweep.measure.gpu_processes); the merge checks the other way round too, from what every
job wrote: a window whose GPU (by UUID: unique across nodes) was in another job's window at an
overlapping time is flagged, whichever job ran first. Nothing is dropped: the verdict turns a
flagged window into its point's ``gpu_shared`` (energysweep.validity.shared).
"""

from __future__ import annotations

import pandas as pd

from energysweep.tables.shards import WINDOW_KEYS

ROW_COLUMNS = [*WINDOW_KEYS, "gpu_uuid", "window_start_ns", "window_end_ns"]
COLUMNS = [*WINDOW_KEYS, "gpu_uuid", "other_jobs"]


def shared_windows(rows: pd.DataFrame) -> pd.DataFrame:
    """Each (window, GPU) that overlaps another job's window on the same GPU UUID.

    Args:
        rows: shard rows with at least :data:`ROW_COLUMNS` (any status; windows without edges or
            GPU are ignored).

    Returns:
        :data:`COLUMNS`: the window's keys, its GPU and the other jobs (ids, sorted, joined by
        ``,``); one row per flagged (window, GPU).
    """
    w = rows.dropna(subset=["gpu_uuid", "window_start_ns", "window_end_ns"])
    w = w.drop_duplicates([*WINDOW_KEYS, "gpu_uuid"])
    found: dict[int, set[str]] = {}
    for _, g in w.groupby("gpu_uuid", sort=False):
        g = g.sort_values("window_start_ns")
        idx = g.index.to_numpy()
        start = g["window_start_ns"].to_numpy("int64")
        end = g["window_end_ns"].to_numpy("int64")
        job = g["job_id"].to_numpy()
        for i in range(len(g)):
            j = i + 1
            while j < len(g) and start[j] < end[i]:  # sorted by start: the rest begin later
                if job[j] != job[i]:
                    found.setdefault(idx[i], set()).add(str(job[j]))
                    found.setdefault(idx[j], set()).add(str(job[i]))
                j += 1
    if not found:
        return pd.DataFrame(columns=COLUMNS)
    out = w.loc[sorted(found), [*WINDOW_KEYS, "gpu_uuid"]].copy()
    out["other_jobs"] = [",".join(sorted(found[i])) for i in out.index]
    return out.reset_index(drop=True)

"""Where each job's time went: job.json ``timing.phases_s`` as summary columns.

Every point of a job carries its job's rank-0 wall time (``job_wall_s``), the fraction of it
inside measured windows (``job_window_fraction``) and the seconds of each phase
(``job_<phase>_s``, :class:`energysweep.tables.phases.JobPhase`), which add up to the wall time.
A job.json without phases (written by an older energysweep) leaves them null with
``job_time_status`` ``not_recorded``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from energysweep.tables.phases import JOB_PHASES

PHASE_COLUMNS = [f"job_{p.value}_s" for p in JOB_PHASES]
COLUMNS = ["job_wall_s", "job_window_fraction", *PHASE_COLUMNS]
STATUS_COLUMN = "job_time_status"
COUNTED, NOT_RECORDED = "counted", "not_recorded"
NULL_STATUS = {c: (STATUS_COLUMN,) for c in COLUMNS}


def job_time(records: dict[Path, dict]) -> pd.DataFrame:
    """One row per job (``job_id``): its wall time, window fraction and seconds per phase."""
    rows = []
    for record in records.values():
        timing = record.get("timing") or {}
        phases = timing.get("phases_s")
        row = {"job_id": record.get("job_id")}
        if phases:
            row.update(
                job_wall_s=timing.get("rank0_wall_s"),
                job_window_fraction=timing.get("window_fraction"),
                **{f"job_{p.value}_s": phases.get(p.value) for p in JOB_PHASES},
            )
        row[STATUS_COLUMN] = COUNTED if phases else NOT_RECORDED
        rows.append(row)
    return pd.DataFrame(rows, columns=["job_id", *COLUMNS, STATUS_COLUMN])


def job_time_columns(summary: pd.DataFrame, records: dict[Path, dict] | None) -> pd.DataFrame:
    """:data:`COLUMNS` and the status for every row of ``summary`` (by ``job_id``), same index;
    no columns without ``records`` (shards merged without their job.json)."""
    if records is None:
        return pd.DataFrame(index=summary.index)
    table = job_time(records).drop_duplicates("job_id")
    out = summary[["job_id"]].merge(table, on="job_id", how="left")
    out[STATUS_COLUMN] = out[STATUS_COLUMN].fillna(NOT_RECORDED)
    out.index = summary.index
    return out.drop(columns="job_id")

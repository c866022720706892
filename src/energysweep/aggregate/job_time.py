"""Where each job's time went: job.json ``timing.phases_s`` as summary columns.

Every point of a job carries its job's rank-0 wall time (``job_wall_s``), the fraction of it
inside measured windows (``job_window_fraction``) and the seconds of each phase
(``job_<phase>_s``, :class:`energysweep.tables.phases.JobPhase`), which add up to the wall time.
A job.json without phases (written by an older energysweep) leaves them null with
``job_time_status`` ``not_recorded``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from energysweep.job.spec import JOB_KEYS
from energysweep.tables.phases import JOB_PHASES

PHASE_COLUMNS = [f"job_{p.value}_s" for p in JOB_PHASES]
COLUMNS = ["job_wall_s", "job_window_fraction", *PHASE_COLUMNS]
STATUS_COLUMN = "job_time_status"
COUNTED, NOT_RECORDED = "counted", "not_recorded"
NULL_STATUS = {c: (STATUS_COLUMN,) for c in COLUMNS}
UNSET = "unset"  # the summary's text for a GPU setting axis the job did not set


def _key(values) -> tuple:
    """A job's key (:data:`JOB_KEYS`) as text, a missing, null or ``unset`` axis as None: the
    same from job.json's ``job`` (None where the sweep has no such axis) and from a summary row
    (``unset`` there)."""
    out = []
    for k in JOB_KEYS:
        v = values.get(k)
        null = v is None or v == UNSET or (isinstance(v, float) and math.isnan(v))
        out.append(None if null else str(v))
    return tuple(out)


def job_time(records: dict[Path, dict]) -> dict[tuple, dict]:
    """Job key -> its wall time, window fraction, seconds per phase and status."""
    out = {}
    for record in records.values():
        timing = record.get("timing") or {}
        phases = timing.get("phases_s")
        row = dict.fromkeys(COLUMNS)
        if phases:
            row.update(
                job_wall_s=timing.get("rank0_wall_s"),
                job_window_fraction=timing.get("window_fraction"),
                **{f"job_{p.value}_s": phases.get(p.value) for p in JOB_PHASES},
            )
        row[STATUS_COLUMN] = COUNTED if phases else NOT_RECORDED
        out[_key(record.get("job") or {})] = row
    return out


def job_time_columns(summary: pd.DataFrame, records: dict[Path, dict] | None) -> pd.DataFrame:
    """:data:`COLUMNS` and the status for every row of ``summary`` (by its job key), same index;
    no columns without ``records`` (shards merged without their job.json)."""
    if records is None:
        return pd.DataFrame(index=summary.index)
    jobs = job_time(records)
    missing = {**dict.fromkeys(COLUMNS), STATUS_COLUMN: NOT_RECORDED}
    rows = [jobs.get(_key(r), missing) for r in summary.to_dict("records")]
    return pd.DataFrame(rows, index=summary.index, columns=[*COLUMNS, STATUS_COLUMN])

"""Shards -> merged rows -> one row per window -> one row per grid point, in that order.

Stages, one module each:

- :mod:`.merge`: every job's table read once and verified against its job.json;
- :mod:`.windows`: shard rows -> one row per measured window (the counting rule: GPU energy
  summed over distinct GPU UUIDs, never a partial sum; host energy over distinct hosts);
- :mod:`.points`: windows -> one row per grid point (medians over ok repetitions, the
  prefill/decode split, training figures), with :mod:`.bootstrap` CIs of the median;
- :mod:`.nulls`: every null in the summary is explained by a status column;
- :mod:`.overlap`: windows of different jobs on one GPU UUID at the same time (flagged for the
  verdict's ``gpu_shared``, nothing dropped);
- :mod:`.publish`: all outputs staged beside their names, then renamed (all or nothing).

The validity verdict is a later stage (:mod:`energysweep.validity`);
:mod:`energysweep.results` runs merge -> summary -> verdict -> publish.

:mod:`.groups` is the group-by engine the vectorised stages share; tests/unit/
aggregate_reference.py holds them to the per-window and per-point loops they replaced.
Derived figures are never stored in shards (rows keep gross energy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from energysweep.aggregate.bootstrap import bootstrap_ci
from energysweep.aggregate.merge import (
    MergeInputError,
    MissingJobTable,
    job_table_paths,
    load_job_records,
    merge,
    rerun_command,
)
from energysweep.aggregate.nulls import NULL_STATUS, unexplained_nulls
from energysweep.aggregate.points import NO_OUTPUT_TOKENS, NOT_TRAINING, prefill_decode, summarize
from energysweep.aggregate.publish import PARTITION_KEYS, write_dataset
from energysweep.aggregate.windows import MEASURED, TRAIN_PHASE, WINDOW_COLUMNS, windows
from energysweep.tables.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS

__all__ = [
    "HEADLINE_PHASES",
    "MEASURED",
    "NOT_TRAINING",
    "NO_OUTPUT_TOKENS",
    "NULL_STATUS",
    "PARTITION_KEYS",
    "POINT_KEYS",
    "TRAIN_PHASE",
    "WINDOW_COLUMNS",
    "WINDOW_KEYS",
    "MergeInputError",
    "MissingJobTable",
    "bootstrap_ci",
    "environment_table",
    "job_table_paths",
    "load_job_records",
    "merge",
    "prefill_decode",
    "rerun_command",
    "summarize",
    "unexplained_nulls",
    "windows",
    "write_dataset",
]


def environment_table(
    job_json_paths: list[str | Path], records: dict[Path, dict] | None = None
) -> pd.DataFrame:
    """Every job's environment (job.json) as one row per (job, GPU); join on ``job_id``."""
    from energysweep.measure.provenance import environment_rows

    rows = []
    for p in job_json_paths:
        record = records[Path(p)] if records is not None else json.loads(Path(p).read_text())
        rows += environment_rows(record)
    return pd.DataFrame(rows)

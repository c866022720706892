"""Shards -> merged rows -> one row per window -> one row per grid point, in that order.

Derived figures are never stored in shards (rows keep gross energy); the verdict is a later stage
(energysweep.validity). Its modules, one per stage: docs/architecture.md.
"""

from __future__ import annotations

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

"""Shards -> merged rows -> one row per window -> one row per grid point, in that order.

Stages, one module each:

- :mod:`.merge`: every job's table read once and verified against its job.json;
- :mod:`.windows`: shard rows -> one row per measured window (the counting rule: GPU energy
  summed over distinct GPU UUIDs, never a partial sum; host energy over distinct hosts);
- :mod:`.points`: windows -> one row per grid point (medians over ok repetitions, the
  prefill/decode split, training figures), with :mod:`.bootstrap` CIs of the median;
- :mod:`.nulls`: every null in the summary is explained by a status column;
- :mod:`.publish`: all outputs staged beside their names, then renamed (all or nothing).

:mod:`.groups` is the group-by engine the vectorised stages share; tests/unit/
aggregate_reference.py holds them to the per-window and per-point loops they replaced.
Derived figures are never stored in shards (rows keep gross energy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from energysweep import validity
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
from energysweep.aggregate.publish import PARTITION_KEYS, publish, write_dataset
from energysweep.aggregate.windows import MEASURED, TRAIN_PHASE, WINDOW_COLUMNS, windows
from energysweep.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS

__all__ = [
    "HEADLINE_PHASES", "MEASURED", "NOT_TRAINING", "NO_OUTPUT_TOKENS", "NULL_STATUS",
    "PARTITION_KEYS", "POINT_KEYS", "TRAIN_PHASE", "WINDOW_COLUMNS", "WINDOW_KEYS",
    "MergeInputError", "MissingJobTable", "aggregate", "bootstrap_ci", "environment_table",
    "job_table_paths", "load_job_records", "merge", "prefill_decode", "rerun_command",
    "summarize", "unexplained_nulls", "windows", "write_dataset",
]


def environment_table(job_json_paths: list[str | Path],
                      records: dict[Path, dict] | None = None) -> pd.DataFrame:
    """Every job's environment (job.json) as one row per (job, GPU); join on ``job_id``."""
    from energysweep.envinfo import environment_rows

    rows = []
    for p in job_json_paths:
        record = records[Path(p)] if records is not None else json.loads(Path(p).read_text())
        rows += environment_rows(record)
    return pd.DataFrame(rows)


def aggregate(
    paths: list[str | Path], energy_out: str | Path, summary_out: str | Path,
    jobs: list[str | Path] | None = None, environment_out: str | Path | None = None,
    snakemake_args: list[str] | None = None,
    validation_out: str | Path | None = None, stages_out: str | Path | None = None,
    validity_config: dict | None = None,
) -> None:
    """Merge shards or job tables (``paths``; same schema) into ``energy_out`` (a hive-partitioned
    Parquet dataset, see
    :func:`write_dataset`) and write the per-point ``summary_out`` (CSV).

    With ``jobs`` (job.json paths), every job table is verified against its job.json first
    (:func:`merge`); with ``environment_out`` too, also write the environment table. With
    ``validation_out``/``stages_out``, also re-check every window against the jobs' power
    timelines, write the validation table and the per-stage table, and add the validity verdict
    to the summary (energysweep.validity; thresholds ``validity_config``).

    All or nothing: everything is read, checked and computed before the first write; each
    output is written to a temp name beside it, and only when all are written are they renamed
    into place. A failed merge (a bad job table, a full disk) leaves the previous outputs as
    they were and no partial file under an output's name.

    Raises:
        MergeInputError: a job table or job.json is missing, unreadable, or disagrees with its
            job.json; the message names each, its job, and the command that reruns it.
    """
    import pyarrow.parquet as pq

    records = load_job_records(jobs, snakemake_args) if jobs is not None else None
    table = merge(paths, records, snakemake_args)
    summary = summarize(windows(table.select(WINDOW_COLUMNS).to_pandas()))
    validation = stages = None
    if validation_out is not None or stages_out is not None:
        summary, validation, stages = validity.evaluate(
            summary, table.select(validity.ROW_COLUMNS).to_pandas(), jobs or [], validity_config,
        )
    # (output path, writer of a temp file beside it), in publishing order.
    files: list[tuple[Path, object]] = [
        (Path(summary_out), lambda tmp: summary.to_csv(tmp, index=False)),
    ]
    if jobs is not None and environment_out is not None:
        env = pa.Table.from_pandas(environment_table(jobs, records), preserve_index=False)
        files.append((Path(environment_out), lambda tmp: pq.write_table(env, tmp)))
    if validation_out is not None:
        files.append((Path(validation_out), lambda tmp: pq.write_table(
            pa.Table.from_pandas(validation, preserve_index=False), tmp)))
    if stages_out is not None:
        files.append((Path(stages_out), lambda tmp: stages.to_csv(tmp, index=False)))
    publish(table, energy_out, files)

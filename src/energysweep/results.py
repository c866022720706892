"""A sweep's published results: merged shards, summary, verdicts, written all or nothing.

The stages run in data-flow order: :mod:`energysweep.aggregate` merges every job's table and
summarises the points, :mod:`energysweep.validity` adds the verdict, the re-check and the
stage table, then :func:`energysweep.aggregate.publish.publish` writes every output (temp names,
then renames). This is the one module that calls both stages.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa

from energysweep.aggregate import (
    gpu_setting,
    ladder,
    load_job_records,
    merge,
    nulls,
    overlap,
    summarize,
    windows,
)
from energysweep.aggregate.publish import publish
from energysweep.aggregate.windows import WINDOW_COLUMNS
from energysweep.job.sections import Facility
from energysweep.tables.environment import environment_table
from energysweep.validity import verdict

# Every summary column's null policy: the aggregate's, the GPU setting's, the ladder's and the
# verdict's.
NULL_STATUS: dict[str, tuple[str, ...]] = {
    **nulls.NULL_STATUS,
    **gpu_setting.NULL_STATUS,
    **ladder.NULL_STATUS,
    **verdict.NULL_STATUS,
}
INFO_COLUMNS = nulls.INFO_COLUMNS | gpu_setting.INFO_COLUMNS | verdict.INFO_COLUMNS


def unexplained_nulls(summary: pd.DataFrame) -> list[str]:
    """``column[row]`` for every null in a published summary that no status column explains."""
    return nulls.unexplained_nulls(summary, NULL_STATUS, INFO_COLUMNS)


def _verdict(summary: pd.DataFrame, table: pa.Table, jobs: list, validity_config: dict | None):
    """The verdict, re-check and stages over the merged rows (energysweep.validity.verdict),
    with the windows of different jobs found on one GPU at once (aggregate.overlap)."""
    return verdict.evaluate(
        summary,
        table.select(verdict.ROW_COLUMNS).to_pandas(),
        jobs,
        verdict.Thresholds.from_config(validity_config),
        overlap.shared_windows(table.select(overlap.ROW_COLUMNS).to_pandas()),
    )


def aggregate(
    paths: list[str | Path],
    energy_out: str | Path,
    summary_out: str | Path,
    jobs: list[str | Path] | None = None,
    environment_out: str | Path | None = None,
    snakemake_args: list[str] | None = None,
    validation_out: str | Path | None = None,
    stages_out: str | Path | None = None,
    validity_config: dict | None = None,
    facility_config: dict | None = None,
) -> None:
    """Merge shards or job tables (``paths``; same schema) into ``energy_out`` (a hive-partitioned
    Parquet dataset, see
    :func:`write_dataset`) and write the per-point ``summary_out`` (CSV).

    With ``jobs`` (job.json paths), every job table is verified against its job.json first
    (:func:`merge`); with ``environment_out`` too, also write the environment table. With
    ``validation_out``/``stages_out``, also re-check every window against the jobs' power
    timelines, write the validation table and the per-stage table, and add the validity verdict
    to the summary (energysweep.validity; thresholds ``validity_config``, the validated config's
    ``validity`` section, required then). Every point gets its GPU setting
    (energysweep.aggregate.gpu_setting) and its energy boundary ladder
    (energysweep.aggregate.ladder; PUE and carbon intensity from ``facility_config``, the
    validated config's ``facility`` section; None: not estimated).

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
    win = windows(table.select(WINDOW_COLUMNS).to_pandas())
    summary = summarize(win)
    if len(summary):
        setting = gpu_setting.setting_columns(
            summary, table.select(gpu_setting.ROW_COLUMNS).to_pandas()
        )
        rungs = ladder.ladder(
            summary,
            win,
            table.select(ladder.NODE_COLUMNS).to_pandas(),
            None if facility_config is None else Facility.from_config(facility_config),
        )
        summary = pd.concat([summary, setting, rungs], axis=1)
    validation = stages = None
    if validation_out is not None or stages_out is not None:
        summary, validation, stages = _verdict(summary, table, jobs or [], validity_config)
    # (output path, writer of a temp file beside it), in publishing order.
    files: list[tuple[Path, Callable[[str], object]]] = [
        (Path(summary_out), lambda tmp: summary.to_csv(tmp, index=False)),
    ]
    if jobs is not None and environment_out is not None:
        env = environment_table(jobs, records)
        files.append((Path(environment_out), lambda tmp: pq.write_table(env, tmp)))
    if validation_out is not None:
        files.append(
            (
                Path(validation_out),
                lambda tmp: pq.write_table(
                    pa.Table.from_pandas(validation, preserve_index=False), tmp
                ),
            )
        )
    if stages_out is not None and stages is not None:
        stage_table = stages
        files.append((Path(stages_out), lambda tmp: stage_table.to_csv(tmp, index=False)))
    publish(table, energy_out, files)

"""Merge verification and reading: every job's table, checked against its job.json.

A job table that is missing, unreadable, of another schema version, or that disagrees with its
job.json (row count, config hash, job id) refuses the merge: :class:`MergeInputError` names
every bad file, its job, and the command that reruns it.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from energysweep.job.spec import JOB_KEYS, JobDir
from energysweep.tables import shards


class MergeInputError(ValueError):
    """A job's files cannot be merged; the message names each file, its job, and the rerun."""


def rerun_command(job_record: str | Path, snakemake_args: list[str] | None = None) -> str:
    """The command that reruns one job (and the merge after it).

    ``--forcerun`` of the job's job.json reruns the measure job that writes it, then everything
    downstream. ``snakemake_args`` are the options of the run that failed (``--profile``,
    ``--configfile``: energysweep.util.steplog.snakemake_options), default the local profile.
    """
    import shlex

    args = list(snakemake_args or ["--profile", "profiles/local"])
    return shlex.join(["snakemake", *args, "--forcerun", str(job_record)])


def _job_label(record: dict | None, job_record: Path) -> str:
    job = (record or {}).get("job") or {}
    label = " ".join(f"{k}={job[k]}" for k in JOB_KEYS if k in job)
    return f"{label} ({job_record})" if label else str(job_record)


def _problem(
    table: Path, job_record: Path, record: dict | None, what: str, snakemake_args: list[str] | None
) -> str:
    """One line per bad file: the file and what is wrong, its job, the command to rerun it."""
    return (
        f"{table} {what}; job: {_job_label(record, job_record)}; "
        f"rerun it: {rerun_command(job_record, snakemake_args)}"
    )


class MissingJobTable(MergeInputError, FileNotFoundError):
    """A job's table is missing next to its job.json."""


def job_table_paths(
    job_records: list[str | Path], snakemake_args: list[str] | None = None
) -> list[Path]:
    """Every job's table (``JobDir.job_table``: all its shards' rows in one file), found in the
    directory of its job.json.

    Reading one file per job instead of one per window is what keeps the merge of a large sweep
    fast (bench/merge_scaling.py). Raises MergeInputError (a FileNotFoundError too) naming every
    job whose table is missing and the command that reruns it (its job.json stands for all of the
    job's outputs in the merge rule, so Snakemake would not notice).
    """
    paths, problems = [], []
    for record in job_records:
        table = Path(JobDir.of(record).job_table)
        if not table.is_file():
            problems.append(
                _problem(
                    table,
                    Path(record),
                    None,
                    f"is missing although {record} exists",
                    snakemake_args,
                )
            )
        paths.append(table)
    if problems:
        raise MissingJobTable(_merge_failure(problems))
    return paths


def _merge_failure(problems: list[str]) -> str:
    shown = problems[:20]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    return (
        f"merge refused: {len(problems)} job table(s) cannot be merged; nothing was written and "
        "the previous results are unchanged.\n  " + "\n  ".join(shown) + more
    )


def load_job_records(
    job_records: list[str | Path], snakemake_args: list[str] | None = None
) -> dict[Path, dict]:
    """job.json path -> its record; MergeInputError naming every unreadable one."""
    records, problems = {}, []
    for path in map(Path, job_records):
        try:
            records[path] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(_problem(path, path, None, f"is unreadable ({exc})", snakemake_args))
    if problems:
        raise MergeInputError(_merge_failure(problems))
    return records


def _check_table(table: pa.Table, record: dict) -> list[str]:
    """What is wrong with a job's table given its job.json (empty: nothing)."""
    wrong = []
    versions = set(pc.unique(table.column("schema_version")).to_pylist())
    if versions != {shards.SCHEMA_VERSION} and table.num_rows:
        wrong.append(
            f"has schema version {sorted(versions)}, this energysweep merges version "
            f"{shards.SCHEMA_VERSION}"
        )
    expected_rows = record.get("job_table_rows")
    if expected_rows is None:
        wrong.append("has no row count in job.json (written by an older energysweep)")
    elif table.num_rows != expected_rows:
        wrong.append(f"has {table.num_rows} rows, job.json records {expected_rows}")
    hashes = set(pc.unique(table.column("config_hash")).to_pylist())
    if hashes - {record.get("config_hash")}:
        wrong.append(
            f"has config hash {sorted(hashes)}, not job.json's "
            f"{record.get('config_hash')!r} (the file belongs to another run)"
        )
    ids = set(pc.unique(table.column("job_id")).to_pylist())
    if ids - {record.get("job_id")}:
        wrong.append(f"has job id {sorted(ids)}, not job.json's {record.get('job_id')!r}")
    return wrong


# Shards per read task: each task concatenates its shards into one chunk, so the merged table
# is not 10^4 one-row chunks that every later step (the partitioned write, to_pandas) pays for.
MERGE_BATCH = 64


def _read_batch(
    paths: list[str | Path], expect: dict | None = None, snakemake_args: list[str] | None = None
) -> tuple[pa.Table | None, list[str]]:
    """The batch's tables concatenated, and what is wrong with any of them (then no table)."""
    tables, problems = [], []
    for p in paths:
        job_record, record = (expect or {}).get(Path(p), (None, None))
        try:
            table = shards.read_shard(p)
        except (pa.ArrowException, OSError, shards.ShardError) as exc:
            if job_record is None:
                raise
            detail = " ".join(str(exc).split())  # one line per bad file
            what = f"is not a valid job table ({type(exc).__name__}: {detail})"
            if isinstance(exc, (pa.ArrowInvalid, OSError)):
                what = f"is not a readable Parquet file, truncated or corrupt ({detail})"
            problems.append(_problem(Path(p), job_record, record, what, snakemake_args))
            continue
        if record is not None:
            wrong = _check_table(table, record)
            if wrong:
                problems.append(
                    _problem(Path(p), job_record, record, "; ".join(wrong), snakemake_args)
                )
                continue
        tables.append(table)
    if problems:
        return None, problems
    return pa.concat_tables(tables).combine_chunks(), []


def merge(
    paths: list[str | Path],
    records: dict[Path, dict] | None = None,
    snakemake_args: list[str] | None = None,
) -> pa.Table:
    """Read every shard once, check its schema, and concatenate (one chunk per batch of shards).

    With ``records`` (job.json path -> record, :func:`load_job_records`), each path must be the
    job table next to one of them and is verified against it: readable Parquet, the shard
    schema and its version, the row count job.json records, the job's config hash and job id.
    Every bad table is reported at once (:class:`MergeInputError`), each with its job and the
    command that reruns it.

    Reads run on a few threads: pyarrow decodes without the GIL, and per-file open and decode
    (not bytes) is the cost of many small shards (bench/merge_scaling.py).
    """
    if not paths:
        return shards.SCHEMA.empty_table()
    expect = None
    if records is not None:
        expect = {Path(JobDir.of(j).job_table): (Path(j), r) for j, r in records.items()}
    batches = [paths[i : i + MERGE_BATCH] for i in range(0, len(paths), MERGE_BATCH)]
    workers = min(8, 2 * (os.cpu_count() or 1), len(batches))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda b: _read_batch(b, expect, snakemake_args), batches))
    problems = [p for _, batch_problems in results for p in batch_problems]
    if problems:
        raise MergeInputError(_merge_failure(problems))
    return pa.concat_tables([t for t, _ in results])

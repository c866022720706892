"""job.json: what one job was (its key, processes, environment, timing); written last, on rank 0.

The merge checks a job's table against ``job_table_rows``; a job whose job.json is missing did
not finish (staging then publish writes it last).
"""

from __future__ import annotations

import dataclasses

from energysweep.job.sections import as_dict
from energysweep.job.spec import LaunchedJob
from energysweep.tables import shards
from energysweep.tables.io import write_json_atomic


def write_job_record(
    job: LaunchedJob,
    audits: list[dict],
    environment: dict,
    timing: dict,
    job_table_rows: int,
) -> None:
    """Write ``job.outputs.job_json`` atomically.

    Args:
        job: the launched job the ranks read.
        audits: every rank's process audit (``RankContext.audit``), in rank order.
        environment: :func:`energysweep.measure.provenance.job_environment` of the job.
        timing: rank 0's wall time, model load, idle baseline and window totals.
        job_table_rows: rows of the job table.
    """
    record = {
        "job_id": job.job_id,
        "job": dataclasses.asdict(job.key),
        "config_hash": job.config_hash,
        "code_version": job.code_version,
        "launch_argv": job.launch_argv,
        "processes": audits,
        "environment": environment,
        "measurement": as_dict(job.measurement),
        "engine": as_dict(job.engine) if job.engine is not None else None,  # engine jobs only
        "seed": job.seed,
        "timing": timing,
        # What the merge checks the job table against (aggregate.merge).
        "job_table_rows": job_table_rows,
        "schema_version": shards.SCHEMA_VERSION,
    }
    write_json_atomic(record, job.outputs.job_json)

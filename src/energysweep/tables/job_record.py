"""job.json: what one job was (spec, processes, environment, timing); written last, on rank 0.

The merge checks a job's table against ``job_table_rows``; a job whose job.json is missing did
not finish (staging then publish writes it last).
"""

from __future__ import annotations

import json

from energysweep.tables import shards
from energysweep.tables.io import write_text_atomic


def write_job_record(
    spec: dict,
    audits: list[dict],
    environment: dict,
    timing: dict,
    job_table_rows: int | None = None,
) -> None:
    """Write ``spec["outputs"]["job_json"]`` atomically.

    Args:
        spec: the job spec the ranks read.
        audits: every rank's process audit (``RankContext.audit``), in rank order.
        environment: :func:`energysweep.measure.provenance.job_environment` of the job.
        timing: rank 0's wall time, model load, idle baseline and window totals.
        job_table_rows: rows of the job table (None where the job writes none).
    """
    record = {
        "job_id": spec["job_id"],
        "job": spec["job"],
        "config_hash": spec["config_hash"],
        "code_version": spec["code_version"],
        "launch_argv": spec.get("launch_argv"),
        "processes": audits,
        "environment": environment,
        "measurement": spec["measurement"],
        "engine": spec.get("engine"),  # engine jobs only (config `engine:`)
        "seed": spec["seed"],
        "timing": timing,
        # What the merge checks the job table against (aggregate.merge).
        "job_table_rows": job_table_rows,
        "schema_version": shards.SCHEMA_VERSION,
    }
    write_text_atomic(json.dumps(record, indent=2, default=str), spec["outputs"]["job_json"])

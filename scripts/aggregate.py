"""Snakemake step: merge every job's table (its shards) into the dataset, summary, environment."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.aggregate import aggregate, job_table_paths  # noqa: E402

sm = snakemake  # noqa: F821
with open(sm.log[0], "w") as log:
    sys.stderr = sys.stdout = log
    jobs = list(sm.input.jobs)
    aggregate(
        job_table_paths(jobs),
        sm.output.energy,
        sm.output.summary,
        jobs=jobs,
        environment_out=sm.output.environment,
        validation_out=sm.output.validation,
        stages_out=sm.output.stages,
        validity_config=sm.params.validity,
    )

"""Snakemake step: merge all shards into the energy dataset, the summary and the environment."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.aggregate import aggregate, job_shard_paths  # noqa: E402

sm = snakemake  # noqa: F821
with open(sm.log[0], "w") as log:
    sys.stderr = sys.stdout = log
    jobs = list(sm.input.jobs)
    aggregate(
        job_shard_paths(jobs, list(sm.params.shard_names)),
        sm.output.energy,
        sm.output.summary,
        jobs=jobs,
        environment_out=sm.output.environment,
    )

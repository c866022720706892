"""Snakemake step: merge every job's table (its shards) into the dataset, summary, environment."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import snakemake_options, step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.aggregate import job_table_paths
    from energysweep.results import aggregate

    jobs = list(sm.input.jobs)
    # A bad job table's error says how to rerun its job, with this run's profile and config.
    rerun_args = snakemake_options() or ["--profile", "profiles/local"]
    aggregate(
        job_table_paths(jobs, rerun_args),
        sm.output.energy,
        sm.output.summary,
        jobs=jobs,
        environment_out=sm.output.environment,
        snakemake_args=rerun_args,
        validation_out=sm.output.validation,
        stages_out=sm.output.stages,
        validity_config=sm.params.validity,
        facility_config=sm.params.facility,
    )

"""Snakemake step: run one measure job (all ranks of one layout). Logs go to the rule's log."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule) as log:
    from energysweep.job.sections import Limits, load_section
    from energysweep.job.spec import JobDir, JobSpec
    from energysweep.launch.job import run_job

    # A retry (profile `retries`) overwrites the log: say which attempt this one is.
    attempt = sm.resources.attempt
    retry = " (a retry: the previous attempt failed)" if attempt > 1 else ""
    print(f"measure job, attempt {attempt}{retry}", flush=True)
    spec = JobSpec.from_json(dict(sm.params.spec))
    job_dir = JobDir.of(sm.output.job)
    # The rule's outputs are JobDir's paths (rules/measure.smk); a mismatch is a bug here. The
    # emulated node's state directory (measurement.device emulated) is published with the job
    # but is no rule output: the pipeline never reads it.
    outputs = job_dir.outputs(spec.batch_sizes, spec.workload.repetitions, emulated=False)
    assert outputs.paths() == [
        *sm.output.shards, sm.output.job_table, sm.output.job, sm.output.generations,
        sm.output.power, sm.output.requests,
    ]  # fmt: skip
    run_job(
        spec,
        job_dir,
        sm.params.model_dir,
        # Not in params: a changed limit must not make Snakemake rerun finished jobs.
        load_section(Limits, sm.config["limits"], "limits"),
        log,
        cpus=sm.threads,
        # "" (pytorch; any backend under conda): this Python, the rule's environment.
        python=sm.params.python or sys.executable,
        # A serving job's server interpreter ("" on other jobs).
        server_python=sm.params.server_python or None,
    )

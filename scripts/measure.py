"""Snakemake step: run one measure job (all ranks of one layout). Logs go to the rule's log."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule) as log:
    from energysweep.job.spec import JobDir, JobSpec
    from energysweep.launch.job import run_job

    spec = JobSpec.from_dict(dict(sm.params.spec))
    job_dir = JobDir(str(Path(sm.output.job).parent))
    outputs = job_dir.outputs(spec.batch_sizes, spec.workload["repetitions"])
    # The rule's outputs are JobDir's paths (rules/measure.smk); a mismatch is a bug here.
    assert [p for ps in outputs["shards"].values() for p in ps] == list(sm.output.shards)
    assert [outputs[k] for k in ("job_table", "job_json", "generations", "power", "requests")] == [
        sm.output.job_table, sm.output.job, sm.output.generations, sm.output.power,
        sm.output.requests,
    ]  # fmt: skip
    spec = spec.with_run(sm.params.model_dir, outputs, sm.params.server_python or None)
    run_job(
        spec.to_dict(),
        job_dir.spec_file,
        log,
        cpus=sm.threads,
        gpus_per_node=spec.gpus_per_node,
        # Not in params: a changed limit must not make Snakemake rerun finished jobs.
        limits=sm.config.get("limits"),
        # "" (pytorch; any backend under conda): this Python, the rule's environment.
        python=sm.params.python or sys.executable,
    )

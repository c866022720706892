"""Snakemake step: run one measure job (all ranks of one layout). Logs go to the rule's log."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.launch import run_job  # noqa: E402
from energysweep.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule) as log:
    spec = dict(sm.params.spec)
    spec["model_dir"] = sm.params.model_dir
    n_bs, n_rep = len(spec["batch_sizes"]), spec["workload"]["repetitions"]
    paths = list(sm.output.shards)
    spec["outputs"] = {
        "shards": {
            str(bs): paths[i * n_rep : (i + 1) * n_rep] for i, bs in enumerate(spec["batch_sizes"])
        },
        "job_table": sm.output.job_table,
        "job_json": sm.output.job,
        "generations": sm.output.generations,
        "power": sm.output.power,
        "requests": sm.output.requests,
    }
    assert len(paths) == n_bs * n_rep
    run_job(
        spec,
        Path(sm.output.job).parent / ".spec.json",
        log,
        cpus=sm.threads,
        gpus_per_node=spec["gpus_per_node"],
        # Not in params: a changed limit must not make Snakemake rerun finished jobs.
        limits=sm.config.get("limits"),
    )

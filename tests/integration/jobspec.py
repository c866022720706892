"""A measure job's spec as the workflow builds it (rules/common.smk get_job_spec + measure.py),
for tests that call launch.run_job directly: the production path below Snakemake."""

from __future__ import annotations

from pathlib import Path

from energysweep.job.layout import ParallelLayout
from energysweep.sweep import config as es_config


def job_spec(
    layout: ParallelLayout,
    scenario: str,
    model_dir: Path,
    out: Path,
    batch_sizes=(1,),
    reps: int = 1,
    measurement: dict | None = None,
    workload: dict | None = None,
    training: dict | None = None,
) -> dict:
    """The spec of one job writing its outputs under ``out``; CPU, no idle/cooldown/sampler.

    ``measurement``, ``workload`` and ``training`` override the schema's defaults.
    """
    cfg = {"models": [{"name": "tiny", "path": "builtin:tiny"}]}
    es_config.validate_schema(cfg)  # the schema's defaults, as the workflow fills them
    batch_sizes = list(batch_sizes)
    return {
        "job": {"model": "tiny", "backend": "pytorch", "scenario": scenario,
                "tp": layout.tp, "pp": layout.pp, "dp": layout.dp},
        "dtype": "float32", "seed": 0,
        "workload": {**cfg["workload"], "repetitions": reps, **(workload or {})},
        "measurement": {**cfg["measurement"], "min_window_s": 0, "idle_baseline_s": 0,
                        "cooldown_s": 0, "sampler_hz": 0, "device": "cpu",
                        **(measurement or {})},
        **({"training": {**cfg["training"], **(training or {})}} if scenario == "training"
           else {}),
        "batch_sizes": batch_sizes, "model_entry": cfg["models"][0], "gpus_per_node": 8,
        "model_dir": str(model_dir),
        "outputs": {
            "shards": {str(bs): [str(out / f"bs~{bs}" / f"rep~{r}.parquet") for r in range(reps)]
                       for bs in batch_sizes},
            "job_table": str(out / "shards.parquet"),
            "job_json": str(out / "job.json"),
            "generations": str(out / "generations.parquet"),
        },
    }  # fmt: skip

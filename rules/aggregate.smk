# Shards -> merged energy table and per-point summary. Cheap: run on the submit host.


localrules:
    grid_tables,
    record_config,
    merge_shards,


rule record_config:
    output:
        "results/config.yaml",
    log:
        "logs/record_config.log",
    conda:
        "../envs/base.yaml"
    params:
        config=config,
        sweep_hash=SWEEP_HASH,
        code_version=CODE_VERSION,
    script:
        "../scripts/record_config.py"


rule grid_tables:
    output:
        jobs="results/grid/jobs.tsv",
        skipped="results/grid/skipped.tsv",
    log:
        "logs/grid_tables.log",
    conda:
        "../envs/base.yaml"
    params:
        jobs=JOBS.to_dict("records"),
        skipped=GRID.skipped,
        key_columns=PATH_KEYS,
    script:
        "../scripts/grid_tables.py"


# Inputs are one job.json per job, not every shard: at 10^4 jobs x B x R shards, resolving each
# shard as a DAG input was the largest avoidable cost of `snakemake -n` (bench/README.md). A
# measure job writes job.json last and Snakemake only counts the job done once all its outputs
# exist, so job.json stands for the job's outputs. The merge reads each job's table (its shards'
# rows in one file: one read per job, not per window); aggregate.job_table_paths() finds them
# and fails naming the job if one is missing (rerun it with --forcerun).
rule merge_shards:
    input:
        jobs=get_all_job_records(),
    # update(): Snakemake keeps the previous results while the merge runs (backed up, restored
    # if it fails) instead of deleting them first: a refused merge (bad job table) or a failed
    # one leaves the last complete results in place. The merge itself renames its outputs into
    # place only when all are written (aggregate.aggregate).
    output:
        # Hive-partitioned Parquet dataset (model=.../backend=.../part-0.parquet) that pandas,
        # pyarrow and DuckDB read as one table.
        energy=update(directory("results/energy.parquet")),
        summary=update("results/summary.csv"),
        environment=update("results/environment.parquet"),
        # Timeline vs counter energy per window and GPU (energysweep.validity.recheck; README,
        # "Independent re-check"), and energy / CPU time per pipeline stage.
        validation=update("results/validation.parquet"),
        stages=update("results/stages.csv"),
    log:
        "logs/merge_shards.log",
    conda:
        "../envs/base.yaml"
    params:
        validity=config["validity"],
        # PUE and carbon intensity for the energy boundary ladder (estimates, with provenance).
        facility=config["facility"],
    script:
        "../scripts/aggregate.py"

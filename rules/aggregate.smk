# Shards -> merged energy table and per-point summary. Cheap: run on the submit host.


localrules:
    grid_tables,
    record_config,
    merge_shards,


rule record_config:
    output:
        "results/config.yaml",
    params:
        config=config,
        config_hash=CONFIG_HASH,
        code_version=CODE_VERSION,
    log:
        "logs/record_config.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/record_config.py"


rule grid_tables:
    output:
        jobs="results/grid/jobs.tsv",
        skipped="results/grid/skipped.tsv",
    params:
        jobs=JOBS.to_dict("records"),
        skipped=GRID.skipped,
    log:
        "logs/grid_tables.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/grid_tables.py"


rule merge_shards:
    input:
        shards=get_all_shards(),
        jobs=get_all_job_records(),
    output:
        energy="results/energy.parquet",
        summary="results/summary.csv",
        environment="results/environment.parquet",
    log:
        "logs/merge_shards.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/aggregate.py"

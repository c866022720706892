# The sweep as one citable file: a Workflow Run RO-Crate (energysweep.archive; `make archive`).
# Not part of `rule all`: a sweep ends with it when asked (`snakemake ... archive`), on the submit
# host. results/report.html is made by `--report`, not by a rule: the step checks it exists and
# names the fix when it does not (`make archive` builds it first when missing).


localrules:
    archive,


rule archive:
    input:
        config="results/config.yaml",
        jobs_tsv="results/grid/jobs.tsv",
        skipped="results/grid/skipped.tsv",
        energy="results/energy.parquet",
        summary="results/summary.csv",
        environment="results/environment.parquet",
        validation="results/validation.parquet",
        stages=STAGE_TABLE,
        exports=rules.exports.output,
        jobs=get_all_job_records(),
    output:
        crate=get_archive_path(),
    log:
        "logs/archive.log",
    conda:
        "../envs/base.yaml"
    params:
        workflow=workflow.basedir,
        name=get_archive_name(),
    script:
        "../scripts/archive.py"

# energysweep: grid -> measure jobs -> Parquet shards -> tables, plots and report.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/model.smk"
include: "rules/measure.smk"
include: "rules/aggregate.smk"
include: "rules/report.smk"
include: "rules/archive.smk"
include: "rules/preflight.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),

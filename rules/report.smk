# Figures and report pages, each wrapped in report(...) with a caption in report/, so that
# `snakemake --report results/report.html` (added to the same run by `make run`) holds them all.


report: "../report/workflow.rst"


localrules:
    figures,
    report_pages,
    headline,
    exports,


rule figures:
    input:
        unpack(get_figure_inputs),
    output:
        energy_per_token=report_figure(
            "energy_per_token", "1 Inference", "Energy per output token vs batch size"
        ),
        layouts_equal_gpus=report_figure(
            "layouts_equal_gpus", "1 Inference", "Layouts at equal GPU count"
        ),
        backends=report_figure(
            "backends", "1 Inference", "Backends on the same layouts"
        ),
        pareto=report_figure("pareto", "1 Inference", "Energy–throughput Pareto front"),
        prefill_decode=report_figure(
            "prefill_decode", "2 Where energy goes", "Prefill vs decode split"
        ),
        stages=report_figure(
            "stages", "2 Where energy goes", "Pipeline stage balance (pp > 1)"
        ),
        power_timeline=report_figure(
            "power_timeline", "2 Where energy goes", "Power timeline per job"
        ),
        training=report_figure(
            "training", "3 Training", "Energy per training token and throughput"
        ),
        serving_pareto=report_figure(
            "serving_pareto", "4 Serving", "Energy per request vs throughput, the knee"
        ),
        serving_latency=report_figure(
            "serving_latency", "4 Serving", "Latency percentiles vs load"
        ),
        serving_slo=report_figure(
            "serving_slo", "4 Serving", "Energy per request vs latency under the SLO"
        ),
        gpu_settings=report_figure(
            "gpu_settings",
            "1 Inference",
            "Energy per token by GPU power limit and clock",
        ),
        energy_ladder=report_figure(
            "energy_ladder",
            "2 Where energy goes",
            "Energy boundary ladder: GPU, host, node, facility, CO2e",
        ),
        job_time=report_figure(
            "job_time", "2 Where energy goes", "Where each job's time went"
        ),
    log:
        "logs/figures.log",
    conda:
        "../envs/base.yaml"
    params:
        slo=config["serving"]["slo"],
    script:
        "../scripts/figures.py"


rule report_pages:
    input:
        summary="results/summary.csv",
        environment="results/environment.parquet",
        config="results/config.yaml",
        jobs="results/grid/jobs.tsv",
        skipped="results/grid/skipped.tsv",
    output:
        summary=report(
            "results/report/summary.html",
            caption="../report/summary_table.rst",
            category="5 Tables",
            labels={"figure": "Summary table (every grid point)"},
        ),
        environment=report(
            "results/report/environment.html",
            caption="../report/environment.rst",
            category="5 Tables",
            labels={"figure": "Environment and provenance"},
        ),
    log:
        "logs/report_pages.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/report_pages.py"


# The report's first screen: the sweep's answer (best valid configuration per batch size, valid
# and invalid counts with their reasons, the GPU setting banner). report/workflow.rst includes
# this fragment, so it opens the report before anything else.
rule headline:
    input:
        summary="results/summary.csv",
        energy="results/energy.parquet",
    output:
        headline=HEADLINE,
    log:
        "logs/headline.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/headline.py"


# The summary in the units other benchmarks publish: ML.ENERGY, AI Energy Score, MLCommons
# (energysweep.archive.exports; docs/exports.md says where each format comes from).
rule exports:
    input:
        summary="results/summary.csv",
        energy="results/energy.parquet",
    output:
        mlenergy="results/exports/mlenergy.csv",
        ai_energy_score="results/exports/ai_energy_score.csv",
        mlcommons="results/exports/mlcommons.csv",
    log:
        "logs/exports.log",
    conda:
        "../envs/base.yaml"
    params:
        measurement=config["measurement"],
    script:
        "../scripts/exports.py"

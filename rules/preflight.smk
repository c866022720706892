# Preflight (`snakemake preflight`, `make preflight`): can the sweep's nodes measure energy?
# One short job per node slot the largest layout needs, each with as many GPUs as a node of
# the sweep gets, then a one-screen verdict. Not part of `all`: run it before the reservation.


localrules:
    preflight,


rule preflight_node:
    output:
        "results/preflight/node~{slot}.json",
    log:
        "logs/preflight/node~{slot}.log",
    conda:
        "../envs/base.yaml"
    resources:
        gpu=get_preflight_gpus,
    params:
        require=config["measurement"]["require_energy"],
        max_idle_std_w=config["validity"]["max_idle_std_w"],
        throttle_reasons=config["validity"]["throttle_reasons"],
        device=config["measurement"]["device"],
        emulated=config["measurement"]["emulated"],
    script:
        "../scripts/preflight.py"


rule preflight:
    input:
        expand("results/preflight/node~{slot}.json", slot=get_preflight_slots()),
    output:
        "results/preflight/verdict.txt",
    log:
        "logs/preflight/verdict.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/preflight_verdict.py"

# The embedded default model: a tiny random Llama written as a normal HF checkpoint (no download).


rule build_tiny_model:
    output:
        directory("resources/models/{model}"),
    log:
        "logs/build_model/{model}.log",
    localrule: True
    conda:
        "../envs/pytorch.yaml"
    params:
        spec=get_tiny_spec,
    script:
        "../scripts/build_model.py"

# Figures, wrapped in report(...) so `snakemake --report results/report.html` includes them.


localrules:
    plot_energy_per_token,


rule plot_energy_per_token:
    input:
        "results/summary.csv",
    output:
        report(
            "results/plots/energy_per_token.png",
            caption="../report/energy_per_token.rst",
            category="Energy",
        ),
    log:
        "logs/plot_energy_per_token.log",
    conda:
        "../envs/base.yaml"
    script:
        "../scripts/plot.py"

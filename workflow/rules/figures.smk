rule lmd_figures:
    input:
        pairwise="results/lmd/pairwise.parquet",
        loo="results/lmd/loo.parquet",
    output:
        pairwise="results/figures/lmd_pairwise.png",
        loo="results/figures/lmd_loo.png",
    log:
        "results/logs/lmd_figures.log",
    shell:
        "python workflow/scripts/figures.py --pairwise {input.pairwise} --loo {input.loo}"
        " --pairwise-png {output.pairwise} --loo-png {output.loo} 2> {log}"

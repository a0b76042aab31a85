rule lmd_figures:
    input:
        pairwise="results/lmd/pairwise.parquet",
        loo="results/lmd/loo.parquet",
        selection="results/lmd/selection.parquet",
        similarity="results/lmd/similarity.parquet",
    output:
        "results/figures/lmd_pairwise.png",
        "results/figures/lmd_loo.png",
        "results/figures/lmd_selection.png",
        "results/figures/lmd_vs_cka.png",
    log:
        "results/logs/lmd_figures.log",
    shell:
        "python workflow/scripts/figures.py --pairwise {input.pairwise} --loo {input.loo}"
        " --selection {input.selection} --similarity {input.similarity} --out results/figures 2> {log}"

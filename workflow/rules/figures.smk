rule lmd_figures:
    input:
        code=code_deps("lmd_figures"),
        pairwise="results/lmd/pairwise.parquet",
        loo="results/lmd/loo.parquet",
        selection="results/lmd/selection.parquet",
        similarity="results/lmd/similarity.parquet",
        layers="results/lmd/layers.parquet",
    output:
        report("results/figures/lmd_pairwise.png", caption="../report/lmd_pairwise.rst", category="LMD"),
        report("results/figures/lmd_loo.png", caption="../report/lmd_loo.rst", category="LMD"),
        report("results/figures/lmd_selection.png", caption="../report/lmd_selection.rst", category="LMD"),
        report("results/figures/lmd_vs_cka.png", caption="../report/lmd_vs_cka.rst", category="Baselines"),
        report("results/figures/lmd_layers.png", caption="../report/lmd_layers.rst", category="LMD"),
        "results/tables/lmd_loo.csv",
    log:
        "results/logs/lmd_figures.log",
    benchmark:
        "results/logs/benchmark/lmd_figures.tsv",
    shell:
        "python workflow/scripts/figures.py --pairwise {input.pairwise} --loo {input.loo}"
        " --selection {input.selection} --similarity {input.similarity} --layers {input.layers} --out results/figures"
        " --loo-table results/tables/lmd_loo.csv 2> {log}"

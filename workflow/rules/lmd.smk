rule moments:
    input:
        embeddings=embedding_dirs,
        sequences="results/corpus/sequences.parquet",
    output:
        moments="results/lmd/moments.safetensors",
        blocks="results/lmd/block_moments.safetensors",
    params:
        models=MODELS,
        blocks=config["lmd"]["bootstrap_blocks"],
    threads: config["lmd"]["threads"]
    log:
        "results/logs/moments.log",
    shell:
        "python workflow/scripts/moments.py --params {PARAMS} --embeddings results/embeddings"
        " --sequences {input.sequences} --out {output.moments} --blocks {output.blocks} 2> {log}"


rule lmd_fit:
    input:
        moments="results/lmd/moments.safetensors",
        blocks="results/lmd/block_moments.safetensors",
    output:
        pairwise=report("results/lmd/pairwise.parquet", caption="../report/tables.rst", category="Tables"),
        loo=report("results/lmd/loo.parquet", caption="../report/tables.rst", category="Tables"),
        selection=report("results/lmd/selection.parquet", caption="../report/tables.rst", category="Tables"),
        metrics=report("results/lmd/metrics.json", caption="../report/tables.rst", category="Tables"),
    params:
        lmd=config["lmd"],
    threads: config["lmd"]["threads"]
    log:
        "results/logs/lmd_fit.log",
    shell:
        "python workflow/scripts/lmd_fit.py --params {PARAMS} --moments {input.moments} --blocks {input.blocks}"
        " --pairwise {output.pairwise} --loo {output.loo} --selection {output.selection}"
        " --metrics {output.metrics} 2> {log}"


rule similarity:
    input:
        embeddings=embedding_dirs,
        moments="results/lmd/moments.safetensors",
    output:
        "results/lmd/similarity.parquet",
    params:
        similarity=config["similarity"],
    threads: config["lmd"]["threads"]
    log:
        "results/logs/similarity.log",
    shell:
        "python workflow/scripts/similarity.py --params {PARAMS} --embeddings results/embeddings"
        " --moments {input.moments} --out {output} 2> {log}"

rule moments:
    input:
        embedding_dirs,
    output:
        "results/lmd/moments.safetensors",
    threads: config["lmd"]["threads"]
    log:
        "results/logs/moments.log",
    params:
        models=MODELS,
    shell:
        "python workflow/scripts/moments.py --params {PARAMS} --embeddings results/embeddings"
        " --out {output} 2> {log}"


rule lmd_fit:
    input:
        "results/lmd/moments.safetensors",
    output:
        pairwise="results/lmd/pairwise.parquet",
        loo="results/lmd/loo.parquet",
        metrics="results/lmd/metrics.json",
    params:
        lmd=config["lmd"],
    threads: config["lmd"]["threads"]
    log:
        "results/logs/lmd_fit.log",
    shell:
        "python workflow/scripts/lmd_fit.py --params {PARAMS} --moments {input}"
        " --pairwise {output.pairwise} --loo {output.loo} --metrics {output.metrics} 2> {log}"

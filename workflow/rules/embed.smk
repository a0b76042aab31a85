rule embed:
    input:
        code=code_deps("embed"),
        sequences="results/corpus/sequences.parquet",
        model="results/models/{model}",
    output:
        directory("results/embeddings/{model}"),
    params:
        values=stage_params("embed", bind={"key": lambda wc: wc.model}),
    wildcard_constraints:
        model="|".join(MODELS),
    priority: LMD_CHAIN_PRIORITY
    threads: max(1, config["embed"].get("threads", 1))
    log:
        "results/logs/embed/{model}.log",
    benchmark:
        "results/logs/benchmark/embed/{model}.tsv",
    shell:
        "python workflow/scripts/embed.py --params {PARAMS} --model {wildcards.model}"
        " --sequences {input.sequences} --record {input.model}/model.json --out {output} 2> {log}"

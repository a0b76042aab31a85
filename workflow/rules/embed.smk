rule embed:
    input:
        "results/corpus/sequences.parquet",
    output:
        directory("results/embeddings/{model}"),
    params:
        embed=config["embed"],
        model=lambda wc: next(m for m in config["models"] if m["name"] == wc.model),
    wildcard_constraints:
        model="|".join(MODELS),
    threads: max(1, config["embed"].get("threads", 1))
    log:
        "results/logs/embed/{model}.log",
    shell:
        "python workflow/scripts/embed.py --params {PARAMS} --model {wildcards.model}"
        " --sequences {input} --out {output} 2> {log}"

rule model:
    input:
        "results/corpus/sequences.parquet",
    output:
        directory("results/models/{model}"),
    params:
        model=lambda wc: model_spec(config, wc.model),
    wildcard_constraints:
        model="|".join(MODELS),
    threads: max(1, config["embed"].get("threads", 1))
    log:
        "results/logs/model/{model}.log",
    shell:
        "python workflow/scripts/model.py --params {PARAMS} --model {wildcards.model}"
        " --sequences {input} --out {output} 2> {log}"

rule model:
    input:
        code=code_deps("model"),
        sequences="results/corpus/sequences.parquet",
    output:
        model=directory("results/models/{model}"),
        metrics="results/metrics/models/{model}.json",
    params:
        values=stage_params("model", bind={"key": lambda wc: wc.model}),
    wildcard_constraints:
        model="|".join(MODELS),
    priority: LMD_CHAIN_PRIORITY
    threads: lambda wc: config["zoo"]["threads"] if "pretrain" in config["models"][wc.model] else 1
    log:
        "results/logs/model/{model}.log",
    benchmark:
        "results/logs/benchmark/model/{model}.tsv",
    shell:
        "python workflow/scripts/model.py --params {PARAMS} --model {wildcards.model}"
        " --sequences {input.sequences} --out {output.model} --metrics {output.metrics} 2> {log}"

rule mpo:
    input:
        code=code_deps("mpo"),
        sequences="results/corpus/sequences.parquet",
        model="results/models/{model}",
    output:
        directory("results/mpo/{model}"),
    params:
        values=stage_params("mpo", bind={"item": lambda wc: wc.model}),
    wildcard_constraints:
        model="|".join(MODELS),
    threads: max(1, config["embed"].get("threads", 1))
    log:
        "results/logs/mpo/{model}.log",
    benchmark:
        "results/logs/benchmark/mpo/{model}.tsv",
    shell:
        "python workflow/scripts/mpo.py --params {PARAMS} --model {wildcards.model}"
        " --sequences {input.sequences} --out {output} 2> {log}"


rule mpo_figure:
    input:
        code=code_deps("mpo_figure"),
        mpo=expand("results/mpo/{model}", model=config["mpo"]["models"]),
    output:
        report("results/figures/mpo_tradeoff.png", caption="../report/mpo_tradeoff.rst", category="MPO"),
    params:
        values=stage_params("mpo_figure"),
    log:
        "results/logs/mpo_figure.log",
    benchmark:
        "results/logs/benchmark/mpo_figure.tsv",
    shell:
        "python workflow/scripts/mpo_figure.py --params {PARAMS} --mpo results/mpo --out {output} 2> {log}"

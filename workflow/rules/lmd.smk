if SHARD_PARTS is None:

    rule moments:
        input:
            code=code_deps("moments"),
            embeddings=embedding_dirs,
            sequences="results/corpus/sequences.parquet",
        output:
            moments="results/lmd/moments.safetensors",
            blocks="results/lmd/block_moments.safetensors",
        params:
            values=stage_params("moments", {"models": lambda wc: MODELS}),
        priority: LMD_CHAIN_PRIORITY
        threads: config["lmd"]["threads"]
        log:
            "results/logs/moments.log",
        benchmark:
            "results/logs/benchmark/moments.tsv",
        shell:
            "python workflow/scripts/moments.py --params {PARAMS} --embeddings results/embeddings"
            " --sequences {input.sequences} --out {output.moments} --blocks {output.blocks} 2> {log}"

else:
    # lmd.shards_per_job: the pass over the shards as parallel jobs (one per group of shards,
    # spread over the nodes of a cluster), then a reduce that writes the same bytes as one pass.

    rule moments_part:
        input:
            code=code_deps("moments"),
            embeddings=embedding_dirs,
            sequences="results/corpus/sequences.parquet",
        output:
            temp("results/lmd/parts/part-{part}.safetensors"),
        params:
            values=stage_params("moments", {"models": lambda wc: MODELS}),
        wildcard_constraints:
            part=r"\d+",
        priority: LMD_CHAIN_PRIORITY
        threads: config["lmd"]["threads"]
        log:
            "results/logs/moments/part-{part}.log",
        benchmark:
            "results/logs/benchmark/moments/part-{part}.tsv",
        shell:
            "python workflow/scripts/moments.py --params {PARAMS} --embeddings results/embeddings"
            " --sequences {input.sequences} --part {wildcards.part} --out {output} 2> {log}"

    rule moments:
        input:
            code=code_deps("moments"),
            parts=expand("results/lmd/parts/part-{part}.safetensors", part=range(SHARD_PARTS)),
            sequences="results/corpus/sequences.parquet",
        output:
            moments="results/lmd/moments.safetensors",
            blocks="results/lmd/block_moments.safetensors",
        params:
            values=stage_params("moments", {"models": lambda wc: MODELS}),
        priority: LMD_CHAIN_PRIORITY
        threads: 1
        log:
            "results/logs/moments.log",
        benchmark:
            "results/logs/benchmark/moments.tsv",
        shell:
            "python workflow/scripts/moments.py --params {PARAMS} --embeddings results/embeddings"
            " --sequences {input.sequences} --reduce {input.parts} --out {output.moments}"
            " --blocks {output.blocks} 2> {log}"


rule lmd_fit:
    input:
        code=code_deps("lmd_fit"),
        moments="results/lmd/moments.safetensors",
        blocks="results/lmd/block_moments.safetensors",
    output:
        pairwise=report("results/lmd/pairwise.parquet", caption="../report/tables.rst", category="Tables"),
        loo=report("results/lmd/loo.parquet", caption="../report/tables.rst", category="Tables"),
        selection=report("results/lmd/selection.parquet", caption="../report/tables.rst", category="Tables"),
        metrics=report("results/lmd/metrics.json", caption="../report/tables.rst", category="Tables"),
    params:
        values=stage_params("lmd_fit"),
    priority: LMD_CHAIN_PRIORITY
    threads: config["lmd"]["threads"]
    log:
        "results/logs/lmd_fit.log",
    benchmark:
        "results/logs/benchmark/lmd_fit.tsv",
    shell:
        "python workflow/scripts/lmd_fit.py --params {PARAMS} --moments {input.moments} --blocks {input.blocks}"
        " --pairwise {output.pairwise} --loo {output.loo} --selection {output.selection}"
        " --metrics {output.metrics} 2> {log}"


rule similarity:
    input:
        code=code_deps("similarity"),
        embeddings=embedding_dirs,
        moments="results/lmd/moments.safetensors",
    output:
        "results/lmd/similarity.parquet",
    params:
        values=stage_params("similarity", {"models": lambda wc: MODELS}),
    priority: LMD_CHAIN_PRIORITY
    threads: config["lmd"]["threads"]
    log:
        "results/logs/similarity.log",
    benchmark:
        "results/logs/benchmark/similarity.tsv",
    shell:
        "python workflow/scripts/similarity.py --params {PARAMS} --embeddings results/embeddings"
        " --moments {input.moments} --out {output} 2> {log}"


rule lmd_layers:
    input:
        code=code_deps("lmd_layers"),
        embeddings=embedding_dirs,
        sequences="results/corpus/sequences.parquet",
    output:
        report("results/lmd/layers.parquet", caption="../report/tables.rst", category="Tables"),
    params:
        values=stage_params("lmd_layers", {"models": lambda wc: MODELS}),
    priority: LMD_CHAIN_PRIORITY
    threads: config["lmd"]["threads"]
    log:
        "results/logs/lmd_layers.log",
    benchmark:
        "results/logs/benchmark/lmd_layers.tsv",
    shell:
        "python workflow/scripts/lmd_layers.py --params {PARAMS} --embeddings results/embeddings"
        " --sequences {input.sequences} --out {output} 2> {log}"

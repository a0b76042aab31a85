rule corpus:
    input:
        code=code_deps("corpus"),
    output:
        "results/corpus/sequences.parquet",
    params:
        values=stage_params("corpus"),
    log:
        "results/logs/corpus.log",
    benchmark:
        "results/logs/benchmark/corpus.tsv",
    shell:
        "python workflow/scripts/corpus.py --params {PARAMS} --out {output} 2> {log}"

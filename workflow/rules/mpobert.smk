# MPOBERT and fine-tuning: variants of one base model, fine-tuned on labelled tasks.


rule variant:
    input:
        code=code_deps("variant"),
        sequences="results/corpus/sequences.parquet",
        base=f"results/models/{config['mpobert']['base']}",
    output:
        directory("results/variants/{variant}"),
    params:
        values=stage_params("variant"),
    wildcard_constraints:
        variant="|".join(config["mpobert"]["variants"]),
    priority: VARIANT_PRIORITY
    threads: config["mpobert"]["threads"]
    log:
        "results/logs/variant/{variant}.log",
    benchmark:
        "results/logs/benchmark/variant/{variant}.tsv",
    shell:
        "python workflow/scripts/variant.py --params {PARAMS} --variant {wildcards.variant}"
        " --sequences {input.sequences} --out {output} 2> {log}"


rule task:
    input:
        code=code_deps("task"),
    output:
        table="results/tasks/{task}.parquet",
        record="results/tasks/{task}.json",
    params:
        values=stage_params("task", {"finetune.tasks": lambda wc: [TASK_SPECS[wc.task]]}),
    wildcard_constraints:
        task="|".join(TASKS),
    log:
        "results/logs/task/{task}.log",
    benchmark:
        "results/logs/benchmark/task/{task}.tsv",
    shell:
        "python workflow/scripts/task.py --params {PARAMS} --task {wildcards.task}"
        " --out {output.table} --record {output.record} 2> {log}"


rule finetune:
    input:
        code=code_deps("finetune"),
        task="results/tasks/{task}.parquet",
        record="results/tasks/{task}.json",
        model=lambda wc: f"results/variants/{FINETUNE[wc.variant]['model']}",
    output:
        metrics="results/finetune/{task}/{variant}/metrics.json",
        predictions="results/finetune/{task}/{variant}/predictions.parquet",
    params:
        values=stage_params("finetune", {"finetune.tasks": lambda wc: [TASK_SPECS[wc.task]],
                                         "finetune.variants": lambda wc: [FINETUNE[wc.variant]]}),
    wildcard_constraints:
        task="|".join(TASKS),
        variant="|".join(FINETUNE),
    threads: config["finetune"]["threads"]
    log:
        "results/logs/finetune/{task}/{variant}.log",
    benchmark:
        "results/logs/benchmark/finetune/{task}/{variant}.tsv",
    shell:
        "python workflow/scripts/finetune.py --params {PARAMS} --variant {wildcards.variant}"
        " --task {input.task} --record {input.record} --model {input.model}"
        " --out {output.metrics} --predictions {output.predictions} 2> {log}"


rule finetune_summary:
    input:
        code=code_deps("finetune_summary"),
        metrics=expand("results/finetune/{task}/{variant}/metrics.json", task=TASKS, variant=FINETUNE),
        predictions=expand("results/finetune/{task}/{variant}/predictions.parquet", task=TASKS, variant=FINETUNE),
    output:
        table=report("results/tables/finetune.csv", caption="../report/finetune_table.rst", category="MPOBERT"),
        headline=report("results/tables/finetune_headline.csv", caption="../report/finetune_headline.rst", category="MPOBERT"),
        figure=report("results/figures/finetune_tradeoff.png", caption="../report/finetune_tradeoff.rst", category="MPOBERT"),
    params:
        values=stage_params("finetune_summary"),
    log:
        "results/logs/finetune_summary.log",
    benchmark:
        "results/logs/benchmark/finetune_summary.tsv",
    shell:
        "python workflow/scripts/finetune_summary.py --params {PARAMS} --finetune results/finetune --table {output.table}"
        " --headline {output.headline}"
        " --figure {output.figure} 2> {log}"

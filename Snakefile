# lmdecomp: Language Model Decomposition and MPO, as one reproducible DAG.
# Usage: snakemake --cores all [--configfile config/smoke.yaml]
from snakemake.utils import min_version

min_version("9.0")


configfile: "params.yaml"


report: "workflow/report/workflow.rst"


# common.smk checks the config (schema and cross-key rules, naming each broken key) first.
include: "workflow/rules/common.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/embed.smk"
include: "workflow/rules/lmd.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/mpo.smk"
include: "workflow/rules/mpobert.smk"


rule all:
    input:
        "results/lmd/metrics.json",
        rules.lmd_figures.output,
        rules.mpo_figure.output,
        rules.finetune_summary.output,
        expand("results/metrics/models/{model}.json", model=MODELS),


# The LMD results alone, without the MPO stages: `snakemake lmd_results` (config/real.yaml's target).
rule lmd_results:
    input:
        "results/lmd/metrics.json",
        rules.lmd_figures.output,
        expand("results/metrics/models/{model}.json", model=MODELS),

# Small helpers that compute rule inputs and arguments from the config.
import json
import shlex
from pathlib import Path

from lmdecomp.params import bind_param_keys, dvc_stages, load_params, restrict_params, stage_param_keys


def config_files():
    """params.yaml plus any --configfile, in Snakemake's merge order; relative to the working
    folder where they lie inside it, so job commands do not change when the checkout moves."""
    here = Path.cwd().resolve()

    def shown(path):
        path = Path(path).resolve()
        return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)

    return ["params.yaml", *[shown(f) for f in workflow.overwrite_configfiles if shown(f) != "params.yaml"]]


# The scripts re-read the config files themselves (as they do under DVC), so values
# given with --config on the command line would not reach them: refuse those.
if workflow.config_settings.config:
    raise WorkflowError(
        "--config overrides are not passed to the job scripts; put the values in a YAML file "
        "and give it with --configfile (it is merged on top of params.yaml)"
    )
# The config the scripts see: load_params validates the files against the schema and the
# cross-key rules (lmdecomp.params), and merges them as Snakemake does except that an
# overlay's models: replaces the earlier ones instead of adding to them.
_params = load_params(config_files())
config.clear()
config.update(_params)


def check_dataset_sources(params):
    """Every `dataset:` corpus source and task, checked before any job runs: the revision always;
    the config, splits, columns and label type wherever the dataset is at hand without the network
    (a local folder, or a hub revision already in the cache). The jobs check the rest before they write."""
    sources = [s for s in params["corpus"]["sources"] if "dataset" in s]
    tasks = [t for t in params["finetune"]["tasks"] if "dataset" in t]
    if not sources and not tasks:
        return
    from lmdecomp.data.corpus import check_dataset_source
    from lmdecomp.data.tasks import check_dataset_task

    problems = []

    def attempt(check, *args):
        try:
            check(*args, download=False)
        except ValueError as err:
            problems.append(f"  {err}")

    for spec in sources:
        attempt(check_dataset_source, spec)
    for spec in tasks:
        attempt(check_dataset_task, spec["name"], spec)
    if problems:
        raise WorkflowError("dataset sources:\n" + "\n".join(problems))


check_dataset_sources(_params)

PARAMS = " ".join(shlex.quote(f) for f in config_files())  # a config path may hold spaces
MODELS = list(config["models"])
TASK_SPECS = {t["name"]: t for t in config["finetune"]["tasks"]}
TASKS = list(TASK_SPECS)
FINETUNE = {v["name"]: v for v in config["finetune"]["variants"]}  # names unique, models built: check_params


# lmd.shards_per_job: how many moments_part jobs split the pass over the embedding shards.
_per_job = config["lmd"].get("shards_per_job")
_n_shards = -(-config["corpus"]["n_sequences"] // config["embed"]["shard_rows"])
SHARD_PARTS = -(-_n_shards // _per_job) if _per_job else None


_DVC_STAGES = dvc_stages(Path(workflow.basedir) / "dvc.yaml")


def code_deps(stage):
    """The job script and library modules that dvc.yaml lists for ``stage``: a job reruns when
    its code changes, under Snakemake as under DVC, from one list the two engines share."""
    spec = _DVC_STAGES[stage]
    return [d for d in spec.get("do", spec)["deps"] if not d.startswith("results/")]


def stage_params(stage, narrowed=None, bind=None):
    """A rule's params: the params.yaml values dvc.yaml lists for ``stage``, so Snakemake reruns a
    job when one changes, as DVC does. They are the only values the stage's script can read
    (lmdecomp.params.load_stage_params), so a job cannot go stale on an unlisted key.

    ``bind`` gives, as functions of the wildcards, the foreach element of a job for keys that
    dvc.yaml writes with it (``models.${key}``: {"key": lambda wc: wc.model}), so editing one
    model reruns only its own jobs. ``narrowed`` maps a listed (dotted) key to a function of the
    wildcards giving the part of it one job reads (one task; the model names only)."""
    keys = stage_param_keys(stage, Path(workflow.basedir) / "dvc.yaml")
    narrowed, bind = narrowed or {}, bind or {}
    unknown = set(narrowed) - set(keys)
    if unknown:
        raise WorkflowError(f"stage_params({stage!r}) narrows {sorted(unknown)}, which dvc.yaml does not list")

    def values(wildcards):
        bound = bind_param_keys(keys, config, stage, **{name: f(wildcards) for name, f in bind.items()})
        listed = json.loads(json.dumps(restrict_params(config, bound, stage)))  # plain dicts
        for key, part in narrowed.items():
            *parents, leaf = key.split(".")
            target = listed
            for name in parents:
                target = target[name]
            target[leaf] = part(wildcards)
        return listed

    return values


def embedding_dirs(wildcards=None):
    return expand("results/embeddings/{model}", model=MODELS)


# Job order on few cores: the LMD chain (model → embed → moments/lmd_layers → lmd_fit) starts
# first whenever a core is free, then the MPOBERT variants (up to a minute each), and the
# fine-tuning jobs, many and short, fill the cores last, so the run does not end on one long
# job with a core idle (docs/performance.md, the job timeline).
LMD_CHAIN_PRIORITY = 10
VARIANT_PRIORITY = 5

"""Snakemake's DAG and dvc.yaml describe the same jobs: equal commands, equal outputs, and the
same inputs, data and code (DVC may name a folder where Snakemake names the files inside it);
and every stage depends on the library modules its script imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from lmdecomp.params import load_params
from test_workflow import copy_repo, run

pytestmark = pytest.mark.integration


def snakemake_jobs(work: Path) -> dict[str, tuple[set[str], set[str]]]:
    """{command: (inputs, outputs)} from a forced dry run; the log redirection is Snakemake's own."""
    text = run(["snakemake", "-n", "-p", "--forceall", "--cores", "1"], work).stdout
    jobs = {}
    for block in text.split("\nrule ")[1:]:
        fields = dict(re.findall(r"^    (input|output): (.*)$", block, flags=re.M))
        command = re.search(r"^Shell command: (.*)$", block, flags=re.M)
        if command is None or command.group(1) == "None":  # rule all
            continue
        cmd = " ".join(re.sub(r" 2> \S+$", "", command.group(1)).split())
        split = lambda key: {p.strip() for p in fields.get(key, "").split(",") if p.strip()}  # noqa: E731
        jobs[cmd] = (split("input"), split("output"))
    return jobs


def dvc_stages(work: Path) -> dict[str, tuple[set[str], set[str]]]:
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    stages = {}
    with Repo(str(work)) as repo:
        for stage in repo.index.stages:
            deps = {d.def_path for d in stage.deps if not isinstance(d, ParamsDependency)}
            stages[" ".join(stage.cmd.split())] = (deps, {o.def_path for o in stage.outs})
    return stages


def covered(path: str, by: set[str]) -> bool:
    return any(path == other or path.startswith(other.rstrip("/") + "/") for other in by)


@pytest.mark.parametrize("overlay", [None, "config/smoke.yaml"])
def test_snakemake_and_dvc_run_the_same_jobs(repo_root, tmp_path, overlay):
    work = copy_repo(repo_root, tmp_path)
    if overlay:  # DVC reads params.yaml only, so the overlay is merged into it for both engines
        merged = load_params([repo_root / "params.yaml", repo_root / overlay])
        (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    snake, dvc = snakemake_jobs(work), dvc_stages(work)
    assert set(snake) == set(dvc)
    for cmd, (snake_in, snake_out) in snake.items():
        dvc_in, dvc_out = dvc[cmd]
        assert snake_out == dvc_out, cmd
        assert all(covered(p, dvc_in) for p in snake_in), cmd
        assert all(any(covered(p, {d}) for p in snake_in) for d in dvc_in), cmd


# Modules whose changes cannot change a result: atomic file writes and config loading, and the
# packages' __init__ files (their imports are followed; the top-level one only imports lazily,
# for the public API). Every other lmdecomp module a job script reaches must be a dependency of
# its stage.
PLUMBING = {"src/lmdecomp/atomic.py", "src/lmdecomp/params.py"}


def module_file(dotted: str, src: Path) -> Path | None:
    """The file of module ``lmdecomp.a.b`` (a package's __init__.py), or None if it is no module."""
    parts = dotted.split(".")[1:]
    base = src.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return base / "__init__.py" if (base / "__init__.py").is_file() else None


def lmdecomp_imports(path: Path, src: Path) -> set[Path]:
    """lmdecomp module files that ``path`` imports anywhere in its body (lazy imports included),
    with the __init__.py of every package on the way (Python runs them first)."""
    package = None
    if path.is_relative_to(src):
        rel = path.relative_to(src.parent).with_suffix("")
        package = ".".join(rel.parts[:-1]) if rel.name != "__init__" else ".".join(rel.parts)
    dotted = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module == "lmdecomp" or module.startswith("lmdecomp."):
                dotted.add(module)
                dotted |= {f"{module}.{a.name}" for a in node.names}  # a submodule, if it is one
        elif isinstance(node, ast.Import):
            dotted |= {a.name for a in node.names if a.name.startswith("lmdecomp.")}
    found = set()
    for module in dotted:
        parts = module.split(".")
        for k in range(2, len(parts) + 1):  # the packages on the way, then the module itself
            file = module_file(".".join(parts[:k]), src)
            if file is not None:
                found.add(file)
    return found


def test_every_stage_depends_on_the_library_code_its_script_imports(repo_root):
    src = repo_root / "src" / "lmdecomp"
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert len(stages) >= 14
    for name, spec in stages.items():
        deps = set(spec.get("do", spec)["deps"])
        scripts = [d for d in deps if d.startswith("workflow/scripts/")]
        assert len(scripts) == 1, name
        todo, reached = list(lmdecomp_imports(repo_root / scripts[0], src)), set()
        while todo:
            module = todo.pop()
            if module not in reached:
                reached.add(module)
                todo += lmdecomp_imports(module, src)
        needed = {str(m.relative_to(repo_root)) for m in reached if m.name != "__init__.py"} - PLUMBING
        listed = {d for d in deps if d.startswith("src/")}
        assert needed <= listed, f"dvc.yaml stage {name}: add {sorted(needed - listed)} to its deps"
        assert listed <= needed | PLUMBING, f"dvc.yaml stage {name}: {sorted(listed - needed)} is not imported"

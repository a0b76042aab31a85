"""The house rules of docs/architecture.md, checked on the source: imports go one way between
the subpackages (lmd and mpo never import each other), no import cycles between modules, and
modules and functions stay short enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "lmdecomp"

# What each part of the package may import, besides itself (docs/architecture.md).
ALLOWED = {
    "atomic": set(),
    "params": set(),
    "plots": {"atomic"},
    "data": {"atomic", "params"},
    "models": {"data", "atomic", "params"},
    "lmd": {"data", "atomic", "params"},
    "mpo": {"models", "data", "atomic", "params"},
    "api": {"lmd"},
}
MAX_MODULE_LINES = 620  # "about 600"
MAX_FUNCTION_LINES = 80
LONG_MARK = "# long:"  # a comment on the def line or just above it that says why a function is longer


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(path: Path, known: set[str]) -> set[str]:
    """lmdecomp modules ``path`` imports, lazily or not, outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("lmdecomp"):
            continue
        if node.level:
            raise AssertionError(f"{path}: relative import; the package uses absolute imports")
        candidates = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found |= {c for c in candidates if c in known and c != "lmdecomp"}
    return found


def part_of(module: str) -> str:
    return module.split(".")[1]


def test_subpackages_import_only_downwards_and_the_two_halves_never_each_other():
    mods = modules()
    known = set(mods)
    for name, path in mods.items():
        if name == "lmdecomp":  # the lazy public API
            continue
        for target in imports_of(path, known):
            if part_of(target) != part_of(name):
                assert part_of(target) in ALLOWED[part_of(name)], f"{name} imports {target} (docs/architecture.md)"


def test_no_import_cycles_between_modules():
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(path, known) - {"lmdecomp"} for name, path in mods.items() if name != "lmdecomp"}
    # a package imports its own modules (re-exports): edges from a package to its children are
    # the package's __init__, so only module → module edges can close a cycle
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " → ".join([*stack, node, nxt]))
            if nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_modules_and_functions_stay_short(path):
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_MODULE_LINES, f"{path.name} has {len(lines)} lines: split it by concept"
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            said_why = any(LONG_MARK in lines[i] for i in range(max(0, first - 3), node.lineno))
            assert length <= MAX_FUNCTION_LINES or said_why, (
                f"{path.name}:{node.lineno} {node.name} has {length} lines: split it, or say why in a "
                f"'{LONG_MARK}' comment above it")

"""The package's import structure, read with ``ast`` (nothing is imported).

- no import cycles among modules (module-level imports);
- no library module imports ``autoconfig.cli``;
- no ``autoconfig/cli/*_cmd.py`` imports another ``*_cmd.py`` (shared options
  live in ``autoconfig/cli/*opts*.py`` / ``options.py``);
- only ``autoconfig/profiling/*worker*.py`` imports torch or megatron at
  module level (the CLI, search and reports start fast and install light);
- no upward imports: infrastructure (errors, units, paths, yamlio, atomic,
  heuristics, any other top-level module) < core < base < training, inference
  < validation, reports < profiling < sweep < cli; an import goes down, or sideways within its own package.
  (``launch`` and ``sweep`` live inside ``profiling``, which is one layer.)

A known violation in a file this change may not edit is listed in KNOWN with
a reason: its test is a strict xfail, so fixing it turns the suite red until
the entry is removed.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autoconfig"

INFRA = {"errors", "units", "paths", "yamlio", "atomic", "heuristics"}
LAYERS = {"core": 1, "base": 2, "training": 3, "inference": 3.5, "validation": 4, "reports": 4,
          "launch": 3.8, "profiling": 5, "sweep": 6, "cli": 7}
"""Packages by layer. Inference sits just above training: it serves models with the
GEMM efficiencies and memory terms training calibrated, and training never imports
it. ``launch`` renders a plan into other tools' inputs, which ``reports`` writes; ``sweep`` runs many
searches and profiles. A top-level single-file module is infrastructure (layer 0)."""
HEAVY = ("torch", "megatron")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


FILES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The autoconfig module ``name`` refers to (a module or its package)."""
    while name and name not in FILES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, top_level_only: bool) -> list[tuple[str, int]]:
    """(imported name, line) for every import of ``module``; with
    ``top_level_only`` the ones run at import time (not inside a function)."""
    tree = ast.parse(FILES[module].read_text(), filename=str(FILES[module]))
    found = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and not (in_function and
                                                                        top_level_only):
                if isinstance(child, ast.Import):
                    found.extend((alias.name, child.lineno) for alias in child.names)
                else:
                    base = child.module or ""
                    if child.level:   # relative
                        package = module if FILES[module].name == "__init__.py" else \
                            module.rpartition(".")[0]
                        for _ in range(child.level - 1):
                            package = package.rpartition(".")[0]
                        base = f"{package}.{base}".rstrip(".")
                    for alias in child.names:
                        full = f"{base}.{alias.name}"
                        found.append((full if full in FILES else base, child.lineno))
            visit(child, inner)

    visit(tree, False)
    return found


def _internal(module: str, top_level_only: bool) -> set[str]:
    return {target for name, _ in _imports(module, top_level_only)
            if name.split(".")[0] == "autoconfig" and (target := _resolve(name)) and target != module}


def _layer(module: str) -> tuple[int, str]:
    """(layer, package) of a module."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in INFRA or (len(parts) == 2 and module in FILES and
                                                FILES[module].name != "__init__.py"):
        return (0, "") if module != "autoconfig.__main__" else (LAYERS["cli"], "cli")
    if parts[1] == "__main__":
        return LAYERS["cli"], "cli"
    return LAYERS[parts[1]], parts[1]


def _cycles() -> list[tuple[str, ...]]:
    graph = {m: _internal(m, True) for m in FILES}
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    graph = {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in graph.items()}
    cycles, state, stack = [], {}, []

    def dfs(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(tuple(stack[stack.index(nxt):]))
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    return cycles


def violations() -> dict[str, list[str]]:
    found = {"cycle": [" -> ".join(c) for c in _cycles()], "library imports cli": [],
             "command imports command": [], "heavy import": [], "upward import": []}
    for module, path in FILES.items():
        is_cli = module.startswith("autoconfig.cli") or module == "autoconfig.__main__"
        for target in sorted(_internal(module, False)):
            if not is_cli and target.startswith("autoconfig.cli"):
                found["library imports cli"].append(f"{module} -> {target}")
            if (path.parent.name == "cli" and path.name.endswith("_cmd.py")
                    and target.startswith("autoconfig.cli.") and target.endswith("_cmd")):
                found["command imports command"].append(f"{module} -> {target}")
            (mine, package), (theirs, their_package) = _layer(module), _layer(target)
            if theirs > mine or (theirs == mine and package != their_package):
                found["upward import"].append(f"{module} -> {target}")
        if not (module.startswith("autoconfig.profiling.") and "worker" in path.name):
            for name, line in _imports(module, True):
                if name.split(".")[0] in HEAVY:
                    found["heavy import"].append(f"{module}:{line} imports {name}")
    return found


KNOWN: dict[tuple[str, str], str] = {}
"""(rule, violation) -> reason, for violations in code this change does not own.
(The two command -> command imports of capacity_cmd and estimate_cmd were
fixed on main by cli/options.py.)"""


def _current() -> set[tuple[str, str]]:
    return {(rule, item) for rule, items in violations().items() for item in items}


@pytest.mark.parametrize("rule", ["cycle", "library imports cli", "command imports command",
                                  "heavy import", "upward import"])
def test_rule_holds(rule):
    broken = sorted(item for r, item in _current() - set(KNOWN) if r == rule)
    assert not broken, f"{rule}:\n" + "\n".join(broken)


@pytest.mark.parametrize("known", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=r),
                                                   id=k[1]) for k, r in sorted(KNOWN.items())])
def test_known_violation_is_fixed(known):
    """Strict xfail while the violation is there; once fixed, remove it from KNOWN."""
    assert known not in _current()


def test_the_walk_sees_the_package():
    assert "autoconfig.profiling.worker" in FILES and "autoconfig.cli.search_cmd" in FILES
    assert "autoconfig.core.plan" in _internal("autoconfig.profiling.store", True)

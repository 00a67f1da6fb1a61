"""The package layout's rules (DESIGN "Layout", STYLE 20): imports run schemas -> tasks -> flows ->
serve, no ctxlake module imports itself back through a cycle, and the query faces start without
Prefect or lancedb. The graph is read from the source files, module-level imports only."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Where each installed subpackage's source lives (pyproject's package-dir).
FOLDERS = {"ctxlake": "ctxlake", "ctxlake.schemas": "schemas", "ctxlake.tasks": "tasks",
           "ctxlake.flows": "flows", "ctxlake.serve": "serve"}
LAYERS = {"ctxlake.schemas": 0, "ctxlake.tasks": 1, "ctxlake.flows": 2, "ctxlake.serve": 3}


def source_modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        base = ROOT / folder
        files = base.glob("*.py") if package == "ctxlake" else base.rglob("*.py")
        for path in files:
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: top level, and inside top-level try/if
    blocks (not `if TYPE_CHECKING:`); never those inside functions or classes."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)
    return found


def _with_parents(name: str, known: dict[str, Path]) -> set[str]:
    """Importing a.b.c runs a, a.b and a.b.c."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known.keys()


def _every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Module-level and function-level imports alike (not `if TYPE_CHECKING:` ones)."""
    skip = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for inner in ast.walk(node)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skip]


def import_graph(*, function_level: bool = False) -> dict[str, set[str]]:
    known = source_modules()
    collect = _every_import if function_level else _module_level_imports
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in collect(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets |= _with_parents(alias.name, known)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets |= _with_parents(base, known)
            for alias in node.names:  # `from pkg import submodule`
                targets |= {f"{base}.{alias.name}"} & known.keys()
        targets.discard(name)
        # A package's own __init__ runs before its submodules: not an edge that makes a cycle.
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    return graph


def layer(name: str) -> int:
    for package, rank in LAYERS.items():
        if name == package or name.startswith(package + "."):
            return rank
    return -1  # ctxlake itself (errors, version): below every layer


def test_the_graph_sees_the_known_edges() -> None:
    # Guards the parser: without these edges the checks below would pass on an empty graph.
    graph = import_graph()
    assert "ctxlake.serve.api.query_terms" in graph["ctxlake.serve.api.ranking"]
    assert "ctxlake.serve.mcp.base" in graph["ctxlake.serve.mcp.tools"]
    assert "ctxlake.errors" in graph["ctxlake.tasks.lake"]


def test_every_module_imports() -> None:
    for name in sorted(source_modules()):
        importlib.import_module(name)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return cycles


def test_no_import_cycles_among_ctxlake_modules() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_back_from_its_importer_even_inside_a_function() -> None:
    # STYLE 20: function-level imports are for cost, not for dodging a cycle (cli <-> cli_* was one).
    cycles = find_cycles(import_graph(function_level=True))
    assert not cycles, "import cycles through function-level imports: " + "; ".join(
        " -> ".join(c) for c in cycles)


def test_imports_run_schemas_then_tasks_then_flows_then_serve() -> None:
    backwards = [f"{src} -> {dst}" for src, targets in import_graph().items() for dst in targets
                 if layer(dst) > layer(src)]
    assert not backwards, "module-level imports against the layer order: " + ", ".join(sorted(backwards))


def test_serve_never_imports_flows_at_module_level() -> None:
    found = [f"{src} -> {dst}" for src, targets in import_graph().items() for dst in targets
             if layer(src) == 3 and layer(dst) == 2]
    assert not found, ", ".join(found)


@pytest.mark.parametrize("module", ["ctxlake.serve.cli.app", "ctxlake.serve.mcp.server",
                                    "ctxlake.serve.api.code_search", "ctxlake.serve.api.index_status"])
def test_the_query_faces_import_without_prefect_or_lancedb(module: str) -> None:
    # A fresh interpreter: this one has imported every module above.
    code = (f"import sys, {module}; "
            "print(' '.join(m for m in ('prefect', 'lancedb', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.strip() == ""


# The same name with the same value in two modules is one rule written twice, which drifts apart
# (STYLE 19): define it once and import it.


def test_a_module_constant_is_defined_once_and_imported_elsewhere() -> None:
    where: dict[tuple[str, str], list[str]] = {}
    for module, path in source_modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            name = node.targets[0].id
            typevar = isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in ("TypeVar", "ParamSpec")
            if name.isupper() and not typevar:
                where.setdefault((name, ast.unparse(node.value)), []).append(module)
    twice = {f"{name} = {value}": modules for (name, value), modules in where.items()
             if len(modules) > 1}
    assert not twice, twice


# STYLE 12: modules of 100-600 lines, named for what they do. The long end is the one a reader
# pays for (a 900-line module mixes what could be read apart); short ones are left to judgment.
MAX_MODULE_LINES = 600


def test_no_module_is_longer_than_six_hundred_lines() -> None:
    long = {module: lines for module, path in source_modules().items()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by what the parts do): {long}"

"""Graph stage: definitions, call sites and imports from real tree-sitter parses, per language."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import cast

import pyarrow as pa
import pytest

from ctxlake.schemas.tables import DEFINITIONS, IMPORTS, REFERENCES
from ctxlake.tasks.chunk import chunk_text
from ctxlake.tasks.graph import graph_files, graph_rows

# One small file per language: `compute` is defined once and called on the lines marked CALL;
# `other` is a decoy with a similar role that must not be counted.
FIXTURES: dict[str, tuple[str, str]] = {
    "python": (
        "pkg/m.py",
        "import os\n"
        "def compute(x):\n"
        "    return x\n"
        "def other():\n"
        "    return compute(1)  # CALL\n"
        "class K:\n"
        "    def run(self):\n"
        "        return self.compute2() + compute(2)  # CALL\n",
    ),
    "javascript": (
        "src/m.js",
        'import { z } from "./z";\n'
        "function compute(x) { return x; }\n"
        "function other() { return compute(1); } // CALL\n"
        "class K { run() { return compute(2) + this.other2(); } } // CALL\n",
    ),
    "typescript": (
        "src/m.ts",
        'import { z } from "./z";\n'
        "function compute(x: number): number { return x; }\n"
        "const other = (): number => compute(1); // CALL\n"
        "class K { run(): number { return compute(2); } } // CALL\n",
    ),
    "go": (
        "m.go",
        'package m\nimport "fmt"\n'
        "func compute(x int) int { return x }\n"
        "func other() int { return compute(1) } // CALL\n"
        "type K struct{}\n"
        "func (k K) Run() int { fmt.Println(1); return compute(2) } // CALL\n",
    ),
    "rust": (
        "src/m.rs",
        "use std::fmt;\n"
        "fn compute(x: i32) -> i32 { x }\n"
        "fn other() -> i32 { compute(1) } // CALL\n"
        "struct K;\n"
        "impl K { fn run(&self) -> i32 { compute(2) } } // CALL\n",
    ),
    "java": (
        "M.java",
        "import java.util.List;\n"
        "class M {\n"
        "  static int compute(int x) { return x; }\n"
        "  int other() { return compute(1); } // CALL\n"
        "  int run() { return M.compute(2); } // CALL\n"
        "}\n",
    ),
    "c": (
        "m.c",
        '#include "m.h"\n'
        "int compute(int x) { return x; }\n"
        "int other(void) { return compute(1); } // CALL\n"
        "int run(void) { return compute(2); } // CALL\n",
    ),
    "cpp": (
        "m.cpp",
        "#include <vector>\n"
        "int compute(int x) { return x; }\n"
        "class K { public: int run() { return compute(1); } }; // CALL\n"
        "int other() { return compute(2); } // CALL\n",
    ),
    "ruby": (
        "m.rb",
        "require_relative 'z'\n"
        "def compute(x)\n  x\nend\n"
        "def other\n  compute(1) # CALL\nend\n"
        "class K\n  def run\n    compute(2) # CALL\n  end\nend\n",
    ),
    "php": (
        "m.php",
        "<?php\nuse App\\Util;\n"
        "function compute($x) { return $x; }\n"
        "function other() { return compute(1); } // CALL\n"
        "class K { function run() { return compute(2); } } // CALL\n",
    ),
}


@pytest.mark.parametrize("lang", sorted(FIXTURES))
def test_every_call_site_of_compute_is_found_and_nothing_else(lang: str) -> None:
    path, body = FIXTURES[lang]
    rows = graph_rows(body, lang, "project", path)
    expected = {i for i, line in enumerate(body.split("\n"), 1) if "CALL" in line}
    got = {r["line"] for r in rows.references if r["name"] == "compute" and r["kind"] == "call"}
    assert got == expected
    defs = [d for d in rows.definitions if d["name"] == "compute"]
    assert len(defs) == 1 and defs[0]["kind"] in ("function", "method")
    # the definition's own name is not a reference
    assert all(r["line"] != defs[0]["start_line"] or r["name"] != "compute" for r in rows.references)
    assert rows.imports, f"{lang}: the import line was not seen"


def test_methods_are_qualified_by_their_class_and_calls_name_their_enclosing_symbol() -> None:
    path, body = FIXTURES["python"]
    rows = graph_rows(body, "python", "project", path)
    quals = {d["qualname"]: d for d in rows.definitions}
    assert quals["K.run"]["kind"] == "method" and quals["K.run"]["parent"] == "K"
    enclosing = {r["enclosing"] for r in rows.references if r["name"] == "compute"}
    assert enclosing == {"other", "K.run"}


def test_nested_scopes_and_decorators_name_the_innermost_definition() -> None:
    body = ("from reg import register, cached\n@register\nclass A:\n    @cached\n    def m(self):\n        def inner():\n"
            "            return use_a()\n        return use_b()\n\n\ndef top():\n    return use_c()\n")
    rows = graph_rows(body, "python", "project", "n.py")
    assert [d["qualname"] for d in rows.definitions] == ["A", "A.m", "A.m.inner", "top"]
    where = {r["name"]: (r["line"], r["enclosing"], r["kind"]) for r in rows.references}
    assert where["use_a"] == (7, "A.m.inner", "call") and where["use_b"] == (8, "A.m", "call")
    assert where["use_c"] == (12, "top", "call")
    # decorators are uses of their (imported) names, outside the definition they decorate
    uses = {(r["name"], r["line"], r["enclosing"], r["kind"]) for r in rows.references}
    assert ("register", 2, None, "name") in uses and ("cached", 4, "A", "name") in uses


def test_docstring_first_line_and_signature() -> None:
    body = 'def f(a, b):\n    r"""Returns.\n\n    Long text."""\n    return a + b\n'
    (d,) = graph_rows(body, "python", "project", "f.py").definitions
    assert d["doc"] == "Returns." and d["signature"] == "def f(a, b):"
    assert (d["start_line"], d["end_line"]) == (1, 5)


def test_imports_resolve_to_indexed_files_where_a_path_rule_applies() -> None:
    files = {
        "pkg/a.py": ("from .b import x\nfrom pkg.c import y\nimport json\n", "python"),
        "pkg/b.py": ("x = 1\n", "python"),
        "pkg/c/__init__.py": ("y = 2\n", "python"),
        "pkg/__init__.py": ("", "python"),
        "pkg/fields/__init__.py": ("", "python"),
        "pkg/fields/json.py": ("", "python"),  # inside a package: never what `import json` means
        "app/main.py": ("import tool.run\n", "python"),
        "src/tool/__init__.py": ("", "python"),
        "src/tool/run.py": ("", "python"),  # a src/ layout: src/ is no package
        "web/app.ts": ('import { u } from "./util";\n', "typescript"),
        "web/util.ts": ("export const u = 1;\n", "typescript"),
        "lib/m.c": ('#include "m.h"\n', "c"),
        "lib/m.h": ("int m;\n", "c"),
    }
    _, _, imports, bad = graph_files(files, "project")
    assert not bad
    resolved = {(r["path"], r["module"]): r["resolved"] for r in imports.to_pylist()}
    assert resolved[("pkg/a.py", ".b")] == "pkg/b.py"
    assert resolved[("pkg/a.py", "pkg.c")] == "pkg/c/__init__.py"
    assert resolved[("pkg/a.py", "json")] is None
    assert resolved[("app/main.py", "tool.run")] == "src/tool/run.py"
    assert resolved[("web/app.ts", "./util")] == "web/util.ts"
    assert resolved[("lib/m.c", "m.h")] == "lib/m.h"


def test_tables_carry_the_declared_schemas_and_a_bad_file_is_counted_and_skipped() -> None:
    # bytes where text is expected: the parser raises for that file only
    files = {
        "ok.py": ("def f():\n    return g()\n", "python"),
        "bad.py": (cast(str, b"def h(): pass"), "python"),
    }
    defs, refs, imports, bad = graph_files(files, "project")
    assert defs.schema.equals(DEFINITIONS) and refs.schema.equals(REFERENCES)
    assert imports.schema.equals(IMPORTS)
    assert isinstance(defs, pa.Table) and defs.column("qualname").to_pylist() == ["f"]
    assert len(bad) == 1 and bad[0].startswith("bad.py: ")
    assert set(refs.column("path").to_pylist()) == {"ok.py"}


def test_references_keep_what_can_be_asked_about_and_drop_locals_and_parameters() -> None:
    body = (
        "from django.db import Model, transaction\n"
        "from .utils import cached_property\n"
        "class Book(Model):\n"
        "    @cached_property\n"
        "    def title(self, i):\n"
        "        total = i + 1\n"
        "        transaction.atomic()\n"
        "        return self.name.upper(total)\n"
    )
    refs = {(r["line"], r["name"], r["kind"]) for r in graph_rows(body, "python", "project", "b.py").references}
    assert (3, "Model", "name") in refs  # a base class the file imports
    assert (4, "cached_property", "name") in refs  # a decorator
    assert (7, "atomic", "call") in refs and (8, "name", "attribute") in refs and (8, "upper", "call") in refs
    assert (1, "transaction", "import") in refs
    names = {name for _, name, _ in refs}
    assert not names & {"self", "i", "total"}  # a parameter, a single letter, a local


def test_the_chunkers_parse_gives_the_same_rows_as_a_fresh_one() -> None:
    files = {path: (body, lang) for lang, (path, body) in FIXTURES.items()}
    trees = {path: chunk_text(body, lang).tree for path, (body, lang) in files.items()}
    assert all(t is not None for t in trees.values())
    reused = graph_files(files, "project", None, {p: t for p, t in trees.items() if t is not None})
    fresh = graph_files(files, "project")
    assert all(a.equals(b) for a, b in zip(reused[:3], fresh[:3], strict=True))
    assert reused[1].num_rows > 0


def test_an_ambiguous_import_resolves_the_same_under_every_hash_seed() -> None:
    # Two src/-style layouts both end in `tool/run.py`: which one wins must not depend on the
    # process's string hash seed (Dask workers and re-runs each get a different one).
    script = (
        "from ctxlake.tasks.graph import resolve_import\n"
        "known = {f'{d}/tool/run.py' for d in ('alpha', 'beta', 'gamma', 'delta', 'omega', 'zeta')}\n"
        "known |= {f'{d}/tool/__init__.py' for d in ('alpha', 'beta', 'gamma', 'delta', 'omega', 'zeta')}\n"
        "print(resolve_import('tool.run', 'app/main.py', 'python', known))\n"
    )
    answers = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
        for seed in range(6)
    }
    assert answers == {"alpha/tool/run.py"}


def test_known_paths_are_kept_for_the_same_paths_and_resolve_the_same() -> None:
    from ctxlake.tasks import graph

    paths = {"src/pkg/__init__.py", "src/pkg/util.py", "app/main.py"}
    first = graph.known_paths(paths)
    assert graph.resolve_import("pkg.util", "app/main.py", "python", first) == "src/pkg/util.py"
    again = graph.known_paths(list(paths))  # the same paths, another collection: the same index
    assert again is first and again._suffixes is not None  # its suffix index is built already
    other = graph.known_paths(paths | {"app/extra.py"})
    assert other is not first
    assert graph.resolve_import("pkg.util", "app/main.py", "python", other) == "src/pkg/util.py"
    for i in range(graph.KNOWN_KEPT):
        graph.known_paths({f"x{i}.py"})
    assert len(graph._known_kept) == graph.KNOWN_KEPT and graph.known_paths(paths) is not first


def test_a_keyword_arguments_name_is_not_a_reference_its_value_is() -> None:
    body = (
        "from flask import url_for\n"
        "class App:\n"
        "    def env(self):\n"
        "        return dict(url_for=self.url_for, Config=Config, link=url_for('x'))\n"
    )
    refs = [(r["line"], r["name"], r["kind"]) for r in graph_rows(body, "python", "project", "a.py").references]
    # As in flask's app.py: `url_for=self.url_for` uses url_for once, as an attribute.
    assert [r for r in refs if r[0] == 4 and r[1] in ("url_for", "Config")] == [
        (4, "url_for", "attribute"), (4, "Config", "name"), (4, "url_for", "call")]

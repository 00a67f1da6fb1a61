"""Graph stage: one file's text and language -> DEFINITIONS, REFERENCES and IMPORTS rows."""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple, cast

import pyarrow as pa
from tree_sitter import Node, Query, QueryCursor
from tree_sitter_language_pack import SupportedLanguage, get_language

from ctxlake.schemas.tables import DEFINITIONS, IMPORTS, REFERENCES
from ctxlake.tasks.chunk import _parser
from ctxlake.tasks.chunk_langs import LANGS, LangSpec, describe, text

# Leaves that spell a name in some grammar.
_IDENTS = frozenset(
    {
        "identifier", "type_identifier", "field_identifier", "property_identifier",
        "constant", "name", "simple_identifier", "shorthand_property_identifier",
    }
)
# The receiver of a method body: a use of it on every other line, never a symbol anyone looks up.
_RECEIVERS = {"python": frozenset({"self", "cls"})}
# Member access: `a.b`, `a->b`, `a::b`; the last named child is the member.
_MEMBERS = frozenset(
    {
        "attribute", "member_expression", "field_expression", "selector_expression",
        "scoped_identifier", "member_access_expression", "field_access", "qualified_identifier",
        "scope_resolution", "class_constant_access_expression",
    }
)
# Calls and the fields that hold what is called.
_CALLS = frozenset(
    {
        "call", "call_expression", "method_invocation", "function_call_expression",
        "member_call_expression", "scoped_call_expression", "new_expression",
        "object_creation_expression", "method_call",
    }
)
_CALLEE_FIELDS = ("function", "method", "name", "constructor", "type")


# A Python string's prefix and opening quotes, to drop before the docstring's first line.
_QUOTES = re.compile(r"""^[rRbBuUfF]*('{3}|"{3}|'|")""")


class ImportSpec(NamedTuple):
    """Which nodes import, and how to read the module text out of one."""

    nodes: frozenset[str]
    field: str | None  # the field holding the module; None: the node's text, keywords stripped


IMPORT_SPECS: dict[str, ImportSpec] = {
    "python": ImportSpec(frozenset({"import_statement", "import_from_statement"}), None),
    "javascript": ImportSpec(frozenset({"import_statement"}), "source"),
    "typescript": ImportSpec(frozenset({"import_statement"}), "source"),
    "tsx": ImportSpec(frozenset({"import_statement"}), "source"),
    "go": ImportSpec(frozenset({"import_spec"}), "path"),
    "rust": ImportSpec(frozenset({"use_declaration"}), "argument"),
    "java": ImportSpec(frozenset({"import_declaration"}), None),
    "c": ImportSpec(frozenset({"preproc_include"}), "path"),
    "cpp": ImportSpec(frozenset({"preproc_include"}), "path"),
    "ruby": ImportSpec(frozenset(), None),  # require calls, see _ruby_require
    "php": ImportSpec(frozenset({"namespace_use_clause"}), None),
}


class GraphRows(NamedTuple):
    definitions: list[dict[str, Any]]
    references: list[dict[str, Any]]
    imports: list[dict[str, Any]]


def _key(node: Node) -> tuple[int, int, str]:
    return (node.start_byte, node.end_byte, node.type)


def _doc(node: Node, lang: str) -> str | None:
    """First line of a Python docstring, or of the comment block right above the definition."""
    if lang == "python":
        body = node.child_by_field_name("body")
        first = body.named_children[0] if body is not None and body.named_children else None
        if first is not None and first.type == "expression_statement" and first.named_children:
            first = first.named_children[0]  # older grammars wrap the docstring
        if first is not None and first.type == "string":
            doc = _QUOTES.sub("", text(first)).rstrip("\"'")
            lines = [ln.strip() for ln in doc.splitlines()]
            return next((ln for ln in lines if ln), None)
        return None
    prev = node.prev_named_sibling
    if prev is not None and "comment" in prev.type and prev.end_point.row >= node.start_point.row - 1:
        for line in text(prev).splitlines():
            cleaned = line.strip().lstrip("/*#!").strip().rstrip("*/").strip()
            if cleaned:
                return cleaned
    return None


def _name_node(node: Node, name: str) -> Node | None:
    """The identifier that names a definition (a field, or nested in a declarator), if found."""
    named = node.child_by_field_name("name")
    if named is not None and text(named) == name:
        return named
    queue = list(node.named_children)
    for _ in range(64):  # the name sits near the top: `const f = ...`, `int *f(...)`
        if not queue:
            break
        cur = queue.pop(0)
        if cur.type in _IDENTS and text(cur) == name:
            return cur
        if cur.start_point.row == node.start_point.row:
            queue.extend(cur.named_children)
    return named


def _module_text(node: Node, spec: ImportSpec) -> list[str]:
    if spec.field is not None:
        target = node.child_by_field_name(spec.field)
        raw = text(target) if target is not None else ""
        return [raw.strip("\"'<>` ")] if raw.strip() else []
    if node.type == "import_statement":  # Python: `import a.b, c as d`
        out = []
        for child in node.named_children:
            named = child.child_by_field_name("name") if child.type == "aliased_import" else child
            if named is not None:
                out.append(text(named))
        return out
    if node.type == "import_from_statement":
        module = node.child_by_field_name("module_name")
        return [text(module)] if module is not None else []
    raw = text(node)
    for word in ("import", "static", "use", ";"):
        raw = raw.replace(word, " ", 1) if word != ";" else raw.replace(";", " ")
    return [raw.strip()] if raw.strip() else []


def _ruby_require(node: Node) -> str | None:
    if node.type != "call":
        return None
    method = node.child_by_field_name("method")
    if method is None or text(method) not in ("require", "require_relative", "load"):
        return None
    args = node.child_by_field_name("arguments")
    if args is None or not args.named_children:
        return None
    module = text(args.named_children[0]).strip("\"'")
    return ("./" + module if text(method) == "require_relative" else module) or None


def _reference_kind(node: Node) -> str:
    """call, attribute or name, from where the identifier sits."""
    target = node
    kind = "name"
    parent = node.parent
    if parent is not None and parent.type in _MEMBERS:
        count = parent.named_child_count
        if count:
            last = parent.named_child(count - 1)
            if last is None or last.start_byte != node.start_byte:
                return "name"  # the object of `a.b` is a plain use of `a`
            target, kind = parent, "attribute"
            parent = parent.parent
    if parent is not None and parent.type in _CALLS:
        for field in _CALLEE_FIELDS:
            callee = parent.child_by_field_name(field)
            if callee is not None and callee.start_byte in (target.start_byte, node.start_byte) \
                    and callee.end_byte in (target.end_byte, node.end_byte):
                return "call"
    return kind


class Known:
    """Every path of a source, with a lookup by path ending (`b/c.py` finds `a/b/c.py`)."""

    def __init__(self, paths: Collection[str]) -> None:
        self.paths = paths if isinstance(paths, set | frozenset) else set(paths)
        self._endings: dict[str, list[str]] | None = None

    def __contains__(self, path: object) -> bool:
        return path in self.paths

    def ending(self, suffix: str) -> list[str]:
        """Paths that end with `/suffix` (the index is built on first use)."""
        if self._endings is None:
            self._endings = {}
            for p in self.paths:
                cut = p.find("/")
                while cut != -1:
                    self._endings.setdefault(p[cut + 1 :], []).append(p)
                    cut = p.find("/", cut + 1)
        return self._endings.get(suffix, [])


def resolve_import(module: str, path: str, lang: str, known: Collection[str] | Known) -> str | None:
    """The indexed file an import names, when a plain path rule finds exactly one."""
    if not isinstance(known, Known):
        known = Known(known)
    folder = posixpath.dirname(path)
    candidates: list[str] = []
    if lang == "python":
        dots = len(module) - len(module.lstrip("."))
        rest = module[dots:].replace(".", "/")
        if dots:
            base = folder
            for _ in range(dots - 1):
                base = posixpath.dirname(base)
            stem = posixpath.join(base, rest) if rest else base
            candidates = [stem + ".py", posixpath.join(stem, "__init__.py")]
        else:
            candidates = [rest + ".py", rest + "/__init__.py"]
            for suffix in list(candidates):  # a src/ layout or a nested project root: the folder
                # above the package is no package itself (else `import json` would find any json.py)
                candidates += [p for p in known.ending(suffix)
                               if p[: len(p) - len(suffix)] + "__init__.py" not in known]
    elif module.startswith("."):
        stem = posixpath.normpath(posixpath.join(folder, module))
        exts = ("", ".js", ".ts", ".tsx", ".jsx", ".mjs", ".rb", "/index.js", "/index.ts")
        candidates = [stem + ext for ext in exts]
    elif lang in ("c", "cpp"):
        candidates = [posixpath.normpath(posixpath.join(folder, module)), module]
        candidates += known.ending(module)
    for cand in candidates:
        if cand in known:
            return cand
    return None


@functools.cache
def _query(lang: str) -> Query:
    """One query per grammar capturing what the graph reads: possible definitions (@def), names
    (@ref), import statements (@imp) and, for Ruby, calls that may be `require` (@call)."""
    language = get_language(cast(SupportedLanguage, lang))
    spec, imp = LANGS[lang], IMPORT_SPECS[lang]

    def alternation(types: Collection[str], capture: str) -> str:
        known = sorted(t for t in types if language.id_for_node_kind(t, True) is not None)
        return f"[{' '.join(f'({t})' for t in known)}] @{capture}" if known else ""

    parts = [
        alternation({*spec.defs, *spec.resolvers, *spec.wrappers}, "def"),
        alternation(_IDENTS, "ref"),
        alternation(imp.nodes, "imp"),
        alternation({"call"} if lang == "ruby" else set(), "call"),
    ]
    return Query(language, "\n".join(p for p in parts if p))


def graph_rows(
    text_: str, lang: str, source: str, path: str, known: Collection[str] | Known = ()
) -> GraphRows:
    """One file's text -> its definitions, references and imports as row dicts (may raise).

    A tree-sitter query finds the candidate nodes in C; definitions then nest by byte range
    (the innermost one around a name is its enclosing symbol), so no Python walks every node.
    """
    spec: LangSpec | None = LANGS.get(lang)
    if spec is None or lang not in IMPORT_SPECS:
        return GraphRows([], [], [])
    imp = IMPORT_SPECS[lang]
    root = _parser(lang).parse(text_.encode("utf-8", "surrogatepass")).root_node
    found_nodes = QueryCursor(_query(lang)).captures(root)
    lines = text_.split("\n")
    base = {"source": source, "path": path}

    defs: list[dict[str, Any]] = []
    spans: list[tuple[int, int, str]] = []  # (start, end, qualname) of each definition, in order
    seen: set[tuple[int, int, str]] = set()
    def_names: set[int] = set()  # start bytes of the identifiers that name a definition
    stack: list[tuple[int, str, bool]] = []  # (end byte, qualname, members are methods)
    for node in sorted(found_nodes.get("def", ()), key=lambda n: (n.start_byte, -n.end_byte)):
        if _key(node) in seen:
            continue
        found = describe(node, spec)
        if found is None or not found.name or _key(found.node) in seen:
            continue
        seen.add(_key(found.node))
        start = found.node.start_byte
        while stack and stack[-1][0] <= start:
            stack.pop()
        scope, in_class = (stack[-1][1], stack[-1][2]) if stack else (None, False)
        qual = f"{scope}.{found.name}" if scope else found.name
        kind = "method" if in_class and found.kind == "function" else found.kind
        name_node = _name_node(found.node, qual.rsplit(".", 1)[-1])
        if name_node is not None:
            def_names.add(name_node.start_byte)
        row = found.node.start_point.row
        defs.append({
            **base, "qualname": qual, "name": qual.rsplit(".", 1)[-1], "kind": kind,
            "start_line": row + 1, "end_line": found.node.end_point.row + 1,
            "signature": lines[row].strip()[:200] if row < len(lines) else "",
            "doc": _doc(found.node, lang), "parent": scope,
        })
        spans.append((start, found.node.end_byte, qual))
        stack.append((found.node.end_byte, qual, found.node.type in spec.method_parents))

    imports: list[dict[str, Any]] = []
    import_spans: list[tuple[int, int]] = []
    for node in sorted(found_nodes.get("imp", ()), key=lambda n: n.start_byte):
        import_spans.append((node.start_byte, node.end_byte))
        for module in _module_text(node, imp):
            imports.append({**base, "module": module, "resolved": resolve_import(module, path, lang, known)})
    for node in sorted(found_nodes.get("call", ()), key=lambda n: n.start_byte):
        required = _ruby_require(node)
        if required is not None:
            imports.append({**base, "module": required, "resolved": resolve_import(required, path, lang, known)})

    refs: list[dict[str, Any]] = []
    receivers = _RECEIVERS.get(lang, frozenset())
    once: set[tuple[int, str, str]] = set()
    scopes: list[tuple[int, str]] = []  # (end byte, qualname) of the definitions around the cursor
    next_def = next_imp = 0
    for node in sorted(found_nodes.get("ref", ()), key=lambda n: n.start_byte):
        at = node.start_byte
        if at in def_names:
            continue
        while next_def < len(spans) and spans[next_def][0] <= at:
            while scopes and scopes[-1][0] <= spans[next_def][0]:
                scopes.pop()
            scopes.append((spans[next_def][1], spans[next_def][2]))
            next_def += 1
        while scopes and scopes[-1][0] <= at:
            scopes.pop()
        while next_imp < len(import_spans) and import_spans[next_imp][1] <= at:
            next_imp += 1
        in_import = next_imp < len(import_spans) and import_spans[next_imp][0] <= at
        name = text(node)
        if not name or name in receivers:
            continue
        fact = (node.start_point.row + 1, name, "import" if in_import else _reference_kind(node))
        if fact not in once:  # `f(f(x))`: one fact per line and kind (the table's merge key)
            once.add(fact)
            refs.append({**base, "line": fact[0], "name": name,
                         "enclosing": scopes[-1][1] if scopes else None, "kind": fact[2]})
    return GraphRows(defs, refs, imports)


def to_tables(rows: GraphRows) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Row dicts -> DEFINITIONS, REFERENCES and IMPORTS tables."""
    return (
        pa.Table.from_pylist(rows.definitions, schema=DEFINITIONS),
        pa.Table.from_pylist(rows.references, schema=REFERENCES),
        pa.Table.from_pylist(rows.imports, schema=IMPORTS),
    )


def graph_files(
    files: Mapping[str, tuple[str, str]], source: str, known: Collection[str] | None = None
) -> tuple[pa.Table, pa.Table, pa.Table, list[str]]:
    """{path: (text, lang)} -> the three tables for those files, plus `path: reason` per bad file.

    `known` is every path of the source (imports resolve against it); by default, these files.
    """
    index = Known(set(files) if known is None else known)
    acc = GraphRows([], [], [])
    bad: list[str] = []
    for path, (body, lang) in files.items():
        try:
            rows = graph_rows(body, lang, source, path, index)
        except Exception as exc:  # one bad file is counted and skipped, never the batch
            bad.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        acc.definitions.extend(rows.definitions)
        acc.references.extend(rows.references)
        acc.imports.extend(rows.imports)
    return (*to_tables(acc), bad)

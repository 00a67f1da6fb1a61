"""Graph stage: one file's text and language -> DEFINITIONS, REFERENCES and IMPORTS rows."""

from __future__ import annotations

import posixpath
import re
import threading
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import pyarrow as pa
from tree_sitter import Node, Query, QueryCursor, QueryError, Tree

from ctxlake.schemas.tables import DEFINITIONS, IMPORTS, REFERENCES
from ctxlake.tasks.chunk import _parser, parse
from ctxlake.tasks.chunk_langs import LANGS, LangSpec, describe, text

# Leaves that spell a name in some grammar.
_IDENTS = frozenset(
    {
        "identifier", "type_identifier", "field_identifier", "property_identifier",
        "constant", "name", "simple_identifier", "shorthand_property_identifier",
    }
)
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


class Known:
    """Every path of a source, with a lookup by path suffix for `endswith` matches."""

    def __init__(self, paths: Collection[str]) -> None:
        self.paths = paths if isinstance(paths, set | frozenset) else set(paths)
        self._suffixes: dict[str, list[str]] | None = None

    def __contains__(self, path: object) -> bool:
        return path in self.paths

    def ending(self, suffix: str) -> list[str]:
        """Paths that end with `/suffix`, from an index of every proper suffix (built on first use)."""
        if self._suffixes is None:
            self._suffixes = {}
            # Sorted: a set's order follows the per-process string hash seed, and the first
            # candidate wins an ambiguous import, so two processes (a Dask worker and the flow,
            # or two runs) would resolve the same import differently.
            for p in sorted(self.paths):
                parts = p.split("/")
                for i in range(1, len(parts)):
                    self._suffixes.setdefault("/".join(parts[i:]), []).append(p)
        return self._suffixes.get(suffix, [])


# The suffix index of a big project takes a while to build (~50 ms for django's 5,300 paths), and a
# watcher's batches resolve against the same paths again and again: the last few are kept.
KNOWN_KEPT = 4
_known_kept: dict[frozenset[str], Known] = {}
_known_lock = threading.Lock()


def known_paths(paths: Collection[str]) -> Known:
    """The Known of `paths`, the same object while the same paths come again."""
    key = frozenset(paths)
    with _known_lock:
        found = _known_kept.pop(key, None) or Known(key)
        _known_kept[key] = found  # the newest last
        while len(_known_kept) > KNOWN_KEPT:
            del _known_kept[next(iter(_known_kept))]
    return found


def forget_known(paths: Collection[str]) -> None:
    """Drop the kept Known of `paths`: a whole-tree run's suffix index (~90 MB and 0.8 s to build
    for 100,000 paths) is not needed after its chunk stage, and would sit under the embed stage's
    peak; small runs keep theirs for the next edit."""
    with _known_lock:
        _known_kept.pop(frozenset(paths), None)


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


def _query_source(lang: str, spec: LangSpec, imp: ImportSpec) -> list[str]:
    """Candidate query patterns: definitions, imports, identifiers, members and callees."""
    language = _parser(lang).language
    if language is None:
        return []
    has = [f"({t})" for t in sorted(_IDENTS) if language.id_for_node_kind(t, True)]
    out = [f"({t}) @def" for t in sorted({*spec.defs, *spec.resolvers})]
    out += [f"({t}) @import" for t in sorted(imp.nodes)]
    if lang == "ruby":
        out.append("(call) @rcall")
    out.append("[" + " ".join(has) + "] @id")
    for ident in has:
        out += [f"({m} {ident} @attr .)" for m in sorted(_MEMBERS)]
        for call in sorted(_CALLS):
            for field in _CALLEE_FIELDS:
                out.append(f"({call} {field}: {ident} @call)")
                out += [f"({call} {field}: ({m} {ident} @call .))" for m in sorted(_MEMBERS)]
    return out


_QUERIES: dict[str, Query | None] = {}
_QUERIES_LOCK = threading.Lock()


def _query(lang: str, spec: LangSpec, imp: ImportSpec) -> Query | None:
    """One query per language finds every node the graph needs in a single pass in C.

    Each candidate pattern is tried alone: a node type or field a grammar lacks drops that
    pattern only (the tables above are shared by all languages).
    """
    with _QUERIES_LOCK:
        if lang in _QUERIES:
            return _QUERIES[lang]
        language = _parser(lang).language
        if language is None:
            _QUERIES[lang] = None
            return None
        ok = []
        for pattern in _query_source(lang, spec, imp):
            try:
                Query(language, pattern)
            except (QueryError, NameError, SyntaxError, ValueError):
                continue
            ok.append(pattern)
        query = _QUERIES[lang] = Query(language, "\n".join(ok)) if ok else None
        return query


class _Columns:
    """Rows of the three tables as column lists: no dict per row, one Arrow build per batch."""

    def __init__(self) -> None:
        self.defs: dict[str, list[Any]] = {f.name: [] for f in DEFINITIONS}
        self.refs: dict[str, list[Any]] = {f.name: [] for f in REFERENCES}
        self.imports: dict[str, list[Any]] = {f.name: [] for f in IMPORTS}

    def tables(self) -> tuple[pa.Table, pa.Table, pa.Table]:
        return (
            pa.Table.from_pydict(self.defs, schema=DEFINITIONS),
            pa.Table.from_pydict(self.refs, schema=REFERENCES),
            pa.Table.from_pydict(self.imports, schema=IMPORTS),
        )

    def rows(self) -> GraphRows:
        def dicts(cols: dict[str, list[Any]]) -> list[dict[str, Any]]:
            return [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)]

        return GraphRows(dicts(self.defs), dicts(self.refs), dicts(self.imports))


def _start(node: Node) -> int:
    return node.start_byte


# Identifiers that name an argument rather than use something: in `f(url_for=self.url_for)` only
# the value refers to url_for. Node type -> the field holding the label.
_LABEL_FIELDS = {"keyword_argument": "name"}


def _is_label(node: Node) -> bool:
    parent = node.parent
    field = _LABEL_FIELDS.get(parent.type) if parent is not None else None
    label = parent.child_by_field_name(field) if parent is not None and field is not None else None
    return label is not None and label.start_byte == node.start_byte and label.end_byte == node.end_byte


def _import_idents(node: Node) -> list[Node]:
    out = []
    stack = [node]
    while stack:
        cur = stack.pop()
        if cur.type in _IDENTS:
            out.append(cur)
        stack.extend(cur.named_children)
    return out


def _extract(
    text_: str, lang: str, source: str, path: str, known: Known, out: _Columns, tree: Tree | None = None
) -> None:
    """One file's definitions, references and imports, appended to `out` (may raise).

    References kept: calls, member accesses and import names, plus plain names the file
    imports or defines (or Capitalised ones: classes, constants). Locals, parameters and
    single letters are not stored: nobody asks where `i` or `self` is used.
    """
    spec: LangSpec | None = LANGS.get(lang)
    imp = IMPORT_SPECS.get(lang)
    if spec is None or imp is None:
        return
    query = _query(lang, spec, imp)
    if query is None:
        return
    src = text_.encode("utf-8", "surrogatepass")
    root = (tree if tree is not None else parse(text_, lang)).root_node
    caps = QueryCursor(query).captures(root)
    lines = text_.split("\n")

    # Definitions, outermost first: a stack of open ones gives each its scope.
    d = out.defs
    spans: list[tuple[int, int, str]] = []
    stack: list[tuple[int, str, bool]] = []
    own_names: set[int] = set()
    wanted: set[bytes] = set()
    seen: set[tuple[int, int, str]] = set()
    for node in sorted(caps.get("def", ()), key=lambda n: (n.start_byte, -n.end_byte)):
        found = describe(node, spec)
        if found is None or not found.name or _key(found.node) in seen:
            continue
        fnode = found.node
        seen.add(_key(fnode))
        begin = fnode.start_byte
        while stack and stack[-1][0] <= begin:
            stack.pop()
        scope, in_class = (stack[-1][1], stack[-1][2]) if stack else (None, False)
        qual = f"{scope}.{found.name}" if scope else found.name
        name = qual.rsplit(".", 1)[-1]
        name_node = _name_node(fnode, name)
        if name_node is not None:
            own_names.add(name_node.start_byte)
        wanted.add(name.encode("utf-8", "surrogatepass"))
        row = fnode.start_point.row
        d["source"].append(source)
        d["path"].append(path)
        d["qualname"].append(qual)
        d["name"].append(name)
        d["kind"].append("method" if in_class and found.kind == "function" else found.kind)
        d["start_line"].append(row + 1)
        d["end_line"].append(fnode.end_point.row + 1)
        d["signature"].append(lines[row].strip()[:200] if row < len(lines) else "")
        d["doc"].append(_doc(fnode, lang))
        d["parent"].append(scope)
        stack.append((fnode.end_byte, qual, fnode.type in spec.method_parents))
        spans.append((begin, fnode.end_byte, qual))

    # Imports, and the names they bring in.
    modules: list[str] = []
    kinds: dict[int, tuple[Node, str]] = {}
    import_idents: list[Node] = []
    for node in sorted(caps.get("import", ()), key=_start):
        modules += _module_text(node, imp)
        import_idents += _import_idents(node)
    for node in sorted(caps.get("rcall", ()), key=_start):
        required = _ruby_require(node)
        if required is not None:
            modules.append(required)
    im = out.imports
    for module in modules:
        im["source"].append(source)
        im["path"].append(path)
        im["module"].append(module)
        im["resolved"].append(resolve_import(module, path, lang, known))
    for node in import_idents:
        wanted.add(src[node.start_byte:node.end_byte])

    for node in caps.get("id", ()):
        begin, end = node.start_byte, node.end_byte
        word = src[begin:end]
        if end - begin > 1 and (word in wanted or word[:1].isupper()) and not _is_label(node):
            kinds[begin] = (node, "name")
    for node in caps.get("attr", ()):
        kinds[node.start_byte] = (node, "attribute")
    for node in caps.get("call", ()):
        kinds[node.start_byte] = (node, "call")
    for node in import_idents:
        kinds[node.start_byte] = (node, "import")
    for begin in own_names:
        kinds.pop(begin, None)

    # Each reference's enclosing definition: the innermost span around it.
    r = out.refs
    open_: list[tuple[int, str]] = []
    nxt = 0
    for begin in sorted(kinds):
        node, kind = kinds[begin]
        while nxt < len(spans) and spans[nxt][0] <= begin:
            while open_ and open_[-1][0] <= spans[nxt][0]:
                open_.pop()
            open_.append((spans[nxt][1], spans[nxt][2]))
            nxt += 1
        while open_ and open_[-1][0] <= begin:
            open_.pop()
        name = src[begin:node.end_byte].decode("utf-8", "replace")
        if not name:
            continue
        r["source"].append(source)
        r["path"].append(path)
        r["line"].append(node.start_point.row + 1)
        r["name"].append(name)
        r["enclosing"].append(open_[-1][1] if open_ else None)
        r["kind"].append(kind)


def graph_rows(
    text_: str, lang: str, source: str, path: str, known: Collection[str] | Known = ()
) -> GraphRows:
    """One file's text -> its definitions, references and imports as row dicts (may raise)."""
    out = _Columns()
    _extract(text_, lang, source, path, known if isinstance(known, Known) else Known(known), out)
    return out.rows()


def to_tables(rows: GraphRows) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Row dicts -> DEFINITIONS, REFERENCES and IMPORTS tables."""
    return (
        pa.Table.from_pylist(rows.definitions, schema=DEFINITIONS),
        pa.Table.from_pylist(rows.references, schema=REFERENCES),
        pa.Table.from_pylist(rows.imports, schema=IMPORTS),
    )


def graph_files(
    files: Mapping[str, tuple[str, str]],
    source: str,
    known: Collection[str] | None = None,
    trees: Mapping[str, Tree] | None = None,
) -> tuple[pa.Table, pa.Table, pa.Table, list[str]]:
    """{path: (text, lang)} -> the three tables for those files, plus `path: reason` per bad file.

    `known` is every path of the source (imports resolve against it); by default, these files.
    `trees` are the chunker's parses of those same texts, reused instead of parsing again.
    """
    trees = trees or {}
    index = known if isinstance(known, Known) else known_paths(files if known is None else known)
    acc = _Columns()
    bad: list[str] = []
    for path, (body, lang) in files.items():
        one = _Columns()
        try:
            _extract(body, lang, source, path, index, one, trees.get(path))
        except Exception as exc:  # one bad file is counted and skipped, never the batch
            bad.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        for mine, theirs in ((acc.defs, one.defs), (acc.refs, one.refs), (acc.imports, one.imports)):
            for column, values in theirs.items():
                mine[column].extend(values)
    return (*acc.tables(), bad)

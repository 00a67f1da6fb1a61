"""Read API over the symbol graph (tables definitions, refs, imports; cochange when present):
find_definition, find_references, related_files, file_outline. The CLI and MCP both call these.

Each answers within one source, the project's own by default: two sources may hold the same paths
(a local folder and a clone of the same library), and their rows must not mix."""

from __future__ import annotations

import posixpath
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxlake.errors import InputError, NotIndexedError, UnknownFileError
from ctxlake.schemas.tables import COCHANGE_TABLE, PROJECT_SOURCE
from ctxlake.serve.api.graph_models import (
    Definition,
    DefinitionAnswer,
    Outline,
    OutlineItem,
    Reference,
    ReferencePage,
    RelatedAnswer,
    RelatedFile,
)
from ctxlake.tasks import safe_io
from ctxlake.tasks.cochange import newest_weight, strength
from ctxlake.tasks.graph_store import DEFINITIONS_TABLE, IMPORTS_TABLE, REFERENCES_TABLE
from ctxlake.tasks.lake import FILES_TABLE, connect, open_table, table_names
from ctxlake.tasks.safe_io import text_as_indexed
from ctxlake.tasks.secrets import mask_text
from ctxlake.tasks.source_store import source_roots
from ctxlake.tasks.store import sql_str

if TYPE_CHECKING:
    from lancedb.table import Table

MAX_LIMIT = 200
SNIPPET_CHARS = 160
SNIPPET_READ_BYTES = 4_000_000  # a reference's file is read this far for its line


def _rows(table: Table, where: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    query = table.search().where(where)
    if columns:
        query = query.select(columns)
    out: list[dict[str, Any]] = query.limit(None).to_arrow().to_pylist()
    return out


class GraphReader:
    """The graph tables of one lake, opened once (the MCP server keeps one)."""

    def __init__(self, lake_dir: Path, root: Path | None = None) -> None:
        # The MCP server keeps one reader for its life: without a consistency interval each table
        # stays at the version it opened, and a file indexed later would be "not in the index".
        db = connect(lake_dir, read_consistency=timedelta(0))
        if DEFINITIONS_TABLE not in table_names(db):
            raise NotIndexedError(f"the lake at {lake_dir} has no symbol graph",
                                  hint="run `ctx run index` (a lake from before the graph needs `--force`)")
        self.root = root
        self.lake_dir = lake_dir
        self._roots: dict[str, Path] | None = None  # source -> its folder, read on the first snippet
        self.defs = db.open_table(DEFINITIONS_TABLE)
        self.refs = db.open_table(REFERENCES_TABLE)
        self.imports = db.open_table(IMPORTS_TABLE)
        self.cochange = open_table(db, COCHANGE_TABLE)
        self.files = open_table(db, FILES_TABLE)

    # -- definitions -------------------------------------------------------------------------
    def _matching(self, symbol: str, source: str | None, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """Definitions of `symbol` in `source` (None: in every source)."""
        symbol = symbol.strip()
        if not symbol:
            raise InputError("the symbol is empty")
        last = symbol.replace("::", ".").rsplit(".", 1)[-1]
        where = f"name = {sql_str(last)}" + ("" if source is None else f" AND {_in_source(source)}")
        rows = _rows(self.defs, where, None if columns is None else [*columns, "qualname"])
        if "." in symbol.replace("::", "."):
            want = symbol.replace("::", ".")
            rows = [r for r in rows if r["qualname"] == want or r["qualname"].endswith("." + want)]
        return rows

    def _elsewhere(self, symbol: str, source: str) -> str:
        """A hint naming the other sources that define `symbol`, or ''."""
        others = sorted({r["source"] for r in self._matching(symbol, None, ["source"])} - {source})
        if not others:
            return ""
        return (f"defined in {', '.join(_owner(o) for o in others)}: pass --source (MCP: source) "
                f"{others[0]}")

    def _importers(self, source: str, paths: set[str]) -> Counter[str]:
        if not paths:
            return Counter()
        listed = ", ".join(sql_str(p) for p in sorted(paths))
        return Counter(r["resolved"] for r in _rows(self.imports, f"{_in_source(source)} AND resolved IN ({listed})",
                                                    ["resolved"]))

    def _imported_by(self, source: str, path: str) -> set[str]:
        return {r["resolved"] for r in _rows(self.imports, f"{_in_source(source)} AND path = {sql_str(path)}",
                                             ["resolved"])
                if r["resolved"]}

    def find_definition(self, symbol: str, from_path: str | None = None, limit: int = 10,
                        source: str = PROJECT_SOURCE) -> DefinitionAnswer:
        """Where `symbol` is defined in `source` (the project by default), best first."""
        rows = self._matching(symbol, source)
        if not rows:
            raise InputError(f"no definition of {symbol!r} in the {_owner(source)}",
                             hint=self._elsewhere(symbol, source)
                             or "check the spelling, or `ctx search` for text; names are case-sensitive")
        imported = self._imported_by(source, from_path) if from_path else set()
        folder = posixpath.dirname(from_path) if from_path else None
        fans = self._importers(source, {r["path"] for r in rows})

        def key(r: dict[str, Any]) -> tuple[int, int, int]:
            """(imported by the asking file, same folder, how many files import its file)."""
            return (int(r["path"] in imported or r["path"] == from_path),
                    int(folder is not None and posixpath.dirname(r["path"]) == folder),
                    fans[r["path"]])

        rows.sort(key=lambda r: (*(-k for k in key(r)), r["path"], r["start_line"]))
        first = rows[0]
        if len(rows) == 1:
            confidence, reason = 1.0, "the only definition"
        elif key(first)[0] and not key(rows[1])[0]:
            confidence, reason = 0.9, f"{from_path} imports {first['path']}"
        elif key(first)[1] and not key(rows[1])[1]:
            confidence, reason = 0.7, "same folder as the asking file"
        elif key(first)[2] > key(rows[1])[2]:
            share = key(first)[2] / max(1, sum(fans[r["path"]] for r in rows))
            confidence = round(max(1 / len(rows), min(0.8, share)), 2)
            reason = f"its file is imported by {key(first)[2]} files, more than the others"
        else:
            confidence, reason = round(1 / len(rows), 2), "no signal tells the definitions apart"
        defs = [Definition(**{k: r[k] for k in Definition.model_fields}) for r in rows[:_bound(limit)]]
        return DefinitionAnswer(symbol=symbol, definitions=defs, ambiguous=confidence < 0.7,
                                confidence=confidence, reason=reason)

    # -- references ----------------------------------------------------------------------------
    def find_references(self, symbol: str, offset: int = 0, limit: int = 20,
                        include_imports: bool = True, source: str = PROJECT_SOURCE) -> ReferencePage:
        """Where `symbol` is used in `source` (the project by default), one page at a time."""
        if offset < 0:
            raise InputError(f"offset must be at least 0, not {offset}")
        defs = self._matching(symbol, source, ["path", "start_line"])
        last = symbol.replace("::", ".").strip().rsplit(".", 1)[-1]
        where = (f"name = {sql_str(last)} AND {_in_source(source)}"
                 + ("" if include_imports else " AND kind != 'import'"))
        rows = _rows(self.refs, where, ["source", "path", "line", "kind", "enclosing"])
        if not rows and not defs:
            raise InputError(f"unknown symbol {symbol!r}: no definition or reference in the {_owner(source)}",
                             hint=self._elsewhere(symbol, source)
                             or "names are case-sensitive; `ctx search --mode fuzzy` finds near names")
        def_paths = {d["path"] for d in defs}
        linked = def_paths | {r["path"] for r in self._importing(source, def_paths)}
        # A definition's own line is not a use of it.
        own = {(d["path"], d["start_line"]) for d in defs}
        rows = [r for r in rows if (r["path"], r["line"]) not in own]
        rows.sort(key=lambda r: (r["path"] not in linked, r["path"], r["line"]))
        page = rows[offset: offset + _bound(limit)]
        files: dict[tuple[str, str], list[str]] = {}  # each file of the page read once
        out = [Reference(source=r["source"], path=r["path"], line=r["line"], kind=r["kind"], enclosing=r["enclosing"],
                         snippet=self._line(r["source"], r["path"], r["line"], files),
                         resolved=r["path"] in linked) for r in page]
        nxt = offset + len(page)
        return ReferencePage(symbol=symbol, total=len(rows), offset=offset, references=out,
                             next_offset=nxt if nxt < len(rows) else None,
                             definitions=[f"{d['path']}:{d['start_line']}" for d in defs[:20]])

    def _importing(self, source: str, paths: set[str]) -> list[dict[str, Any]]:
        if not paths:
            return []
        listed = ", ".join(sql_str(p) for p in sorted(paths))
        return _rows(self.imports, f"{_in_source(source)} AND resolved IN ({listed})", ["path"])

    def _folder(self, source: str) -> Path | None:
        """Where a source's files are read: the project root, else the folder it was indexed from
        (a local folder, the clone of a git source, a web source's saved pages)."""
        if source == PROJECT_SOURCE:
            return self.root
        if self._roots is None:
            self._roots = source_roots(self.lake_dir)
        return self._roots.get(source)

    def _line(self, source: str, path: str, line: int, files: dict[tuple[str, str], list[str]]) -> str:
        lines = files.get((source, path))
        if lines is None:
            folder = self._folder(source)
            data = b""
            if folder is not None:
                # The race-safe opener, as for `ctx show`: no link out of the folder, no FIFO, bounded.
                try:
                    data = safe_io.open_inside(folder, path, SNIPPET_READ_BYTES, allow_hidden=True)
                except (OSError, InputError):
                    data = b""
            # Masked as the index masked it: a snippet shows no more than a search hit would.
            text = mask_text(text_as_indexed(data), path) if data else ""
            lines = files[(source, path)] = text.split("\n")
        return lines[line - 1].strip()[:SNIPPET_CHARS] if 0 < line <= len(lines) else ""

    # -- files ---------------------------------------------------------------------------------
    def related_files(self, path: str, limit: int = 30, source: str = PROJECT_SOURCE) -> RelatedAnswer:
        """Files `path` of `source` imports, its importers, and files changed with it."""
        path = _norm(path)
        own = _rows(self.imports, f"{_in_source(source)} AND path = {sql_str(path)}", ["module", "resolved"])
        importers = _rows(self.imports, f"{_in_source(source)} AND resolved = {sql_str(path)}", ["path"])
        if not own and not importers and not self._known(source, path):
            raise UnknownFileError(f"{path} is not in the index{_of(source)}", hint=self._path_hint(source, path))
        related: list[RelatedFile] = []
        seen: set[tuple[str, str]] = set()
        for rel, paths in (("imports", [r["resolved"] for r in own if r["resolved"]]),
                           ("imported_by", sorted({r["path"] for r in importers}))):
            for p in paths:
                if (p, rel) not in seen and p != path:
                    seen.add((p, rel))
                    related.append(RelatedFile(path=p, relation=rel))
        top = newest_weight(self.lake_dir, source)
        if self.cochange is not None and top:
            rows = _rows(self.cochange, f"{_in_source(source)} AND path = {sql_str(path)}",
                         ["other", "weight", "commits"])
            rows.sort(key=lambda r: (-float(r["weight"]), r["other"]))
            related += [RelatedFile(path=r["other"], relation="cochange", commits=int(r["commits"]),
                                    weight=round(strength(float(r["weight"]), top), 4))
                        for r in rows[:_bound(limit)]]
        unresolved = sorted({r["module"] for r in own if not r["resolved"]})
        return RelatedAnswer(source=source, path=path, related=related[:_bound(limit)],
                             unresolved_imports=unresolved[:50])

    def indexed_path(self, path: str, source: str = PROJECT_SOURCE) -> str:
        """`path` as the index names it, when `source` holds that file; UnknownFileError otherwise."""
        path = _norm(path)
        if not self._known(source, path):
            raise UnknownFileError(f"{path} is not in the index{_of(source)}", hint=self._path_hint(source, path))
        return path

    def _known(self, source: str, path: str) -> bool:
        """Whether the index holds the file: the files manifest, not the graph (a file may define and
        use nothing the graph keeps, `a = 1`, and still be indexed and co-changed)."""
        on_path = f"{_in_source(source)} AND path = {sql_str(path)}"
        checks = [self.files] if self.files is not None else [self.defs, self.refs]  # a lake without the manifest
        # one row answers it: the limit stops the scan early
        return any(t.search().where(on_path).select(["path"]).limit(1).to_arrow().num_rows for t in checks)

    def _path_hint(self, source: str, path: str) -> str:
        """Where else the path is indexed, or how paths are written."""
        table = self.files if self.files is not None else self.defs
        others = sorted({r["source"] for r in _rows(table, f"path = {sql_str(path)}", ["source"])} - {source})
        if others:
            return f"it is in {', '.join(_owner(o) for o in others)}: pass --source (MCP: source) {others[0]}"
        return "paths are relative to the project root" if source == PROJECT_SOURCE else \
            f"paths are relative to the root of source {source!r}"

    def file_outline(self, path: str, limit: int = MAX_LIMIT, source: str = PROJECT_SOURCE) -> Outline:
        """The definitions of `path` in `source` (the project by default), in file order."""
        path = _norm(path)
        rows = _rows(self.defs, f"{_in_source(source)} AND path = {sql_str(path)}")
        if not rows and not self._known(source, path):
            raise UnknownFileError(f"{path} is not in the index{_of(source)} or has no definitions",
                             hint=self._path_hint(source, path))
        rows.sort(key=lambda r: (r["start_line"], -r["end_line"]))
        items = [OutlineItem(qualname=r["qualname"], kind=r["kind"], start_line=r["start_line"],
                             end_line=r["end_line"], signature=r["signature"], doc=r["doc"],
                             depth=r["parent"].count(".") + 1 if r["parent"] else 0)
                 for r in rows[:_bound(limit)]]
        return Outline(source=source, path=path, items=items)


def _bound(limit: int) -> int:
    if limit < 1:
        raise InputError(f"limit must be at least 1, not {limit}")
    return min(limit, MAX_LIMIT)


def _in_source(source: str) -> str:
    return f"source = {sql_str(source)}"


def _owner(source: str) -> str:
    return "project" if source == PROJECT_SOURCE else f"source {source!r}"


def _of(source: str) -> str:
    return "" if source == PROJECT_SOURCE else f" of source {source!r}"


def _norm(path: str) -> str:
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path

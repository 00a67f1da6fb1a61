"""Store stage for the symbol graph: DEFINITIONS, REFERENCES (table `refs`) and IMPORTS rows of
changed/removed files -> LanceDB, a delete and an append per table and batch."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from ctxlake.schemas.tables import DEFINITIONS, IMPORTS, REFERENCES
from ctxlake.tasks.lake import (  # the graph's table names are declared with the lake's
    DEFINITIONS_TABLE,
    IMPORTS_TABLE,
    REFERENCES_TABLE,
    connect,
    open_table,
    writing,
)
from ctxlake.tasks.store import paths_filter, slices, sql_list, sql_str
from ctxlake.tasks.upkeep import compact

if TYPE_CHECKING:
    from lancedb.table import Table

# Keys of a fact: a batch's rows are deduplicated on them (one row per fact).
KEYS: dict[str, list[str]] = {
    DEFINITIONS_TABLE: ["source", "path", "qualname", "start_line"],
    REFERENCES_TABLE: ["source", "path", "line", "name", "kind"],
    IMPORTS_TABLE: ["source", "path", "module"],
}
SCHEMAS = {DEFINITIONS_TABLE: DEFINITIONS, REFERENCES_TABLE: REFERENCES, IMPORTS_TABLE: IMPORTS}


class GraphTables(NamedTuple):
    definitions: Table
    refs: Table
    imports: Table


def open_graph(lake_dir: Path) -> GraphTables:
    """The three graph tables, created with their declared schemas when missing."""
    with writing(f"the graph tables at {lake_dir}"):
        db = connect(lake_dir, create=True)
        out = []
        for name, schema in SCHEMAS.items():
            table = open_table(db, name)
            out.append(table if table is not None else db.create_table(name, schema=schema))
    return GraphTables(*out)


def clear_graph(tables: GraphTables, source: str) -> None:
    """Drop a source's graph rows (the graph was switched off: no stale answers stay behind)."""
    where = f"source = {sql_str(source)}"
    for name, table in zip(SCHEMAS, tables, strict=True):
        if table.count_rows(where):
            with writing(name):
                table.delete(where)


def dedupe(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """First row per key: `f(f(x))` names f twice on one line, one fact for the graph."""
    if table.num_rows == 0:
        return table
    idx = pa.array(range(table.num_rows), pa.int64())
    grouped = table.select(list(key)).append_column("_i", idx).group_by(list(key), use_threads=False)
    firsts = grouped.aggregate([("_i", "min")]).column("_i_min")
    return table.take(firsts)


def write_graph(
    tables: GraphTables,
    source: str,
    rows: tuple[pa.Table, pa.Table, pa.Table],
    paths: Sequence[str],
    cold: bool,
) -> int:
    """The graph rows of `paths` (changed or removed) replace what the lake held for them.

    A delete of those paths' rows, then an append: two commits, so a reader may miss these files'
    rows for the moment between them (the chunks' upsert does the same). Not a merge on the facts'
    keys: a merge joins against every row of the table with all its columns, for any number of
    paths (the big repository's 2.8M graph rows: 1.0 s and +0.73 GB for a batch of 12 files or of
    241, against 0.15-0.17 s and +12-21 MB this way; docs/measurements/indexing.md, "One big
    repository").
    """
    if not paths:
        return 0
    where = paths_filter(source, paths)
    written = 0
    for table, (name, new) in zip(tables, zip(SCHEMAS, rows, strict=True), strict=True):
        new = dedupe(new, KEYS[name])
        written += new.num_rows
        with writing(name):
            if not cold:
                table.delete(where)
            if new.num_rows:
                table.add(new)
    return written


# Removed paths per IN list when looking for the imports that named them.
REMOVED_PER_QUERY = 500
# Added files' stems matched in one query; more added files read every unresolved import instead.
STEMS_PER_QUERY = 50


def reresolve_imports(tables: GraphTables, source: str, added: Collection[str], removed: Collection[str],
                      rewritten: Collection[str], known: Collection[str]) -> int:
    """Resolve again the imports of files this run did not rewrite whose answer the run's new and
    removed paths change: an import resolved to a file now gone, or unresolved while files came.
    (`from util import helper` kept pointing at a deleted util.py, and `from later import f` stayed
    unresolved after later.py was added, until a forced run.) Each importer's rows are rewritten
    whole; returns how many rows changed."""
    from ctxlake.tasks.chunk import language_for
    from ctxlake.tasks.graph import known_paths, resolve_import

    if not added and not removed:
        return 0
    table = tables.imports
    columns = ["source", "path", "module", "resolved"]
    where = [f"resolved IN {sql_list(chunk)}" for chunk in slices(sorted(removed), REMOVED_PER_QUERY)]
    if added:
        # Only imports that name an added file's stem can resolve to it (`later` for later.py, the
        # folder for a package's __init__.py or index.js): a run that adds a few files reads a few
        # rows, not every unresolved import (thousands of stdlib and third-party ones).
        # (An `_` in a stem matches any character in LIKE: a few more rows, never fewer.)
        stems = sorted({_stem(p) for p in added})
        if len(stems) <= STEMS_PER_QUERY and all(stem and "%" not in stem and "\\" not in stem for stem in stems):
            like = " OR ".join(f"module LIKE {sql_str('%' + stem + '%')}" for stem in stems)
            where.append(f"resolved IS NULL AND ({like})")
        else:
            where.append("resolved IS NULL")
    skip = set(rewritten)
    index = known_paths(set(known) - set(removed))
    stale: set[str] = set()
    for condition in where:
        rows = table.search().where(f"source = {sql_str(source)} AND ({condition})").select(columns).limit(None)
        for row in rows.to_arrow().to_pylist():
            if row["path"] in skip or row["path"] in stale:
                continue
            if resolve_import(row["module"], row["path"], language_for(row["path"]) or "", index) != row["resolved"]:
                stale.add(row["path"])
    if not stale:
        return 0
    where_stale = paths_filter(source, sorted(stale))
    old = table.search().where(where_stale).select(columns).limit(None).to_arrow()
    resolved = [resolve_import(m, p, language_for(p) or "", index)
                for m, p in zip(old.column("module").to_pylist(), old.column("path").to_pylist(), strict=True)]
    changed = sum(a != b for a, b in zip(resolved, old.column("resolved").to_pylist(), strict=True))
    new = old.set_column(old.schema.get_field_index("resolved"), "resolved", pa.array(resolved, pa.string()))
    with writing(IMPORTS_TABLE):
        table.delete(where_stale)
        table.add(new.cast(IMPORTS))
    return changed


def _stem(path: str) -> str:
    """The name an import uses for `path`: its file name without extension, or its folder's name
    for a package's or module's index file."""
    parts = path.split("/")
    name = parts[-1].split(".", 1)[0]
    if name in ("__init__", "index", "mod", "lib") and len(parts) > 1:
        return parts[-2]
    return name


# Columns the read API filters on: a BTREE index turns `name = 'render'` from a scan of every
# reference into a lookup (find_references, find_definition, related_files, file_outline).
SCALAR_INDEXES: dict[str, tuple[str, ...]] = {
    DEFINITIONS_TABLE: ("name", "path"),
    REFERENCES_TABLE: ("name",),
    IMPORTS_TABLE: ("path", "resolved"),
}


def optimize_graph(tables: GraphTables, whole: bool = False) -> None:
    """Compact the graph tables (one fragment per batch otherwise), fold new rows into their
    scalar indexes in size tiers, and create the indexes a table with rows still lacks. `whole`
    as for the chunks (tasks/store.py `optimize`)."""
    from lancedb.index import BTree

    for table, name in zip(tables, SCHEMAS, strict=True):
        with writing(f"the {name} table (optimize)"):
            if table.count_rows() == 0:
                continue
            compact(table, whole=whole, tiered=True)
            have = {tuple(idx.columns) for idx in table.list_indices()}
            for column in SCALAR_INDEXES[name]:
                if (column,) not in have:
                    table.create_index(column, config=BTree(), replace=True)

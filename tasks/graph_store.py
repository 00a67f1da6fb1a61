"""Store stage for the symbol graph: DEFINITIONS, REFERENCES (table `refs`) and IMPORTS rows of
changed/removed files -> LanceDB, one merge_insert per table and batch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from ctxlake.schemas.tables import DEFINITIONS, IMPORTS, REFERENCES
from ctxlake.tasks.lake import connect, open_table, writing
from ctxlake.tasks.store import KEEP_VERSIONS, paths_filter, sql_str

if TYPE_CHECKING:
    from lancedb.table import Table

DEFINITIONS_TABLE = "definitions"
# `references` is a reserved word in SQL: `ctx sql` could not name the table without quotes.
REFERENCES_TABLE = "refs"
IMPORTS_TABLE = "imports"

# Merge keys: a row with the same key is the same fact (kept); other rows of the batch's paths go.
KEYS: dict[str, list[str]] = {
    DEFINITIONS_TABLE: ["source", "path", "qualname", "start_line"],
    REFERENCES_TABLE: ["source", "path", "line", "name", "kind"],
    IMPORTS_TABLE: ["source", "path", "module"],
}
SCHEMAS = {DEFINITIONS_TABLE: DEFINITIONS, REFERENCES_TABLE: REFERENCES, IMPORTS_TABLE: IMPORTS}
# The columns the readers filter on: a B-tree each turns a scan of django's 640k refs into a lookup
# (find_references 45 -> 12 ms in process).
LOOKUP_COLUMNS: dict[str, tuple[str, ...]] = {
    DEFINITIONS_TABLE: ("name",), REFERENCES_TABLE: ("name",), IMPORTS_TABLE: ("resolved", "path"),
}


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


def optimize_graph(tables: GraphTables) -> None:
    """Compact the graph tables and give their lookup columns a B-tree (built once; later rows are
    folded in by optimize, and rows not yet folded in are still found by a scan)."""
    from lancedb.index import BTree

    for name, table in zip(SCHEMAS, tables, strict=True):
        with writing(f"the {name} table (optimize)"):
            if table.count_rows() == 0:
                continue
            indexed = {c for idx in table.list_indices() for c in idx.columns}
            for column in LOOKUP_COLUMNS[name]:
                if column not in indexed:
                    table.create_index(column, config=BTree(), replace=True)
            table.optimize(cleanup_older_than=KEEP_VERSIONS)


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
    """The graph rows of `paths` (changed or removed) replace what the lake held for them."""
    if not paths:
        return 0
    where = paths_filter(source, paths)
    written = 0
    for table, (name, new) in zip(tables, zip(SCHEMAS, rows, strict=True), strict=True):
        if name != REFERENCES_TABLE:  # graph_rows keeps one ref per key already (the biggest table)
            new = dedupe(new, KEYS[name])
        written += new.num_rows
        with writing(name):
            if cold:
                if new.num_rows:
                    table.add(new)
                continue
            (
                table.merge_insert(KEYS[name])
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(where)
                .execute(new)
            )
    return written

"""Store stage: upsert CHUNKS and FILES rows into LanceDB, one transaction per batch; FTS and optimize."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import pyarrow as pa

from ctxlake.errors import LakeError
from ctxlake.schemas.tables import FILES, chunks_schema
from ctxlake.tasks.heap import give_back_freed_memory
from ctxlake.tasks.lake import (
    CHUNKS_TABLE,
    FILES_TABLE,
    connect,
    lance_message,
    open_table,
    resource_error,
    writing,
)
from ctxlake.tasks.stage import stage
from ctxlake.tasks.upkeep import compact

if TYPE_CHECKING:
    import lancedb
    from lancedb.table import Table

# The columns BM25 searches: code text, and the words the tokenizer cannot see in it.
FTS_COLUMNS = ("text", "terms")
# Rows a vector search scans flat before an ANN index pays for itself. `bench bigrepo
# --ann-crossover` (static model, 256 dims, 2 cores at load 4-10): a flat scan's p50 is 14 ms at
# 10k rows, 17 ms at 25k, 67 ms at 50k, 234 ms at 100k (past the 50 ms query budget between 25k
# and 50k), an IVF_HNSW_SQ index answers in 3-8 ms at every size up to 500k. That points at ~40k,
# but django's lake (46,745 chunks) sits between the two and every retrieval figure (README,
# "Retrieval quality"; docs/measurements/retrieval.md) was measured with its flat scan: the
# threshold stays at 50k until the evaluation is re-run with an index (recall@10 0.95-0.99
# against flat at ANN_EF 100).
ANN_MIN_ROWS = 50_000
# Rows per IVF partition, each with its own HNSW graph: lance's default makes one graph of all
# rows (the 590k-row bench run spent ~10 min in the optimize stage that built it); in partitions
# it took 4.2 min at 500k rows, with recall@10 against the flat answer of 0.93-0.97 at lance's
# query defaults where the one graph gave 0.88-0.94 (same bench, 10k-500k rows).
ANN_PARTITION_ROWS = 8_192


def fragment_count(table: Table) -> int:
    stats: Any = table.stats()  # typed as a dataclass, returned as a dict (lancedb 0.40)
    return int(stats["fragment_stats"]["num_fragments"] if isinstance(stats, dict)
               else stats.fragment_stats.num_fragments)


# CHUNKS' `id` gets a BTree index before the embed stage writes vectors back. A write-back is a
# merge of (id, vector) rows by id: with an index that covers the rows, Lance finds them through it
# and writes the vector column of the fragments holding them (the row keeps its place, and stays
# inside the BM25 index, which a rewritten row left until the run's optimize); without one it joins
# against the whole table with every column of every row in memory (on the big repository's 577k
# chunks each write of 16,384 vectors peaked at ~1.35 GB). Rows appended after the index was built
# fall back to that join, so the stage rebuilds it first when some are outside it (~0.1 s at 300k
# rows). Not before each write, though each drops the fragments it touched from the index: a
# window's rows lie in a few fragments and Lance scans just those, while a rebuild per write grew
# the process by ~55 MB a window (LanceDB's index cache kept every version: a session with small
# caches stayed flat); one per stage kept the stage's peak under 1 GB.
KEY_COLUMN = "id"


def ensure_key_index(table: Table, rebuild: bool = True) -> bool:
    """A BTree index on `table`'s KEY_COLUMN covering every row (with `rebuild`; without, only one
    that is missing is built); True if it was (re)built now."""
    from lancedb.index import BTree

    if table.count_rows() == 0:
        return False
    index = next((idx for idx in table.list_indices() if idx.columns == [KEY_COLUMN]), None)
    if index is not None and (not rebuild or not index.num_unindexed_rows):
        return False
    with writing("the chunk id index"):
        table.create_index(KEY_COLUMN, config=BTree(), replace=True)
    return True


class LakeTables(NamedTuple):
    db: lancedb.DBConnection
    chunks: Table
    files: Table


def open_for_write(lake_dir: Path, dims: int) -> LakeTables:
    """The lake's tables, created with their declared schemas when missing."""
    with writing(f"the lake at {lake_dir}"):
        db = connect(lake_dir, create=True)
        # `is None`, not `or`: a LanceTable with no rows is falsy (it has __len__), and creating
        # it again fails with "already exists" (an empty repo, or a source whose files all went).
        chunks = open_table(db, CHUNKS_TABLE)
        if chunks is None:
            chunks = db.create_table(CHUNKS_TABLE, schema=chunks_schema(dims))
        files = open_table(db, FILES_TABLE)
        if files is None:
            files = db.create_table(FILES_TABLE, schema=FILES)
    return LakeTables(db, chunks, files)

_T = TypeVar("_T")


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def slices(items: Sequence[_T], size: int) -> list[list[_T]]:
    """`items` in lists of at most `size`, in order: batches of files, or values for one IN each."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def sql_list(values: Iterable[str]) -> str:
    """`values` as an SQL list of strings, for IN: `('a', 'b')`."""
    return "(" + ", ".join(sql_str(v) for v in values) + ")"


def paths_filter(source: str, paths: Iterable[str]) -> str:
    return f"source = {sql_str(source)} AND path IN {sql_list(paths)}"


class UpsertResult(NamedTuple):
    inserted: int
    deleted: int


@stage("upsert", retries=2)
def upsert(
    tables: LakeTables, source: str, chunks: pa.Table, files: pa.Table, paths: Sequence[str]
) -> UpsertResult:
    """CHUNKS + FILES rows of `paths` (changed or removed) -> the lake, replacing those paths.

    Chunk ids hash (source, path, lines, symbol, content), so an id already present is the very
    same row: it is kept as is (with its vector). New ids go in first, then the rows of these paths
    that the batch no longer has are deleted: two commits, because a merge that also deletes by
    source joins against the whole table (on the 577k-chunk big repository, a one-file edit's merge
    took 0.53 s and +0.6 GB; an insert through the id index and a delete took 0.11 s and ~10 MB).
    Between the two a reader may see a changed file's old and new chunks together, and while FILES
    is replaced, a moment without these paths' rows; a crash there, or between the chunks and
    FILES, leaves the batch in the run's journal, and the next run redoes these paths (every step
    is idempotent).
    """
    if not paths:
        return UpsertResult(0, 0)
    where = paths_filter(source, paths)
    ids = chunks.column("id").to_pylist()
    inserted = 0
    with writing("chunks"):
        if ids:
            # A null vector is "not embedded yet", which lancedb calls a bad vector unless told.
            result = tables.chunks.merge_insert("id").when_not_matched_insert_all().execute(chunks, on_bad_vectors="null")
            inserted = result.num_inserted_rows
        keep = f" AND id NOT IN {sql_list(ids)}" if ids else ""
        gone = tables.chunks.delete(where + keep)
        deleted = int(gone.num_deleted_rows)  # type: ignore[attr-defined]  # set at run time; lancedb 0.40's stub lists `version` only
    with writing("the files table"):
        # Delete and append, as for the chunks: a merge by (source, path) joined the whole table
        # (the big repository's 96k files: 62 ms and +42 MB for a 12-file edit, against 28 ms and +10 MB).
        tables.files.delete(where)
        if files.num_rows:
            tables.files.add(files)
    return UpsertResult(inserted, deleted)


def append_chunks(tables: LakeTables, chunks: pa.Table, files: pa.Table) -> None:
    """Cold-index fast path: plain appends into tables known to hold none of these paths."""
    with writing("chunks"):
        tables.chunks.add(chunks, on_bad_vectors="null")
    with writing("the files table"):
        tables.files.add(files)


# Code is not English prose: no stemming (measured: no gain on the dev set) or stop words, so
# `get`, `for`, `is_` survive. Positions make phrase queries possible, which exact identifier
# matching needs (`ordering_parts` is the phrase "ordering parts" to this tokenizer).
FTS_OPTIONS = {"stem": False, "remove_stop_words": False, "with_position": True}
# Recorded in state.json by each run, so the no-op check knows when an index needs a rebuild.
FTS_TAG = ",".join(f"{k}={int(v)}" for k, v in sorted(FTS_OPTIONS.items()))


def fts_current(table: Table) -> set[str]:
    """The FTS_COLUMNS whose BM25 index exists and was built with FTS_OPTIONS."""
    current: set[str] = set()
    for idx in table.list_indices():
        if idx.index_type != "FTS":
            continue
        details = getattr(idx, "index_details", None) or {}
        if all(details.get(k, v) == v for k, v in FTS_OPTIONS.items()):
            current.update(c for c in idx.columns if c in FTS_COLUMNS)
    return current


def has_fts(table: Table) -> bool:
    return fts_current(table) >= set(FTS_COLUMNS)


@stage("fts-index")
def build_fts(tables: LakeTables) -> bool:
    """CHUNKS -> its BM25 indexes on text and terms; True when any was (re)built now.

    An index built with other options (an older ctxlake) is rebuilt in place: it takes seconds.
    """
    from lancedb.index import FTS

    if tables.chunks.count_rows() == 0:
        return False
    missing = [c for c in FTS_COLUMNS if c not in fts_current(tables.chunks)]
    for column in missing:
        config = FTS(stem=FTS_OPTIONS["stem"], remove_stop_words=FTS_OPTIONS["remove_stop_words"],
                     with_position=FTS_OPTIONS["with_position"])
        with writing("the full-text index"):
            tables.chunks.create_index(column, config=config, replace=True)
    return bool(missing)


@stage("optimize")
def optimize(tables: LakeTables, ann: bool = True, whole: bool = False) -> None:
    """Fold new rows into the indexes, compact fragments, drop versions no reader still needs.

    In size tiers (tasks/upkeep.py): an optimize after an edit rewrites about what the edit wrote,
    not the table and its indexes; a forced run that rewrote every row rewrites them all. `whole`
    merges every fragment (a cold run's batches).
    """
    with writing("the lake (optimize)"):
        for table in (tables.chunks, tables.files):
            compact(table, whole=whole, tiered=True)
        if ann:
            give_back_freed_memory()  # the compaction's buffers, before the index build's
            _maybe_ann_index(tables.chunks)


def vector_indexes(table: Table) -> list[str]:
    """Names of `table`'s indexes on its vector column (the ANN index, if it has one)."""
    return [idx.name for idx in table.list_indices() if idx.columns == ["vector"]]


def _maybe_ann_index(chunks: Table) -> None:
    if vector_indexes(chunks):
        return
    from lancedb.index import HnswSq

    embedded = chunks.count_rows("vector IS NOT NULL")
    if embedded >= ANN_MIN_ROWS:
        config = HnswSq(distance_type="cosine", num_partitions=max(4, embedded // ANN_PARTITION_ROWS))
        chunks.create_index("vector", config=config)


def indexed_paths(tables: LakeTables, source: str) -> set[str]:
    rows = tables.files.search().where(f"source = {sql_str(source)}").select(["path"]).to_arrow()
    return set(rows.column("path").to_pylist())


def delete_source(tables: LakeTables, source: str) -> None:
    with writing(f"the lake (removing {source})"):
        tables.chunks.delete(f"source = {sql_str(source)}")
        tables.files.delete(f"source = {sql_str(source)}")


def drop_unreadable(lake_dir: Path) -> list[str]:
    """Before `ctx run index --force`: tables whose files Lance cannot read (a truncated data file,
    lost manifests) are dropped, and indexes whose files are gone, so the run rebuilds them from
    the source files and the embedding cache; a note per thing dropped.

    Reads one column of every table and asks each index one question: seconds on a big lake, and
    only on a forced run.
    """
    if not lake_dir.is_dir():
        return []
    notes: list[str] = []
    db = connect(lake_dir)
    for folder in sorted(lake_dir.glob("*.lance")):
        name = folder.name.removesuffix(".lance")
        try:
            table = db.open_table(name)
            table.search().select([table.schema.names[0]]).limit(None).to_arrow()
        except (OSError, RuntimeError, ValueError) as exc:
            if resource_error(exc):
                raise LakeError(f"cannot read the lake's {name} table: {lance_message(exc)}",
                                hint="fix the cause and re-run") from exc
            shutil.rmtree(folder)
            notes.append(f"the lake's {name} table could not be read ({lance_message(exc)}): rebuilt")
            continue
        for idx in table.list_indices():
            try:
                _ask_index(table, idx.columns[0], str(idx.index_type))
            except (OSError, RuntimeError, ValueError) as exc:
                if resource_error(exc):
                    raise LakeError(f"cannot read an index of the lake's {name} table: {lance_message(exc)}",
                                    hint="fix the cause and re-run") from exc
                with writing(f"the lake's {name} table"):
                    table.drop_index(idx.name)
                notes.append(f"the {idx.name} index of the lake's {name} table could not be read: rebuilt")
    return notes


def _ask_index(table: Table, column: str, kind: str) -> None:
    """One query that has to read `column`'s index (its files gone: Lance raises "Not found")."""
    first = table.schema.names[0]
    if "FTS" in kind.upper():
        table.search("probe", query_type="fts", fts_columns=column).select([first]).limit(1).to_arrow()
    elif table.schema.field(column).type.equals(pa.string()):
        table.search().where(f"{column} = 'probe'").select([first]).limit(1).to_arrow()
    elif pa.types.is_fixed_size_list(table.schema.field(column).type):
        dims = table.schema.field(column).type.list_size
        table.search([0.0] * dims, vector_column_name=column).select([first]).limit(1).to_arrow()

"""Store stage for conversation memory: Msg rows -> MESSAGES, SESSIONS rows -> SESSIONS, in the user-wide lake; vectors and FTS."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import xxhash

from ctxlake.errors import LakeError
from ctxlake.schemas.tables import KNOWLEDGE, MESSAGES, SESSIONS, with_vector_width
from ctxlake.tasks.embed import ENCODE_GROUP, cached_vectors, fill_from_cache, with_vectors
from ctxlake.tasks.embed_cache import EmbeddingCache, vector_array
from ctxlake.tasks.lake import connect, open_table
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.scrape.base import Msg
from ctxlake.tasks.stage import stage
from ctxlake.tasks.store import sql_str, vector_indexes
from ctxlake.tasks.upkeep import compact, index_deltas

if TYPE_CHECKING:
    import lance
    import lancedb
    from lancedb.table import Table

    from ctxlake.tasks.embedder_base import Embedder

MESSAGES_TABLE = "messages"
SESSIONS_TABLE = "sessions"
KNOWLEDGE_TABLE = "knowledge"
# Tool results and compaction markers are searchable by keyword; only what people and agents
# wrote is worth a vector (and an embedding pass over every tool output would take hours).
EMBED_WHERE = {
    MESSAGES_TABLE: "vector IS NULL AND role IN ('user', 'assistant') AND kind = 'text' AND length(text) > 0",
    SESSIONS_TABLE: "vector IS NULL",
    KNOWLEDGE_TABLE: "vector IS NULL",
}
WRITE_ROWS = 16_384  # vectors per merge into the table (a crash loses at most these; the cache keeps the rest)
READ_IDS = 500  # ids per IN (...) filter


def content_hash(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


class MemoryTables(NamedTuple):
    db: lancedb.DBConnection
    messages: Table
    sessions: Table


def _open_or_create(db: lancedb.DBConnection, name: str, schema: pa.Schema) -> Table:
    # Not `open_table(...) or create`: a LanceTable with no rows is falsy (its len is its row count).
    table = open_table(db, name)
    return db.create_table(name, schema=schema) if table is None else table


def open_memory(memory_dir: Path, dims: int) -> MemoryTables:
    """The user-wide memory lake's tables, created with their declared schemas when missing."""
    try:
        db = connect(memory_dir, create=True)
        messages = _open_or_create(db, MESSAGES_TABLE, with_vector_width(MESSAGES, dims))
        sessions = _open_or_create(db, SESSIONS_TABLE, with_vector_width(SESSIONS, dims))
    except OSError as exc:
        raise LakeError(f"cannot open the memory lake at {memory_dir}: {exc}") from exc
    return MemoryTables(db, messages, sessions)


def open_knowledge(lake_dir: Path, dims: int) -> Table:
    try:
        return _open_or_create(connect(lake_dir, create=True), KNOWLEDGE_TABLE, with_vector_width(KNOWLEDGE, dims))
    except OSError as exc:
        raise LakeError(f"cannot open the lake at {lake_dir}: {exc}") from exc


def vector_width(table: Table) -> int:
    vtype = table.schema.field("vector").type
    return int(vtype.list_size) if isinstance(vtype, pa.FixedSizeListType) else -1


def reset_vectors(table: Table, dims: int) -> None:
    """Drop every vector (another model, maybe another width); rows stay, the cache refills them."""
    for name in vector_indexes(table):  # trained on the old vectors: rebuilt once the new ones are in
        table.drop_index(name)
    table.drop_columns(["vector"])
    table.add_columns(pa.field("vector", pa.list_(pa.float32(), dims)))


def messages_table(msgs: Sequence[Msg], dims: int) -> pa.Table:
    """Msg rows -> MESSAGES rows (ids, content hashes; null vectors), first copy of an id kept."""
    seen: set[str] = set()
    rows = []
    for m in msgs:
        mid = m.id
        if mid in seen:
            continue
        seen.add(mid)
        rows.append({
            "id": mid, "tool": m.tool, "session_id": m.session_id, "project_path": m.project_path,
            "timestamp": m.timestamp, "seq": m.seq, "role": m.role, "kind": m.kind, "text": m.text,
            "terms": " ".join([*(f"{c['name']} {c['input']}" for c in m.tool_calls), *m.files]),
            "tool_calls": m.tool_calls or None, "files": m.files or None, "tokens_in": m.tokens_in,
            "tokens_out": m.tokens_out, "tokens_cached": m.tokens_cached, "model": m.model, "agent": m.agent,
            "parent_id": m.parent_id if isinstance(m.parent_id, str) else None, "source_file": m.source_file,
            "content_hash": content_hash(m.text), "vector": None,
        })
    return pa.Table.from_pylist(rows, schema=with_vector_width(MESSAGES, dims))


class StoreResult(NamedTuple):
    inserted: int
    updated: int
    duplicates: int  # rows whose id the lake already had (resumed or forked copies, re-reads)
    unembedded: int = 0  # rows written without the vector they should have (left to embed_table)
    embedded: int = 0  # texts the model encoded for this write


# Writes up to this many rows get their vectors before they are stored: a small ingest then needs
# neither embed_table's scan for null vectors nor its merge by id, both of which read the whole
# table (0.5 s of a one-session ingest at 2,000 sessions, growing with the history). Bigger writes
# (a cold ingest) are stored first, keyword-searchable at once, and embedded afterwards, unless
# the embedder is `cheap` (the static profile): then every write is embedded first, which spares
# a cold ingest the second pass over the whole table (20,000 sessions: 1.1 -> 2.3 GB, 5 minutes).
INLINE_EMBED_ROWS = 2_048


def embeds_inline(rows: pa.Table, embedder: Embedder) -> bool:
    return rows.num_rows <= INLINE_EMBED_ROWS or bool(getattr(embedder, "cheap", False))


def wants_vector(rows: pa.Table, name: str, messages: bool = True) -> pa.ChunkedArray | pa.Array:
    """Which of `rows` should carry a vector and have none: EMBED_WHERE, on rows not yet written."""
    import pyarrow.compute as pc

    missing = pc.is_null(rows.column("vector"))
    if name != MESSAGES_TABLE:
        return missing
    if not messages:
        return pa.array([False] * rows.num_rows)
    spoken = pc.is_in(rows.column("role"), pa.array(["user", "assistant"]))
    text = pc.and_(pc.equal(rows.column("kind"), "text"), pc.greater(pc.utf8_length(rows.column("text")), 0))
    return pc.fill_null(pc.and_(pc.and_(missing, spoken), text), False)


def embed_rows(rows: pa.Table, name: str, cache: EmbeddingCache, embedder: Embedder,
               messages: bool = True) -> tuple[pa.Table, int]:
    """Rows about to be written -> the same rows with a vector on each that should have one (the
    cache first, then the model; new vectors go to the cache); (rows, texts encoded)."""
    hashes = rows.column("content_hash").to_pylist()
    matrix, have = cached_vectors(hashes, cache)
    if have.any():
        rows = with_vectors(rows, matrix, have, cache.dims)  # wants_vector asks which are still null
    wanted = np.asarray(wants_vector(rows, name, messages).to_numpy(zero_copy_only=False), dtype=bool)
    if not wanted.any():
        return rows, 0
    texts = rows.column("text")
    first: dict[str, int] = {}  # each wanted content once, by the first row that has it
    for i in np.flatnonzero(wanted).tolist():
        first.setdefault(hashes[i], i)
    todo = list(first)
    fresh = embedder.embed_documents([texts[first[h]].as_py() for h in todo])
    cache.put_many(todo, fresh)
    # Arrays, not Python lists of floats: a cold ingest's 16 MB group is ~20k rows x 256 floats.
    slot = {h: k for k, h in enumerate(todo)}
    picked = np.flatnonzero(wanted)
    matrix[picked] = fresh[[slot[hashes[i]] for i in picked.tolist()]]
    return with_vectors(rows, matrix, have | wanted, cache.dims), len(todo)


def _unembedded(rows: pa.Table, name: str, messages: bool) -> int:
    return int(sum(wants_vector(rows, name, messages).to_pylist()))


class RunIds:
    """The ids of every message row in a table that was empty when this run began (all of them
    this run's own writes), as 64-bit hashes: 8 bytes a row.

    Append-only rows whose hash is not among them cannot be in the table and are appended, which
    spares LanceDB's merge by id: a hash join over the whole table, whose memory stays with the
    process and grows with the table (~200 MB more by 1M rows, in a loop of merges apart from the
    ingest). A row whose hash is there (a resumed or forked copy, a re-read, or a collision) still
    goes through the merge, which decides exactly.
    """

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []  # each sorted; folded into one when they pile up

    @staticmethod
    def hashes(ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
        return np.fromiter((xxhash.xxh3_64_intdigest(i.encode("utf-8", "surrogatepass")) for i in ids.to_pylist()),
                           np.uint64, len(ids))

    def known(self, hashes: np.ndarray) -> np.ndarray:
        """Which of `hashes` may already be stored."""
        hit = np.zeros(len(hashes), bool)
        for part in self._parts:
            hit |= part[np.searchsorted(part, hashes).clip(max=len(part) - 1)] == hashes
        return hit

    def add(self, hashes: np.ndarray) -> None:
        if len(hashes):
            self._parts.append(np.sort(hashes))
        if len(self._parts) > 16:
            self._parts = [np.sort(np.concatenate(self._parts))]


@stage("store-messages", retries=2)
def store_messages(tables: MemoryTables, rows: pa.Table, mutable: bool, cache: EmbeddingCache | None,
                   embedder: Embedder | None = None, messages: bool = True, run_ids: RunIds | None = None) -> StoreResult:
    """MESSAGES rows -> the lake: new ids inserted; existing ids kept (append-only logs) or replaced (mutable stores).

    With an `embedder`, a write of up to INLINE_EMBED_ROWS rows (any write, if the embedder is cheap)
    is embedded before it is stored. With `run_ids` (the table was empty when the run began),
    append-only rows it shows to be new are appended without a merge.
    """
    if rows.num_rows == 0:
        return StoreResult(0, 0, 0)
    encoded = 0
    if cache is not None:
        if embedder is not None and embeds_inline(rows, embedder):
            rows, encoded = embed_rows(rows, MESSAGES_TABLE, cache, embedder, messages)
        else:
            rows, _ = fill_from_cache(rows, cache)
    unembedded = _unembedded(rows, MESSAGES_TABLE, messages)
    hashes = RunIds.hashes(rows.column("id")) if run_ids is not None else None
    appended = 0
    if run_ids is not None and hashes is not None and not mutable:
        known = run_ids.known(hashes)
        if not known.all():
            # Noted first: should the append fail after its commit, the stage's retry merges them.
            run_ids.add(hashes[~known])
            tables.messages.add(rows.filter(pa.array(~known)), on_bad_vectors="null")
            appended = int((~known).sum())
        rows, hashes = rows.filter(pa.array(known)), hashes[known]
        if rows.num_rows == 0:
            return StoreResult(appended, 0, 0, unembedded, encoded)
    if run_ids is not None and hashes is not None:
        run_ids.add(hashes)
    if tables.messages.count_rows() == 0:
        tables.messages.add(rows, on_bad_vectors="null")
        inserted, updated = rows.num_rows, 0
    else:
        builder = tables.messages.merge_insert("id")
        if mutable:
            builder = builder.when_matched_update_all()
        result = builder.when_not_matched_insert_all().execute(rows, on_bad_vectors="null")
        inserted = result.num_inserted_rows
        updated = result.num_updated_rows if mutable else 0
    return StoreResult(appended + inserted, updated, rows.num_rows - inserted - updated, unembedded, encoded)


def read_rows(table: Table, column: str, values: Iterable[str], columns: list[str] | None = None,
              where: str | None = None) -> pa.Table:
    """Rows whose `column` is one of `values`, read in batches of IN (...) lists."""
    values = list(dict.fromkeys(values))
    parts = []
    for start in range(0, len(values), READ_IDS):
        chunk = values[start : start + READ_IDS]
        cond = f"{column} IN ({', '.join(sql_str(v) for v in chunk)})" + (f" AND ({where})" if where else "")
        query = table.search().where(cond)
        if columns:
            query = query.select(columns)
        parts.append(query.limit(None).to_arrow())
    if not parts:
        return table.search().limit(0).to_arrow() if not columns else table.search().select(columns).limit(0).to_arrow()
    return pa.concat_tables(parts)


@stage("store-sessions", retries=2)
def store_sessions(sessions: Table, rows: pa.Table, where: str, cache: EmbeddingCache,
                   embedder: Embedder | None = None) -> StoreResult:
    """SESSIONS rows of the touched sessions -> the lake, replacing every stored segment of them
    (a re-split session may have fewer); with an `embedder`, small writes are embedded first.

    Delete and append (two commits): a merge by id that also deleted the sessions' other segments
    joined the whole table (20,000 sessions: 20 ms and up to +0.1 GB a batch of 5, against 11 ms
    and ~2 MB). A reader between the two misses these sessions for a moment; a crash there leaves
    them in the touched journal, and the next run summarizes them again.
    """
    encoded = 0
    if embedder is not None and embeds_inline(rows, embedder):
        rows, encoded = embed_rows(rows, SESSIONS_TABLE, cache, embedder)
    else:
        rows, _ = fill_from_cache(rows, cache)
    if where:
        sessions.delete(where)
    if rows.num_rows:
        sessions.add(rows, on_bad_vectors="null")
    return StoreResult(rows.num_rows, 0, 0, _unembedded(rows, SESSIONS_TABLE, True), encoded)


@stage("embed-memory")
def embed_table(table: Table, name: str, cache: EmbeddingCache, embedder: Embedder, messages: bool = True) -> int:
    """Rows of a memory table without a vector -> vectors from the cache, else the model; texts embedded.

    Streamed WRITE_ROWS rows at a time: a cold ingest of a long history has a million rows to
    embed, and holding their texts, hashes and cached vectors at once took gigabytes.
    """
    where = EMBED_WHERE[name]
    if name == MESSAGES_TABLE and not messages:
        return 0
    total = table.count_rows(where)
    if total == 0:
        return 0
    progress = reporter()
    progress.start(f"embed-{name}", total, f"embed {name}")
    embedded = 0
    try:
        # The reader keeps the version it opened; the merges below commit newer ones beside it.
        reader = table.search().where(where).select(["id", "content_hash", "text"]).limit(None).to_batches(WRITE_ROWS)
        for batch in reader:
            embedded += _embed_batch(table, batch, cache, embedder, lambda n: progress.advance(f"embed-{name}", n))
    finally:
        progress.finish(f"embed-{name}")
    if embedded:
        cache.maintain()
    return embedded


def _embed_batch(table: Table, batch: pa.RecordBatch, cache: EmbeddingCache, embedder: Embedder,
                 advance: Callable[[int], None]) -> int:
    """One batch of rows without vectors -> vectors written (the cache's, then new ones); texts encoded.
    `advance` hears of rows done as they are."""
    ids_by_hash: dict[str, list[str]] = {}
    text_by_hash: dict[str, str] = {}
    for cid, h, text in zip(batch.column("id").to_pylist(), batch.column("content_hash").to_pylist(),
                            batch.column("text").to_pylist(), strict=True):
        ids_by_hash.setdefault(h, []).append(cid)
        text_by_hash[h] = text
    cached = cache.get_many(list(ids_by_hash))
    if cached:
        _write_vectors(table, cached, ids_by_hash, cache.dims)
        advance(sum(len(ids_by_hash[h]) for h in cached))
    # Shortest first: groups of similar length pad less inside the model.
    todo = sorted((h for h in ids_by_hash if h not in cached), key=lambda h: len(text_by_hash[h]))
    fresh: dict[str, np.ndarray] = {}
    # Asked only when there is work: a GPU embedder answers after loading its model.
    step = (getattr(embedder, "encode_group", None) if todo else None) or ENCODE_GROUP
    for start in range(0, len(todo), step):
        group = todo[start : start + step]
        fresh.update(zip(group, embedder.embed_documents([text_by_hash[h] for h in group]), strict=True))
        advance(sum(len(ids_by_hash[h]) for h in group))
    if fresh:
        # Cache first: a crash after it costs a lookup, not a re-embed. Each merge joins against
        # the whole table: one per batch, not one per encode group.
        cache.put_many(list(fresh), np.stack(list(fresh.values())))
        _write_vectors(table, fresh, ids_by_hash, cache.dims)
    return len(todo)


def _write_vectors(table: Table, vectors: dict[str, np.ndarray], ids_by_hash: dict[str, list[str]], dims: int) -> None:
    ids = [cid for h in vectors for cid in ids_by_hash[h]]
    matrix = np.stack([vectors[h] for h in vectors for _ in ids_by_hash[h]])
    table.merge_insert("id").when_matched_update_all().execute(
        pa.table({"id": pa.array(ids), "vector": vector_array(matrix, dims)}))


# BM25 columns per table: a message's tool calls and files are searchable too (`terms`).
FTS_COLUMNS = {MESSAGES_TABLE: ("text", "terms"), SESSIONS_TABLE: ("text",), KNOWLEDGE_TABLE: ("text",)}
# Scalar indexes. BTree for point lookups: a write's merge by id, a session's messages (summaries,
# paging); without one each reads the column of the whole table (merge of 70 rows at 155k
# messages: 45 ms, 10 ms with it). Bitmap for the few project paths every scoped query filters on.
SCALAR_INDEXES = {MESSAGES_TABLE: {"id": "BTree", "session_id": "BTree", "project_path": "Bitmap"},
                  SESSIONS_TABLE: {"id": "BTree", "session_id": "BTree", "project_path": "Bitmap"}}


# A table is compacted (`compact`) once ingests have appended this many fragments since the last
# compaction, or left this many rows outside its indexes. Until then searches still see the new rows
# (BM25 scans unindexed rows; vectors are a flat scan). Per table, from bench history at 2,000
# sessions: 15 more fragments of the messages table cost a search_context ~3 ms, of the sessions
# table ~12 ms (and `ctx sessions` ~8 ms), whose compaction is cheap (a row per session).
OPTIMIZE_FRAGMENTS = {MESSAGES_TABLE: 16, SESSIONS_TABLE: 4, KNOWLEDGE_TABLE: 4}
OPTIMIZE_UNINDEXED_ROWS = 20_000


def new_fragments(table: Table) -> int:
    """Fragments of `table` that one of its indexes does not cover yet: those written since its last
    compaction (an index made after them, like a new BM25 column's, covers them at once)."""
    return len(_uncovered(table.to_lance()))


def optimize_due(table: Table) -> bool:
    """Whether ingests have left `table` enough new fragments or unindexed rows to be worth compacting."""
    uncovered = _uncovered(table.to_lance())
    return (len(uncovered) >= OPTIMIZE_FRAGMENTS.get(table.name, OPTIMIZE_FRAGMENTS[MESSAGES_TABLE])
            or sum(uncovered.values()) >= OPTIMIZE_UNINDEXED_ROWS)


def _uncovered(ds: lance.LanceDataset) -> dict[int, int]:
    """Fragment id -> rows, for the fragments that one of the dataset's indexes does not cover."""
    cover: dict[str, set[int]] = {}
    for index in index_deltas(ds):
        cover.setdefault(index["name"], set()).update(index["fragment_ids"])
    covered = set.intersection(*cover.values()) if cover else set()
    return {f.fragment_id: f.metadata.num_rows for f in ds.get_fragments() if f.fragment_id not in covered}


def ensure_scalar_indexes(table: Table) -> None:
    """Create the table's SCALAR_INDEXES that are missing (rows added later are folded in by optimize).

    A cold ingest calls this once the messages are stored, before it summarizes sessions: each
    batch of summaries reads its sessions' messages by session_id, which without the index read
    the whole table every time (20,000 sessions: 100 batches at over a minute each).
    """
    from lancedb.index import Bitmap, BTree

    if table.count_rows() == 0:
        return
    scalar = {c for idx in table.list_indices() if idx.index_type in ("BTree", "Bitmap") for c in idx.columns}
    for column, kind in SCALAR_INDEXES.get(table.name, {}).items():
        if column not in scalar:
            table.create_index(column, config=BTree() if kind == "BTree" else Bitmap(), replace=True)


# Vectors a memory table holds before it gets an ANN index. Lower than the chunks' crossover
# (tasks/store.py) because one search_context runs five queries on the same cores: at 20,000
# sessions the sessions table's flat scan (20k vectors) took 21-25 ms of a 50 ms budget.
MEMORY_ANN_ROWS = 10_000


def ensure_vector_index(table: Table, min_rows: int | None = None) -> bool:
    """Give a table that holds `min_rows` vectors an IVF_SQ index on them; True if one was built.

    At 20,000 sessions the messages table holds 1.55M rows, 0.9M with a vector (bench history):
    a project's flat scan took 110-150 ms. IVF_SQ (sqrt(n) partitions, 8-bit scalars) built in
    33-58 s with lance's defaults and raised the process's peak memory by ~0.5 GB; IVF_PQ (8-dim
    sub-vectors) took 94-101 s and needed its candidates re-ranked by the full vectors (recall@10
    0.62 without, 0.99 with, at 24 ms); HNSW-SQ (the chunks' index) 172 s. The probes that
    serve/api/context_search.py asks for set the recall. Rows added later are folded in by optimize()
    and searched flat until then.
    """
    from lancedb.index import IvfSq

    min_rows = MEMORY_ANN_ROWS if min_rows is None else min_rows
    if vector_indexes(table) or table.count_rows() < min_rows:
        return False
    embedded = table.count_rows("vector IS NOT NULL")
    if embedded < min_rows:
        return False
    # A quarter of lance's training sample and fewer k-means rounds: on those 0.9M vectors the build
    # took 19.5 s instead of 32.5 at the same recall@10 (0.970 on 40 queries).
    table.create_index("vector", config=IvfSq(distance_type="cosine", num_partitions=max(1, int(embedded ** 0.5)),
                                              sample_rate=64, max_iterations=20))
    return True


@stage("fts-memory")
def index_and_optimize(tables: Sequence[Table], force: bool = False, compact_here: bool = True) -> list[str]:
    """Memory tables -> BM25 and scalar indexes (built once, then folded in by optimize), compacted
    fragments, and a vector index once a table is large (`ensure_vector_index`).

    A table is optimized when `optimize_due` says so, or always with `force`; returns the names of
    the tables it optimized. Without `compact_here` (a run inside the resident service) a table
    whose indexes exist is not looked at for compaction: the check and the compaction load pylance
    into the process for good, and the service's own ingest runs, each a process, compact what is due.
    """
    from lancedb.index import FTS

    optimized = []
    for table in tables:
        if table.count_rows() == 0:
            continue
        indices = table.list_indices()
        indexed = {c for idx in indices if idx.index_type == "FTS" for c in idx.columns}
        created = not indexed
        for column in FTS_COLUMNS[table.name]:
            if column not in indexed:
                # Conversations mix prose and code: keep stop words and exact forms, like chunks.
                table.create_index(column, config=FTS(stem=False, remove_stop_words=False, with_position=False), replace=True)
        ensure_scalar_indexes(table)
        if force or created or (compact_here and optimize_due(table)):
            # A table whose indexes were just built (a cold ingest) is merged whole, once: at
            # 20,000 sessions it was left at 65 fragments (messages) and 104 (sessions), which
            # no later small ingest would merge (the last, partial batch stops the size tiers),
            # and `ctx sessions -n 5` took 62 ms.
            compact(table, full=force or created, whole=created)
            optimized.append(table.name)
        ensure_vector_index(table)  # after compaction, which would otherwise rewrite it at once
    return optimized


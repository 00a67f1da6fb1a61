"""Embed stage: CHUNKS rows without vectors -> vectors, through the content-addressed EMBEDDINGS cache."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa

from ctxlake.errors import LakeError
from ctxlake.tasks.embed_cache import REPLACE_ATOL, EmbeddingCache, vector_array
from ctxlake.tasks.heap import give_back_freed_memory
from ctxlake.tasks.lake import writing
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.stage import stage
from ctxlake.tasks.store import LakeTables, ensure_key_index, sql_str

if TYPE_CHECKING:
    from lancedb.table import Table

    from ctxlake.tasks.embedder_base import Embedder

# Texts per encode call: large enough that sorting by length keeps padding low, small enough
# that progress moves and a kill loses little.
ENCODE_GROUP = 256
# Pending rows read, looked up, encoded and written per window: the stage's memory is bounded by
# this, not by the lake (reading a 590k-chunk lake's pending texts at once cost over a GB).
WINDOW_ROWS = 16_384
# Vectors are written back in batches this big, or at least this often: one merge into the chunks
# table per window when the model keeps up (the static one does, ~4 s a window here). A merge
# without the id index joined against the whole table, and the process kept more of each: a cold
# index of 217,597 chunks peaked at 1,602-1,677 MB with a merge per window against 2,040-2,179 MB
# with one per 4,096 rows (now each finds its rows through the index: tasks/store.py KEY_COLUMN).
FLUSH_ROWS = WINDOW_ROWS
FLUSH_SECONDS = 15.0


def cached_vectors(hashes: Sequence[str], cache: EmbeddingCache) -> tuple[np.ndarray, np.ndarray]:
    """(matrix, found): the cache's vector for each hash, zeros where it has none; found marks which."""
    hits = cache.get_many(hashes)
    matrix = np.zeros((len(hashes), cache.dims), dtype=np.float32)
    found = np.fromiter((h in hits for h in hashes), dtype=bool, count=len(hashes))
    for i in np.flatnonzero(found).tolist():
        matrix[i] = hits[hashes[i]]
    return matrix, found


def with_vectors(rows: pa.Table, matrix: np.ndarray, valid: np.ndarray, dims: int) -> pa.Table:
    """`rows` with its vector column replaced: row i gets matrix[i] where valid[i], else null."""
    import pyarrow.compute as pc

    vectors = vector_array(matrix, dims)
    column = pc.if_else(pa.array(valid), vectors, pa.nulls(rows.num_rows, vectors.type))
    index = rows.schema.get_field_index("vector")
    return rows.set_column(index, rows.schema.field(index), column.cast(rows.schema.field(index).type))


def fill_from_cache(chunks: pa.Table, cache: EmbeddingCache) -> tuple[pa.Table, int]:
    """CHUNKS rows -> the same rows with vectors wherever the cache has their content; (rows, hits)."""
    if chunks.num_rows == 0:
        return chunks, 0
    matrix, found = cached_vectors(chunks.column("content_hash").to_pylist(), cache)
    if not found.any():
        return chunks, 0
    return with_vectors(chunks, matrix, found, cache.dims), int(found.sum())


class EmbedResult(NamedTuple):
    pending: int  # chunks without a vector when the stage started
    from_cache: int  # of those, filled from the cache
    embedded: int  # texts encoded by the model (after de-duplicating equal content)
    seconds: float
    encode_seconds: float  # time inside the model's encode calls
    unchanged: int = 0  # rows re-embedded (--force) whose vector equalled the stored one: not rewritten


def embed_missing(chunks: pa.Table, cache: EmbeddingCache, embedder: Embedder, limit: int) -> tuple[pa.Table, int]:
    """CHUNKS rows whose vectors are still null (after fill_from_cache) -> encoded now, when no more
    than `limit` distinct texts are missing; (rows, texts encoded). A one-file edit then writes its
    rows with vectors, and its run skips the embed stage (a scan of every vector and a merge into
    CHUNKS: most of a watcher batch on django)."""
    import pyarrow.compute as pc

    if chunks.num_rows == 0:
        return chunks, 0
    index = chunks.schema.get_field_index("vector")
    column = chunks.column(index).combine_chunks()
    missing = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if not missing.any():
        return chunks, 0
    hashes = chunks.column("content_hash").to_pylist()
    texts = chunks.column("text").to_pylist()
    todo: dict[str, str] = {}
    for i in np.flatnonzero(missing).tolist():
        todo.setdefault(hashes[i], texts[i])
    if len(todo) > limit:
        return chunks, 0
    keys = list(todo)
    vectors = embedder.embed_documents([todo[h] for h in keys])
    cache.put_many(keys, vectors)
    position = {h: i for i, h in enumerate(keys)}
    filled = np.zeros((chunks.num_rows, cache.dims), dtype=np.float32)
    for i in np.flatnonzero(missing).tolist():
        filled[i] = vectors[position[hashes[i]]]
    field = chunks.schema.field(index)
    merged = pc.if_else(pa.array(missing), vector_array(filled, cache.dims).cast(field.type), column)
    return chunks.set_column(index, field, merged), len(keys)


class _Writer:
    """Writes vectors to the cache, then to CHUNKS, on a thread of its own so encoding never
    waits for Lance commits. Cache first: a crash after it costs a lookup, not a re-embed."""

    def __init__(self, tables: LakeTables, cache: EmbeddingCache, dims: int, replace: bool = False) -> None:
        self.tables, self.cache, self.dims = tables, cache, dims
        self.replace = replace
        self.put = cache.replace_many if replace else cache.put_many  # replace: a forced re-embed
        self.jobs: queue.Queue[tuple[list[str], np.ndarray, list[str], np.ndarray] | None] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ctx-vector-writer", daemon=True)
        self.thread.start()

    def submit(self, hashes: list[str], vectors: np.ndarray, ids: list[str], id_vectors: np.ndarray) -> None:
        if self.error is not None:
            raise LakeError(f"writing vectors failed: {self.error}") from self.error
        self.jobs.put((hashes, vectors, ids, id_vectors))

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if self.error is not None:
                continue
            hashes, vectors, ids, id_vectors = job
            try:
                self.put(hashes, vectors)
                write_vectors(self.tables.chunks, ids, id_vectors, self.dims, in_place=not self.replace)
            except BaseException as exc:  # surfaced to the encoding thread on its next submit
                self.error = exc
            give_back_freed_memory()  # each write's buffers, freed on this thread

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        if isinstance(self.error, LakeError):
            raise self.error
        if self.error is not None:
            raise LakeError(f"writing vectors failed: {self.error}") from self.error


def write_vectors(chunks: Table, ids: Sequence[str], vectors: np.ndarray, dims: int, in_place: bool = True) -> None:
    """Vectors -> the CHUNKS rows of `ids`. In place (through the id index, when it covers them) for
    rows still without one; `in_place=False` for rows that hold one already (a forced re-embed):
    their rows are rewritten, so they get new row ids, and a reader that holds vectors by row id
    (serve/api/vectors.py) sees a changed vector as a new row, never the old one under the same id."""
    if not ids:
        return
    update = pa.table({"id": pa.array(list(ids)), "vector": vector_array(vectors, dims)})
    with writing("vectors"):
        chunks.merge_insert("id").when_matched_update_all().use_index(in_place).execute(update)


@stage("embed")
def embed_pending(
    tables: LakeTables,
    cache: EmbeddingCache,
    embedder: Embedder,
    on_batch: Callable[[int], None] | None = None,
    use_cache: bool = True,
    reembed_source: str | None = None,
    group: int | None = None,
    pending: int | None = None,
    pending_where: str | None = None,
) -> EmbedResult:
    """CHUNKS rows with a null vector -> vectors: cache hits first, then the model, streamed.

    `reembed_source` re-encodes every chunk of that source instead (`--force`): old vectors stay
    in place, and searchable, until their new ones are written over them. `group` is the texts
    per encode call (a cluster's embedder takes one share per worker; default ENCODE_GROUP).
    `pending`: the rows without a vector, when the caller has just counted them at the version
    the stage starts from (the count reads the whole vector column; the stage counts otherwise).
    `pending_where`: a narrower filter that still finds every row without a vector (the caller's
    own rows, by id), read instead of that whole column.
    """
    started = time.perf_counter()
    where = (pending_where or "vector IS NULL") if reembed_source is None else f"source = {sql_str(reembed_source)}"
    total = tables.chunks.count_rows(where) if pending is None or reembed_source is not None else pending
    if total == 0:
        return EmbedResult(0, 0, 0, 0.0, 0.0)
    progress = reporter()
    progress.start("embed", total, "embedding")
    # The pending rows are read as a stream of windows from the version the stage started on
    # (writes of vectors meanwhile make new versions; Lance keeps the old files readable).
    # A forced re-embed reads the stored vectors too: a row whose new vector equals its stored one
    # (REPLACE_ATOL, as the cache) is not written again. Each vector it writes rewrites its row, and
    # a rewritten row is outside the BM25 index until the run's optimize: every keyword query scans
    # those rows meanwhile (django's 46k rewritten by `--force`: 0.2-0.3 s per query alone, and ten
    # MCP sessions' queries queued for up to 10 s under load).
    columns = ["id", "content_hash", "text"] + (["vector"] if reembed_source is not None else [])
    if reembed_source is None:
        ensure_key_index(tables.chunks)
    reader = tables.chunks.search().where(where).select(columns).to_batches(WINDOW_ROWS)
    writer = _Writer(tables, cache, cache.dims, replace=reembed_source is not None)
    totals = [0, 0, 0.0, 0]  # from cache, embedded, encode seconds, rows whose vector was unchanged
    try:
        # A GPU embedder asks for bigger groups; ENCODE_GROUP is read at call time, like FLUSH_ROWS.
        group = group or getattr(embedder, "encode_group", None) or ENCODE_GROUP
        for window in _windows(reader, WINDOW_ROWS):
            _embed_window(window, writer, cache, embedder, use_cache, group, on_batch, totals)
    finally:
        writer.close()
        progress.finish("embed")
    if reembed_source is not None and cache.dedupe():  # what forced runs of older versions left
        cache.compact()  # the rows written again stay outside the index until then
    if totals[1]:
        cache.maintain()
    return EmbedResult(pending=total, from_cache=int(totals[0]), embedded=int(totals[1]),
                       seconds=time.perf_counter() - started, encode_seconds=totals[2], unchanged=int(totals[3]))


class _Stored:
    """The vectors a window's rows hold now, by chunk id (a forced re-embed compares against them)."""

    def __init__(self, window: pa.Table) -> None:
        column = window.column("vector").combine_chunks()
        self.row = {cid: i for i, cid in enumerate(window.column("id").to_pylist())}
        self.present = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        dims = column.type.list_size
        flat = column.flatten().to_numpy(zero_copy_only=False)  # null rows are left out of the values
        self.matrix = np.zeros((len(self.present), dims), dtype=np.float32)
        self.matrix[self.present] = flat.reshape(-1, dims)

    def changed(self, ids: list[str], vectors: np.ndarray) -> np.ndarray:
        """Per id: whether `vectors` (one row per id) differ from what the row holds, or it holds none."""
        at = np.fromiter((self.row.get(cid, -1) for cid in ids), dtype=np.int64, count=len(ids))
        out = np.ones(len(ids), dtype=bool)
        known = np.flatnonzero((at >= 0) & self.present[np.maximum(at, 0)])
        if len(known):
            diff = np.abs(self.matrix[at[known]] - vectors[known]).max(axis=1)
            out[known] = diff > REPLACE_ATOL
        return out


def _windows(reader: pa.RecordBatchReader, rows: int) -> Iterator[pa.Table]:
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in reader:
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(held)
            held, count = [], 0
    if held:
        yield pa.Table.from_batches(held)


def _embed_window(window: pa.Table, writer: _Writer, cache: EmbeddingCache, embedder: Embedder, use_cache: bool,
                  group: int, on_batch: Callable[[int], None] | None, totals: list[float]) -> None:
    """One window of pending rows -> their vectors: cache hits, then the model; totals updated in place.

    Equal content in two windows is looked up in the cache again, where the earlier window's
    vectors usually are by then (the writer thread may lag a flush behind: then it is encoded twice).
    """
    progress = reporter()
    ids_by_hash: dict[str, list[str]] = {}
    text_by_hash: dict[str, str] = {}
    for cid, h, text in zip(window.column("id").to_pylist(), window.column("content_hash").to_pylist(),
                            window.column("text").to_pylist(), strict=True):
        ids_by_hash.setdefault(h, []).append(cid)
        text_by_hash[h] = text
    stored = _Stored(window) if "vector" in window.column_names else None
    del window
    cached = cache.get_many(list(ids_by_hash)) if use_cache else {}
    # Rows whose vectors the cache had go out with the window's first write: a second write into
    # the same fragments in one stage would find them outside the id index and rewrite their rows.
    carried: tuple[list[str], np.ndarray] | None = None
    if cached:
        ids = [cid for h in cached for cid in ids_by_hash[h]]
        carried = (ids, np.stack([cached[h] for h in cached for _ in ids_by_hash[h]]))
        totals[0] += len(ids)
        progress.advance("embed", len(ids))

    # Similar lengths side by side keep the model's padded batches tight.
    todo = sorted((h for h in ids_by_hash if h not in cached), key=lambda h: len(text_by_hash[h]))
    buffer_h: list[str] = []
    buffer_v: list[np.ndarray] = []
    last_flush = time.monotonic()

    def flush() -> None:
        nonlocal buffer_h, buffer_v, last_flush, carried
        if not buffer_h:
            if carried is not None:  # nothing was encoded: the cache hits alone
                writer.submit([], np.zeros((0, cache.dims), dtype=np.float32), *carried)
                carried = None
            return
        vectors = np.concatenate(buffer_v)
        ids, rows = [], []
        for i, h in enumerate(buffer_h):
            for cid in ids_by_hash[h]:
                ids.append(cid)
                rows.append(i)
        id_vectors = vectors[rows]
        if stored is not None:
            changed = stored.changed(ids, id_vectors)
            totals[3] += len(ids) - int(changed.sum())
            ids, id_vectors = [cid for cid, c in zip(ids, changed, strict=True) if c], id_vectors[changed]
        if carried is not None:
            ids, id_vectors = carried[0] + ids, np.concatenate([carried[1], id_vectors])
            carried = None
        writer.submit(buffer_h, vectors, ids, id_vectors)
        buffer_h, buffer_v, last_flush = [], [], time.monotonic()

    for start in range(0, len(todo), group):
        hashes = todo[start : start + group]
        t0 = time.perf_counter()
        vectors = embedder.embed_documents([text_by_hash[h] for h in hashes])
        totals[2] += time.perf_counter() - t0
        totals[1] += len(hashes)
        buffer_h.extend(hashes)
        buffer_v.append(vectors)
        done = sum(len(ids_by_hash[h]) for h in hashes)
        progress.advance("embed", done)
        if on_batch is not None:
            on_batch(done)
        if len(buffer_h) >= FLUSH_ROWS or time.monotonic() - last_flush >= FLUSH_SECONDS:
            flush()
    flush()

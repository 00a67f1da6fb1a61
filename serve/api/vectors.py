"""The chunk vectors of one lake held in memory, for long-lived readers (the service, `ctx serve`).

Below the ANN threshold a semantic query is a flat scan, and LanceDB's costs ~40 ms of CPU on
django's 47k chunks (it reads and decodes every vector per query): two thirds of a hybrid query,
and what ten concurrent MCP sessions queue behind on a small machine. The same scan over a matrix
already in memory takes ~2 ms (one thread) and gives the same distances (cosine, float32). The matrix follows
the table's versions by row id: a new version costs one read of the row ids (~20 ms on django)
and the vectors of the rows it added; rows it deleted are masked out. One-shot CLI commands keep
LanceDB's scan (loading the matrix costs more than one scan).

Row ids here are Lance row addresses: a row keeps its id until compaction rewrites its fragment,
and a rewritten row gets a new id (fragment ids are never reused), so an id seen in two versions
names the same vector. The one write that could change a vector in place, filling in a missing
one, cannot be missed: the matrix answers only while every row it knows of has a vector.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ctxlake.tasks.heap import give_back_freed_memory

if TYPE_CHECKING:
    import pyarrow as pa
    from lancedb.table import Table

log = logging.getLogger("ctxlake.vectors")

# Past this many rows the matrix is not kept (memory: rows x dims x 4 bytes, 72 MB at 47k x 384);
# a lake that big has its ANN index (tasks/store.py ANN_MIN_ROWS) or will have it after a run.
MAX_ROWS = 150_000
# A refresh that would leave more than this many segments, or a masked share above MAX_DEAD,
# rebuilds one segment (a copy of the matrix, ~15 ms on django) instead of appending another.
MAX_SEGMENTS = 8
LOAD_BATCH = 8_192  # rows per batch of a full read
MAX_DEAD = 0.25
# The matrix is kept column-major: OpenBLAS's matrix-vector product over that layout is ~2.5x
# faster on one thread (django's 47k x 256 vectors: 1.9-2.2 ms against 4.7-5.4 ms, the same
# scores to 6e-8), and the scan was half of the service's CPU per hybrid query.
SCAN_ORDER: Final = "F"


@dataclass(frozen=True)
class _Segment:
    row_ids: np.ndarray  # uint64, one per matrix row
    chunk_ids: np.ndarray  # object (str): the rows' `id`, so a fused ranking needs no read per row
    matrix: np.ndarray  # float32 (rows, dims), each row of unit length, column-major (SCAN_ORDER)
    alive: np.ndarray  # bool: still in the table at the snapshot's version


@dataclass(frozen=True)
class _Snapshot:
    version: int
    segments: tuple[_Segment, ...]

    @property
    def rows(self) -> int:
        return sum(int(s.alive.sum()) for s in self.segments)


class Unanswerable(Exception):
    """The matrix cannot answer for this version (vectors missing, too many rows, an ANN index)."""


def _unit(matrix: np.ndarray) -> np.ndarray:
    """`matrix` with each row scaled to unit length, in place (zero rows stay zero)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return matrix


class FlatVectors:
    """A lake's chunk vectors in memory, kept at the table's latest version; `nearest` answers a
    flat cosine search (what LanceDB's scan without an index answers) or raises Unanswerable."""

    def __init__(self, table: Table, version: Callable[[], int] | None = None,
                 pending: Callable[[], int] | None = None) -> None:
        self.table = table
        # The table's latest version (the Lake passes its memo of it: serve/api/code_lake.py).
        self._version = version or (lambda: int(table.version))
        # Rows still waiting for a vector, as the last index run recorded them (state.json): a full
        # read is not attempted meanwhile. Without it the rows are counted, a scan of the whole
        # vector column that left ~55 MB more in the service's heap on django than the read itself.
        self._pending = pending or (lambda: int(table.count_rows("vector IS NULL")))
        self._snapshot: _Snapshot | None = None
        self._lock = threading.Lock()
        self._refused: int | None = None  # a version found unanswerable: don't reread it per query

    def nearest(self, query: np.ndarray, k: int) -> list[tuple[int, str, float]]:
        """(row id, chunk id, cosine distance) of the `k` nearest rows, nearest first."""
        snap = self._current()
        q = np.asarray(query, dtype=np.float32).ravel()
        norm = float(np.linalg.norm(q))
        if norm > 0:
            q = q / norm
        scores, ids, names = [], [], []
        for seg in snap.segments:
            s = seg.matrix @ q
            s[~seg.alive] = -np.inf
            scores.append(s)
            ids.append(seg.row_ids)
            names.append(seg.chunk_ids)
        k = min(k, snap.rows)
        if not scores or k <= 0:
            return []
        score = np.concatenate(scores) if len(scores) > 1 else scores[0]
        row_ids = np.concatenate(ids) if len(ids) > 1 else ids[0]
        chunk_ids = np.concatenate(names) if len(names) > 1 else names[0]
        # Ties go to the lower row id, as LanceDB's scan orders them: every row scoring at least
        # the k-th best is a candidate, sorted by (score, row id).
        if k < len(score):
            kth = np.partition(score, len(score) - k)[len(score) - k]
            candidates = np.flatnonzero(score >= kth)
        else:
            candidates = np.flatnonzero(score > -np.inf)
        top = candidates[np.lexsort((row_ids[candidates], -score[candidates]))][:k]
        return [(int(row_ids[i]), str(chunk_ids[i]), float(1.0 - score[i])) for i in top]

    def _current(self) -> _Snapshot:
        version = self._version()
        snap = self._snapshot
        if snap is not None and snap.version >= version:
            return snap
        if self._refused == version:
            raise Unanswerable(f"version {version}")
        with self._lock:
            snap = self._snapshot
            if snap is not None and snap.version >= version:
                return snap
            try:
                snap = self._refresh(snap)
            except Unanswerable:
                self._snapshot, self._refused = None, version
                raise
            self._snapshot = snap
            return snap

    def _refresh(self, old: _Snapshot | None) -> _Snapshot:
        if old is None:
            return self._load()
        before = self.table.version
        current = self.table.search().select(["_rowid"]).with_row_id(True).limit(None).to_arrow()
        now = np.sort(current.column("_rowid").to_numpy())
        if len(now) > MAX_ROWS:
            raise Unanswerable(f"{len(now)} rows")
        known = np.concatenate([s.row_ids for s in old.segments]) if old.segments else np.zeros(0, np.uint64)
        added = np.setdiff1d(now, known, assume_unique=True)
        segments = [_Segment(s.row_ids, s.chunk_ids, s.matrix, s.alive & np.isin(s.row_ids, now, assume_unique=True))
                    for s in old.segments]
        if len(added) > len(now) // 2:
            return self._load()  # mostly new rows (a forced re-index): one read beats the takes
        if len(added):
            rows = self.table.take_row_ids([int(r) for r in added]).select(["id", "vector"]).with_row_id().to_arrow()
            vectors = rows.column("vector").combine_chunks()
            if vectors.null_count:
                raise Unanswerable("rows without vectors")
            dims = vectors.type.list_size
            # A copy always: a one-row block is already in either order, and asarray would hand
            # back Arrow's read-only buffer, which _unit scales in place.
            matrix = _unit(np.array(vectors.flatten().to_numpy().reshape(len(vectors), dims),
                                    dtype=np.float32, order=SCAN_ORDER, copy=True))
            segments.append(_Segment(np.asarray(rows.column("_rowid").to_numpy(), dtype=np.uint64),
                                     _ids(rows.column("id")), matrix, np.ones(len(matrix), dtype=bool)))
        alive = sum(int(s.alive.sum()) for s in segments)
        if alive != len(now):
            # A row vanished between reading the ids and taking its vector (a writer committed
            # meanwhile): begin again from a full read next time.
            raise Unanswerable("the table changed during the refresh")
        total = sum(len(s.row_ids) for s in segments)
        if len(segments) > MAX_SEGMENTS or (total and 1 - alive / total > MAX_DEAD):
            segments = [_compact(segments)]
        # The ids were read at some version from `before` on; a later commit is caught next query.
        return _Snapshot(before, tuple(segments))

    def _load(self) -> _Snapshot:
        from ctxlake.tasks.store import vector_indexes

        before = self.table.version
        if vector_indexes(self.table):
            raise Unanswerable("the table has an ANN index")
        count = self.table.count_rows()
        if count > MAX_ROWS:
            raise Unanswerable("too many rows")
        if self._pending():  # still being embedded: not worth a read (one that finds a null stops)
            raise Unanswerable("rows without vectors")
        # Streamed into the matrix batch by batch: reading the whole column first left ~300 MB of
        # freed buffers in the service's heap for django's 46 MB of vectors.
        dims = self.table.schema.field("vector").type.list_size
        matrix = np.empty((count, dims), dtype=np.float32, order=SCAN_ORDER)
        row_ids = np.empty(count, dtype=np.uint64)
        chunk_ids = np.empty(count, dtype=object)
        filled = 0
        read = self.table.search().select(["id", "vector"]).with_row_id(True).limit(None)
        for batch in read.to_batches(LOAD_BATCH):
            k = batch.num_rows
            vectors = batch.column("vector")
            if filled + k > count or vectors.null_count:
                raise Unanswerable("the table changed during the read")
            matrix[filled:filled + k] = vectors.flatten().to_numpy().reshape(k, dims)
            row_ids[filled:filled + k] = batch.column("_rowid").to_numpy()
            chunk_ids[filled:filled + k] = batch.column("id").to_pylist()
            filled += k
        if filled != count:
            raise Unanswerable("the table changed during the read")
        _unit(matrix)
        give_back_freed_memory()
        log.debug("loaded %d vectors of %s (version %d)", count, self.table.name, before)
        return _Snapshot(before, (_Segment(row_ids, chunk_ids, matrix, np.ones(count, dtype=bool)),))

    def rebind(self, table: Table, version: Callable[[], int] | None = None,
               pending: Callable[[], int] | None = None) -> FlatVectors:
        """The same vectors for another handle on the same table (a reopened Lake)."""
        other = FlatVectors(table, version, pending)
        other._snapshot = self._snapshot
        return other

    def complete(self) -> bool:
        """Whether the matrix answers for the table's latest version, which holds then no row
        without a vector (loads or refreshes it: the first call is the warm-up)."""
        try:
            self._current()
        except Unanswerable:
            return False
        return True

    def stats(self) -> dict[str, Any]:
        snap = self._snapshot
        if snap is None:
            return {"rows": 0, "bytes": 0, "segments": 0}
        return {"rows": snap.rows, "bytes": sum(s.matrix.nbytes for s in snap.segments),
                "segments": len(snap.segments), "version": snap.version}


def _compact(segments: list[_Segment]) -> _Segment:
    row_ids = np.concatenate([s.row_ids[s.alive] for s in segments])
    chunk_ids = np.concatenate([s.chunk_ids[s.alive] for s in segments])
    matrix = np.asarray(np.concatenate([s.matrix[s.alive] for s in segments]), order=SCAN_ORDER)
    return _Segment(row_ids, chunk_ids, matrix, np.ones(len(row_ids), dtype=bool))


def _ids(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_pylist(), dtype=object)

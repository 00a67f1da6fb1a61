"""Embed stage: the content-addressed EMBEDDINGS cache, (model_id, content hash) -> vector, and its upkeep."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import xxhash

from ctxlake.errors import LakeError
from ctxlake.schemas.tables import embeddings_schema
from ctxlake.tasks.lake import connect, lance_message, open_table, resource_error, writing
from ctxlake.tasks.store import fragment_count, sql_list
from ctxlake.tasks.upkeep import KEEP_VERSIONS

if TYPE_CHECKING:
    from lancedb.table import Table

LOOKUP_BATCH = 2000


def vector_array(vectors: np.ndarray, dims: int) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, dims)


# Every put_many appends a fragment, and lookups filter by content_hash. Left alone, the 20,000-
# session cold ingest had a cache of 2,106 fragments and no index by 157k rows: one lookup of 2,000
# hashes read them all (4.4-7.6 s, 1.5 GB) and the run slowed and grew to 5 GB. With a BTree index
# on content_hash the same lookup takes 0.1 s. So the cache indexes content_hash once it has
# CACHE_INDEX_ROWS rows, and rebuilds that index once CACHE_REINDEX_ROWS rows are outside it
# (rebuilding reads the hashes only). Compacting is left for CACHE_OPTIMIZE_FRAGMENTS fragments:
# LanceDB's optimize rewrites every fragment under a million rows, which for a growing cache is all
# of it (1.5M vectors: over two minutes and +0.5 GB, each time). A writer checks every
# CACHE_CHECK_APPENDS appends and when its stage ends.
CACHE_INDEX_ROWS = 10_000
CACHE_REINDEX_ROWS = 50_000
CACHE_OPTIMIZE_FRAGMENTS = 256
CACHE_CHECK_APPENDS = 16
# A vector encoded again that differs from the stored one by more than this replaces it.
REPLACE_ATOL = 1e-5
# Small appends (a watcher's batch, a scheduled ingest's few messages) go to a side table instead,
# which is cheap to compact (at RECENT_OPTIMIZE_FRAGMENTS) and is moved into the main table in one
# append once it holds FOLD_ROWS rows. Without it each small run left one fragment in the main
# table: 800 scheduled ingests at 20,000 sessions left 1,807, lookups took 0.26-1.05 s, and one
# new session's ingest went from 1.4 to 3.4 s (bench history --reuse).
FOLD_ROWS = 8_192
RECENT_OPTIMIZE_FRAGMENTS = 16
# How LanceDB reports a table it cannot read (a truncated data file, a lost manifest): the cache
# is derived data, so such a table is moved aside and a fresh one started (see _recover).
CACHE_ERRORS = (OSError, RuntimeError, ValueError, LakeError)
REPAIR_LOCK = ".repair.lock"

T = TypeVar("T")


class EmbeddingCache:
    """(model_id, content hash) -> vector, in a LanceDB table per model under the user data dir.

    Shared by every project and source of a user: a renamed file, a duplicated function or a
    branch switch finds its vectors here and embeds nothing.
    """

    def __init__(self, cache_dir: Path, model_id: str, dims: int) -> None:
        self.model_id = model_id
        self.dims = dims
        self.cache_dir = cache_dir
        self.name = "emb_" + xxhash.xxh3_64(model_id.encode()).hexdigest()
        self.warnings: list[str] = []  # what this object found damaged and did about it, for the run report
        self._unreadable = False  # lookups failed and could not be repaired: every one is a miss for this run
        self._appends = 0
        try:
            self._open_tables()
        except LakeError:
            raise  # its folder cannot be made: nothing to repair
        except CACHE_ERRORS as exc:
            if resource_error(exc):
                raise LakeError(f"cannot open the embedding cache at {cache_dir}: {lance_message(exc)}",
                                hint="fix the cause and re-run") from exc
            self._recover(exc, lambda: None)

    def _open_tables(self) -> None:
        db = connect(self.cache_dir, create=True, what="the embedding cache")
        self.table: Table = self._open(db, self.name)
        self.recent: Table = self._open(db, self.name + "_recent")
        self._identity = self._folder_ids()

    def _folders(self) -> list[Path]:
        return [self.cache_dir / f"{self.name}.lance", self.cache_dir / f"{self.name}_recent.lance"]

    def _folder_ids(self) -> tuple[int | None, ...]:
        def inode(path: Path) -> int | None:
            try:
                return path.stat().st_ino
            except OSError:
                return None

        return tuple(inode(p) for p in self._folders())

    def _follow_replacement(self) -> None:
        """Reopen when another process moved a damaged cache aside since we opened it: writing
        through the old handles would add versions to the fresh table that name the old files."""
        if self._folder_ids() != self._identity:
            self._open_tables()

    @contextlib.contextmanager
    def _repair_lock(self) -> Iterator[None]:
        import fcntl

        try:
            fd = os.open(self.cache_dir / REPAIR_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LakeError(f"cannot open {self.cache_dir / REPAIR_LOCK}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a reopen and two renames at most
            yield
        finally:
            os.close(fd)

    def _recover(self, exc: BaseException, attempt: Callable[[], T]) -> T:
        """After `exc` from the cache's tables: retry `attempt` on fresh handles; if the tables
        still fail it, move them aside (`<name>.damaged-<time>`), start empty ones and retry there.

        Under a lock file, so two processes that hit the same damage move it once; one that finds
        the folders replaced since it opened them (another process repaired them) only reopens.
        A full disk or a permission problem is never damage: it propagates.
        """
        with self._repair_lock():
            replaced = self._folder_ids() != self._identity if hasattr(self, "_identity") else False
            try:
                self._open_tables()
                return attempt()
            except CACHE_ERRORS as again:
                if replaced or resource_error(again):
                    raise
            stamp = time.strftime("%Y%m%d-%H%M%S")
            moved = []
            for folder in self._folders():
                if folder.exists():
                    target = folder.with_name(f"{folder.name.removesuffix('.lance')}.damaged-{stamp}")
                    try:
                        folder.rename(target)
                    except OSError as err:
                        raise LakeError(f"cannot move the damaged embedding cache {folder} aside: {err.strerror}",
                                        hint=f"delete {folder}; the cache is rebuilt as files are embedded") from err
                    moved.append(str(target))
            self._open_tables()
        self.warnings.append(
            f"the embedding cache could not be read ({lance_message(exc)}): moved it aside to "
            f"{', '.join(moved)} and started a fresh one (this run embeds again what it held; "
            "delete the old folder when you like)")
        return attempt()

    def _open(self, db: Any, name: str) -> Table:
        table = open_table(db, name)
        if table is not None:
            return table
        try:
            return db.create_table(name, schema=embeddings_schema(self.dims))
        except (ValueError, RuntimeError, OSError):
            # Another process created it between our check and create.
            return db.open_table(name)

    def get_many(self, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """The cached vector of each hash the cache holds. A cache that cannot be read is moved
        aside (see _recover) or, failing that, answers every lookup of this run with a miss:
        its vectors are encoded again, and the run still indexes."""
        if self._unreadable or not hashes:
            return {}
        unique = list(dict.fromkeys(hashes))
        try:
            self._follow_replacement()
            return self._lookup(unique)
        except CACHE_ERRORS as exc:
            first = exc
        try:
            if resource_error(first):
                raise first
            return self._recover(first, lambda: self._lookup(unique))
        except CACHE_ERRORS as exc:
            self._unreadable = True
            self.warnings.append(f"the embedding cache at {self.cache_dir} cannot be read ({lance_message(exc)}): "
                                 "this run embeds again what it would have found there")
            return {}

    def _lookup(self, unique: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(unique), LOOKUP_BATCH):
            part = unique[start : start + LOOKUP_BATCH]
            for table in (self.table, self.recent):
                todo = [h for h in part if h not in found]
                if not todo:
                    break
                where = _hashes_in(todo)
                rows = table.search().where(where).select(["content_hash", "vector"]).to_arrow()
                if rows.num_rows == 0:
                    continue
                matrix = rows.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, self.dims)
                for h, vec in zip(rows.column("content_hash").to_pylist(), matrix, strict=True):
                    found[h] = vec
        return found

    def put_many(self, hashes: Sequence[str], vectors: np.ndarray) -> None:
        if not hashes:
            return
        rows = pa.Table.from_arrays(
            [pa.array([self.model_id] * len(hashes)), pa.array(list(hashes)), vector_array(vectors, self.dims)],
            schema=embeddings_schema(self.dims),
        )

        def append() -> None:
            # Appends from concurrent writers commit independently in Lance; a race can store a
            # hash twice, which lookups tolerate, whereas a merge would conflict and retry.
            with writing("the embedding cache"):
                (self.table if len(hashes) >= FOLD_ROWS else self.recent).add(rows)

        try:
            self._follow_replacement()
            append()
        except CACHE_ERRORS as exc:
            if resource_error(exc):
                raise
            self._recover(exc, append)
        self._appends += 1
        if self._appends % CACHE_CHECK_APPENDS == 0:
            self.maintain()

    def replace_many(self, hashes: Sequence[str], vectors: np.ndarray) -> int:
        """Vectors encoded again (`ctx run index --force`) -> the cache: hashes it lacks are added,
        hashes whose stored vector differs are replaced, equal ones are left; rows written.

        Appending them all, as put_many does, stored every chunk once more per forced run: a bench
        home had 559k rows for 48k hashes and each watcher lookup took 100-230 ms instead of 15.
        """
        if not hashes:
            return 0
        stored = self.get_many(hashes)
        changed = {h for h, v in zip(hashes, vectors, strict=True)
                   if h in stored and not np.allclose(stored[h], v, rtol=0.0, atol=REPLACE_ATOL)}
        if changed:
            where = _hashes_in(changed)

            def delete() -> None:
                with writing("the embedding cache"):
                    for table in (self.table, self.recent):
                        table.delete(where)

            try:
                delete()
            except CACHE_ERRORS as exc:
                if resource_error(exc):
                    raise
                self._recover(exc, delete)
        keep = [i for i, h in enumerate(hashes) if h not in stored or h in changed]
        self.put_many([hashes[i] for i in keep], vectors[keep])
        return len(keep)

    def dedupe(self) -> int:
        """Rows of the main table whose hash another row already has -> removed; how many.

        Caches written before replace_many hold such rows (one more copy per forced run). Reads
        the hash column, then only the repeated hashes' rows: each keeps its first vector.
        """
        import pyarrow.compute as pc

        hashes = self.table.search().select(["content_hash"]).to_arrow().column("content_hash")
        counts = pc.value_counts(hashes)
        repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1)).to_pylist()
        removed = 0
        for start in range(0, len(repeated), LOOKUP_BATCH):
            part = repeated[start : start + LOOKUP_BATCH]
            where = _hashes_in(part)
            rows = self.table.search().where(where).select(["content_hash", "vector"]).to_arrow()
            _, first = np.unique(np.asarray(rows.column("content_hash").to_pylist(), dtype=object), return_index=True)
            kept = rows.take(pa.array(np.sort(first)))
            with writing("the embedding cache"):
                # A lookup between these two writes misses these hashes and encodes them again.
                self.table.delete(where)
                self.table.add(pa.Table.from_arrays(
                    [pa.array([self.model_id] * kept.num_rows), kept.column("content_hash"),
                     kept.column("vector").cast(embeddings_schema(self.dims).field("vector").type)],
                    schema=embeddings_schema(self.dims)))
            removed += rows.num_rows - kept.num_rows
        return removed

    def compact(self) -> None:
        """Rewrite the main table's fragments and fold its new rows into the content_hash index."""
        with writing("the embedding cache"):
            self.table.optimize(cleanup_older_than=KEEP_VERSIONS)

    def maintain_if_appended(self) -> None:
        """The check, when this object appended since its last one: a writer that lives for one
        small batch (the service's watcher makes one per batch) never reaches CACHE_CHECK_APPENDS."""
        if self._appends % CACHE_CHECK_APPENDS:
            self.maintain()
            self._appends = 0

    def maintain(self) -> bool:
        """Fold or compact the small appends, index content_hash and compact the cache when it needs
        it (see above); whether it did anything. Writers call it every CACHE_CHECK_APPENDS appends
        and when a run ends.

        Best effort: another process compacting the same cache at the same moment makes this one
        give way, and the next check tries again.
        """
        from lancedb.index import BTree

        try:
            did = self._fold()
            if fragment_count(self.table) >= CACHE_OPTIMIZE_FRAGMENTS:
                self.dedupe()  # the rewrite is smaller without repeated rows
                self.table.optimize(cleanup_older_than=KEEP_VERSIONS)  # also folds new rows into the index
                return True
            index = next((idx for idx in self.table.list_indices() if idx.columns == ["content_hash"]), None)
            if (self.table.count_rows() >= CACHE_INDEX_ROWS if index is None
                    else (index.num_unindexed_rows or 0) >= CACHE_REINDEX_ROWS):
                self.table.create_index("content_hash", config=BTree(), replace=True)
                return True
            return did
        except (OSError, RuntimeError, ValueError):  # a full disk shows at the next real write
            return False

    def _fold(self) -> bool:
        """The side table's rows -> one append to the main table once there are FOLD_ROWS of them,
        else compact the side table when its appends have piled up; whether it did either."""
        if self.recent.count_rows() >= FOLD_ROWS:
            rows = self.recent.to_arrow()
            with writing("the embedding cache"):
                self.table.add(rows)
                # Exactly the rows moved: an append another process made meanwhile stays.
                self.recent.delete(_hashes_in(set(rows.column("content_hash").to_pylist())))
            self.recent.optimize(cleanup_older_than=KEEP_VERSIONS)
            return True
        if fragment_count(self.recent) >= RECENT_OPTIMIZE_FRAGMENTS:
            self.recent.optimize(cleanup_older_than=KEEP_VERSIONS)
            return True
        return False


def _hashes_in(hashes: Iterable[str]) -> str:
    return f"content_hash IN {sql_list(hashes)}"

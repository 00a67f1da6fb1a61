"""The code lake opened for reading (CHUNKS, FILES; IMPORTS, COCHANGE when present): Lake, its vector counts, the read pool."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ctxlake.errors import ModelMismatchError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.serve.api.handles import memo_schema
from ctxlake.serve.api.ranking import LakeCatalog, assigned_names
from ctxlake.tasks.lake import CHUNKS_TABLE, FILES_TABLE, IndexState, connect, open_table

if TYPE_CHECKING:
    from lancedb.table import Table

    from ctxlake.serve.api.vectors import FlatVectors
    from ctxlake.tasks.embedder_base import Embedder

# A long-lived reader (the MCP server) checks for a newer table version on every query: a cheap
# manifest read, and an edit seen by the watcher is searchable at once.
READ_CONSISTENCY = timedelta(0)
# ... but that read goes through LanceDB's one event-loop thread, and a hybrid query asked for the
# version three times (vectors held? fraction counted?): ~15% of the service's samples under ten
# concurrent sessions. Those checks share one read per this many seconds; the rows a query reads
# are always the latest.
VERSION_MEMO_S = 0.05


class Lake:
    """The lake opened for reading, once per CLI command or once per MCP server.

    Readers see the last committed version of each table (Lance snapshots), never a half-written
    one, and pick up newer versions as soon as they are committed.
    """

    def __init__(self, settings: Settings, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self.state = IndexState.read(settings.lake_dir)
        if self.state is None:
            raise NotIndexedError(
                f"{settings.root} is not indexed yet", hint="run `ctx run index` there first"
            )
        self.db = connect(settings.lake_dir, read_consistency=READ_CONSISTENCY)
        chunks = memo_schema(open_table(self.db, CHUNKS_TABLE))
        files = memo_schema(open_table(self.db, FILES_TABLE))
        if chunks is None or files is None:
            raise NotIndexedError(f"the lake at {settings.lake_dir} has no tables yet",
                                  hint="run `ctx run index` to build it")
        self.chunks: Table = chunks
        self.files: Table = files
        self._embedder: Embedder | None = None
        if embedder is not None:
            self._check_model(embedder)
            self._embedder = embedder
        self._counts: tuple[int, int, int] | None = None  # (table version, chunks, chunks without a vector)
        self._catalogs: dict[str | None, tuple[int, LakeCatalog]] = {}
        self._imports: tuple[int, dict[tuple[str, str], set[tuple[str, str]]]] | None = None
        self._cochange: tuple[int, dict[tuple[str, str], dict[tuple[str, str], float]]] | None = None
        # (files version, chunks version) -> per-source figures (source_queries.index_stats)
        self._source_stats: tuple[tuple[int, int], dict[str, Any]] | None = None
        self.flat: FlatVectors | None = None  # chunk vectors in memory, for long-lived readers
        self._version: tuple[float, int] | None = None  # (monotonic time read, chunks version)

    def chunks_version(self, fresh: bool = False) -> int:
        """The chunks table's latest version, read at most once per VERSION_MEMO_S unless `fresh`."""
        now = time.monotonic()
        memo = self._version
        if fresh or memo is None or now - memo[0] >= VERSION_MEMO_S:
            memo = self._version = (now, int(self.chunks.version))
        return memo[1]

    def keep_vectors(self, like: Lake | None = None) -> FlatVectors:
        """Answer flat semantic queries from vectors held in memory (serve/api/vectors.py); a
        long-lived reader calls this once. `like`: a Lake this one replaces, whose vectors it takes
        over (only the rows changed since are read)."""
        from ctxlake.serve.api.vectors import FlatVectors

        if self.flat is None:
            old = like.flat if like is not None else None
            self.flat = (old.rebind(self.chunks, self.chunks_version, self._pending_vectors) if old is not None
                         else FlatVectors(self.chunks, self.chunks_version, self._pending_vectors))
        return self.flat

    def _pending_vectors(self) -> int:
        """Chunks waiting for a vector as the last run left them (an unreadable state: assume some)."""
        state = IndexState.read(self.settings.lake_dir)
        return 1 if state is None else int(state.pending_vectors)

    # -- helpers ---------------------------------------------------------------------------------

    def embedder(self) -> Embedder:
        """The query embedder, loaded on first semantic query; it must match the index's model."""
        if self._embedder is None:
            from ctxlake.tasks.embedders import make_embedder

            embedder = make_embedder(self.settings.embed, self.settings.models_dir)
            self._check_model(embedder)
            self._embedder = embedder
        return self._embedder

    def _check_model(self, embedder: Embedder) -> None:
        if self.state is not None and self.state.model_id and self.state.model_id != embedder.model_id:
            raise ModelMismatchError(
                f"index was built with {self.state.model_id}, config says {embedder.model_id}",
                hint="run `ctx run index --force`, or search with --mode keyword",
            )

    def catalog(self, where: str | None = None) -> LakeCatalog:
        """Files and the names they define (chunks matching `where`), cached per table version."""
        version = self.chunks.version
        cached = self._catalogs.get(where)
        if cached is None or cached[0] != version:
            search = self.chunks.search()
            if where:
                search = search.where(where)
            table = search.select(["source", "path", "symbol"]).to_arrow()
            # Module-level code (constants, settings) has no symbol: read its names from the text.
            module = self.chunks.search().where(f"kind = 'module'{f' AND {where}' if where else ''}")
            mod = module.select(["source", "path", "text"]).to_arrow()
            assigned = [(src, path, name) for src, path, text in zip(
                mod.column("source").to_pylist(), mod.column("path").to_pylist(),
                mod.column("text").to_pylist(), strict=True) for name in assigned_names(text)]
            catalog = LakeCatalog.build(zip(
                table.column("source").to_pylist(), table.column("path").to_pylist(),
                table.column("symbol").to_pylist(), strict=True), assigned)
            cached = self._catalogs[where] = (version, catalog)
        return cached[1]

    def imports(self) -> dict[tuple[str, str], set[tuple[str, str]]]:
        """(source, path) -> the indexed files it imports (the graph's resolved imports), cached per
        table version; empty for a lake without the graph."""
        from ctxlake.tasks.graph_store import IMPORTS_TABLE

        table = open_table(self.db, IMPORTS_TABLE)
        if table is None:
            return {}
        version = table.version
        if self._imports is None or self._imports[0] != version:
            rows = table.search().where("resolved IS NOT NULL").select(["source", "path", "resolved"]) \
                .limit(None).to_arrow()
            out: dict[tuple[str, str], set[tuple[str, str]]] = {}
            for source, path, resolved in zip(rows.column("source").to_pylist(), rows.column("path").to_pylist(),
                                              rows.column("resolved").to_pylist(), strict=True):
                if resolved != path:
                    out.setdefault((source, path), set()).add((source, resolved))
            self._imports = (version, out)
        return self._imports[1]

    def cochange(self) -> dict[tuple[str, str], dict[tuple[str, str], float]]:
        """(source, path) -> the files changed in the same commits, each with its strength in 0..1
        (as `ctx related` shows it), cached per table version; empty without git history."""
        from ctxlake.schemas.tables import COCHANGE_TABLE
        from ctxlake.tasks.cochange import newest_weight, strength

        table = open_table(self.db, COCHANGE_TABLE)
        if table is None:
            return {}
        version = table.version
        if self._cochange is None or self._cochange[0] != version:
            rows = table.search().select(["source", "path", "other", "weight"]).limit(None).to_arrow()
            tops: dict[str, float | None] = {}
            out: dict[tuple[str, str], dict[tuple[str, str], float]] = {}
            for source, path, other, weight in zip(*(rows.column(c).to_pylist() for c in
                                                     ("source", "path", "other", "weight")), strict=True):
                if source not in tops:
                    tops[source] = newest_weight(self.settings.lake_dir, source)
                top = tops[source]
                if top:
                    out.setdefault((source, path), {})[(source, other)] = strength(float(weight), top)
            self._cochange = (version, out)
        return self._cochange[1]

    def refresh(self) -> None:
        self.state = IndexState.read(self.settings.lake_dir) or self.state
        for table in (self.chunks, self.files):
            table.checkout_latest()


def embedding_counts(lake: Lake, fresh: bool = False) -> tuple[int, int]:
    """(chunks, chunks still without a vector), counted once per table version: the null count
    scans the whole vector column (on django's 47k chunks ~0.1 s of CPU, which get_stale_status
    paid on every call). `fresh`: read the version now, not the one memoised for VERSION_MEMO_S."""
    version = lake.chunks_version(fresh)
    if lake._counts is not None and lake._counts[0] == version:
        return lake._counts[1], lake._counts[2]
    total = lake.chunks.count_rows()  # from the table's metadata
    if total == 0 or (lake.flat is not None and lake.flat.complete()):  # its refresh costs less than the count
        pending = 0
    else:
        pending = lake.chunks.count_rows("vector IS NULL")
    lake._counts = (version, total, pending)
    return total, pending


def embedded_fraction(lake: Lake, fresh: bool = False) -> float:
    """Share of chunks with a vector (embedding_counts)."""
    total, pending = embedding_counts(lake, fresh)
    return 0.0 if total == 0 else 1.0 - pending / total


# Hybrid search runs its semantic half on a worker while the lexical half runs on the caller's
# thread (LanceDB releases the GIL): below the ANN threshold the vector scan is most of a query
# (~55 ms of ~80 on django's 47k chunks), and the answer arrives in about the longer half's time.
# search_context runs its table queries here too. Jobs never wait on other jobs of this pool.
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def read_pool() -> ThreadPoolExecutor:
    """The read side's worker threads for queries that run side by side."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ctx-read")
        return _pool

def all_rows(table: Any, columns: list[str], where: str | None = None) -> pa.Table:
    """Every matching row of a LanceDB table, only the named columns (a scan without a limit)."""
    query = table.search().select(columns)
    if where:
        query = query.where(where)
    result: pa.Table = query.to_arrow()
    return result

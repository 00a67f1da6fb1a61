"""Pipeline: scan -> diff -> chunk + graph (here or on Dask workers) -> fill vectors from cache -> upsert -> FTS -> embed -> optimize -> manifest."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow

from ctxlake.errors import LakeError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.tasks import freshness
from ctxlake.tasks.chunk_stage import BatchRows, chunk_files, with_graph
from ctxlake.tasks.cochange import update_cochange
from ctxlake.tasks.embed import embed_missing, embed_pending, fill_from_cache
from ctxlake.tasks.embed_cache import EmbeddingCache
from ctxlake.tasks.embedder_base import Embedder
from ctxlake.tasks.embedders import make_embedder
from ctxlake.tasks.graph import forget_known
from ctxlake.tasks.graph_store import (
    clear_graph,
    open_graph,
    optimize_graph,
    reresolve_imports,
    write_graph,
)
from ctxlake.tasks.heap import give_back_freed_memory
from ctxlake.tasks.lake import (
    COLD_WRITE_FAILED_HINT,
    WRITE_FAILED_HINT,
    IndexState,
    check_model,
    missing_tables,
    reset_lake,
)
from ctxlake.tasks.merkle import Diff, Tree, load_snapshot, save_snapshot
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.run_log import record_run
from ctxlake.tasks.scan import scan, unreadable_warning
from ctxlake.tasks.store import (
    FTS_TAG,
    append_chunks,
    build_fts,
    drop_unreadable,
    ensure_key_index,
    indexed_paths,
    open_for_write,
    optimize,
    slices,
    sql_list,
    sql_str,
    upsert,
)
from ctxlake.tasks.upkeep import OPTIMIZE_ELSEWHERE_ENV

# Files per upsert transaction: bounds memory and what a crash can leave half-done.
BATCH_FILES = 400


@dataclass
class IndexReport:
    """What one run did; printed by the CLI, stored in state.json as `last_run`."""

    source: str
    root: str
    files_seen: int = 0
    added: int = 0
    modified: int = 0
    removed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # "secret": files skipped by name
    secrets_masked: int = 0  # values masked in the files this run chunked
    chunks_inserted: int = 0
    chunks_deleted: int = 0
    graph_rows: int = 0  # definitions, references and imports written
    vectors_from_cache: int = 0
    embedded: int = 0
    vectors_unchanged: int = 0  # --force: rows whose new vector equalled the stored one (not rewritten)
    cochange_commits: int = 0  # git commits read into the co-change table this run
    warnings: list[str] = field(default_factory=list)
    keyword_ready_s: float = 0.0
    seconds: float = 0.0
    encode_seconds: float = 0.0
    embed_device: str = ""  # where a local model encoded this run's texts (cpu, cuda, mps)
    embed_batch: int = 0  # the texts per model batch it used (embed.batch_size, `auto` resolved)
    # One-time static-model distillation during this run: left out of `seconds`.
    model_setup_s: float = 0.0
    executor: str = "local"  # or where the cluster's work went: "dask tcp://host:8786 (4 workers)"
    finished_at: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["warnings"] = self.warnings[:50]
        return out


# A run changing at most this many files encodes up to this many texts missing from the cache
# before writing the rows (embed_missing): an edit lands with its vectors, no embed stage after.
INLINE_EMBED_FILES = 8
INLINE_EMBED_TEXTS = 64
# Up to this many rows written without a vector, a run that found the lake fully embedded finds
# them again by id (through the id index) instead of scanning the whole vector column for nulls.
NULL_IDS_MAX = 4096
OPTIMIZE_AFTER_ROWS = 2_000  # rows written since the last optimize that make the next run optimize


class Writer:
    """The write side of one source for the length of a run (or of a watch session): the lake's
    tables, the embedding cache and the state file, with the journal protocol that makes an
    interrupted run repairable by the next one."""

    def __init__(self, settings: Settings, source: str, root: Path, embedder: Embedder,
                 state: IndexState | None) -> None:
        self.settings, self.source, self.root, self.embedder = settings, source, root, embedder
        self.encode_group: int | None = None  # the embed stage's own default
        if settings.run.executor == "dask":
            from ctxlake.tasks import dask_run

            self.embedder = dask_run.ClusterEmbedder(embedder, settings.run.dask_address, settings.embed,
                                                     settings.models_dir)
            self.encode_group = dask_run.ENCODE_GROUP
        self.lake = settings.lake_dir
        # The last run finished with every chunk embedded by this model: while this run writes no
        # row without a vector, it needs no embed stage (see embed_missing).
        self.vectors_settled = (state is not None and state.clean and not state.pending_vectors
                                and state.model_id == embedder.model_id)
        self.nulls_written = 0  # CHUNKS rows this run wrote without a vector
        self.null_ids: list[str] | None = []  # their ids; None past NULL_IDS_MAX
        # The embed stage ran to its end over every row without a vector (not --force's re-embed
        # of one source): none is left, as this run is the lake's one writer.
        self.embedded_all = False
        self.embed_inline = True  # small runs encode missing vectors before writing (not with --no-embed)
        # The service's watcher appends the run's INDEX_RUNS row and does the cache's upkeep itself,
        # after readers may go on (finish leaves both in `record`): 40 ms of an edit's way to being
        # searchable otherwise, and ~0.25 s once every 16 batches.
        self.defer_record = False
        self.record: Callable[[], None] = lambda: None
        self.state = state or IndexState()
        self.state.provider, self.state.model = settings.embed.provider, settings.embed.model
        self.state.model_id, self.state.dims = embedder.model_id, embedder.dims
        self.lake.mkdir(parents=True, exist_ok=True)
        self.tables = open_for_write(self.lake, embedder.dims)
        self.graph = open_graph(self.lake)
        self.known: set[str] = set()  # every path of the source, for import resolution
        self.cache = EmbeddingCache(settings.cache_dir, embedder.model_id, embedder.dims)

    def begin(self, diff: Diff) -> None:
        """Before the first write: journal the paths this step may touch, mark the lake unfinished."""
        journal = freshness.read_journal(self.lake)
        journal[self.source] = sorted(set(journal.get(self.source, [])) | set(diff.changed) | set(diff.removed))
        freshness.write_journal(self.lake, journal)
        self.state.clean = False
        self.state.write(self.lake)

    def apply(self, diff: Diff, report: IndexReport, force: bool = False) -> None:
        if not self.known:  # a watcher's writer: the lake's files stand in for the scan's tree
            self.known = (indexed_paths(self.tables, self.source) | set(diff.changed)) - set(diff.removed)
        _write_changes(self, diff, report, force)
        # Files this run did not touch may import what it added or removed. A run that rewrote every
        # file (cold, forced) resolved them all against the new paths already.
        if self.settings.index.graph and not force and not set(diff.changed) >= self.known:
            report.graph_rows += reresolve_imports(self.graph, self.source, diff.added, diff.removed,
                                                   [*diff.changed, *diff.removed], self.known)

    def wrote(self, chunks: Any) -> None:
        """Note the rows of a batch about to be written without a vector."""
        nulls = chunks.column("vector").null_count
        self.nulls_written += nulls
        if nulls and self.null_ids is not None:
            import pyarrow.compute as pc

            ids = chunks.filter(pc.is_null(chunks.column("vector"))).column("id").to_pylist()
            self.null_ids = self.null_ids + ids if len(self.null_ids) + len(ids) <= NULL_IDS_MAX else None

    def _pending_where(self) -> str | None:
        """A filter for the rows without a vector that reads this run's rows only: when the lake
        had none before the run, they are among those it wrote without one (the rest kept theirs,
        or an id already there kept its row). None: scan for them."""
        if not (self.vectors_settled and self.null_ids):
            return None
        return f"vector IS NULL AND id IN {sql_list(self.null_ids)}"

    def embed(self, report: IndexReport, force: bool = False, pending: int | None = None) -> None:
        """The embed stage, when rows may lack a vector; `pending`: their number, counted just now."""
        if not force and self.vectors_settled and self.nulls_written == 0:
            return
        narrow = None if force else self._pending_where()
        self.vectors_settled = False  # finish() counts what is left
        result = embed_pending(self.tables, self.cache, self.embedder, use_cache=not force,
                               reembed_source=self.source if force else None, group=self.encode_group,
                               pending=pending, pending_where=narrow)
        self.embedded_all = not force
        report.vectors_from_cache += result.from_cache
        report.embedded += result.embedded
        report.vectors_unchanged += result.unchanged
        report.encode_seconds += result.encode_seconds
        batch = getattr(self.embedder, "batch_size", None)
        if result.embedded and isinstance(batch, int):
            report.embed_device, report.embed_batch = str(getattr(self.embedder, "device", "")), batch

    def pending_vectors(self) -> int:
        """CHUNKS rows without a vector now. Counting them reads the whole vector column (on the
        100k-file tree: 0.4 s with it cached, ~20 s from disk, and +0.3-0.5 GB resident for the
        run), so a run that found every row embedded and wrote none without one knows it is 0, as
        does one whose embed stage went over every row without one."""
        if (self.vectors_settled and self.nulls_written == 0) or self.embedded_all:
            return 0
        return int(self.tables.chunks.count_rows(self._pending_where() or "vector IS NULL"))

    def finish(self, tree: Tree, report: IndexReport) -> None:
        """After the last write: the snapshot, then the state says the lake matches it."""
        report.warnings.extend(self.cache.warnings)  # a damaged cache it moved aside
        self.cache.warnings.clear()
        save_snapshot(self.lake, self.source, tree)
        freshness.clear_journal(self.lake, self.source)
        self.state.pending_vectors = self.pending_vectors()
        # Clean only when no other source's run is left unfinished (its journal entry remains).
        self.state.clean = not freshness.read_journal(self.lake)
        self.state.roots = {**(self.state.roots or {}), self.source: tree.root_hash}
        # A source's sync is not the project's run: `ctx status` reports the project's last run.
        if self.source == PROJECT_SOURCE:
            self.state.last_run = report.as_dict()
        else:
            self.state.source_runs = {**(self.state.source_runs or {}), self.source: report.as_dict()}
        self.state.write(self.lake)
        self.record = partial(self._record, report, self.state.pending_vectors)
        if not self.defer_record:
            self.record()

    def _record(self, report: IndexReport, pending_vectors: int) -> None:
        # The cache's upkeep (vectors encoded before their rows were written): every 16th small
        # append compacts its side table (~0.25 s on the service bench's cache), which the watcher
        # now does after readers may go on, not on an edit's way to being searchable.
        self.cache.maintain_if_appended()
        try:
            record_run(self.lake, self.tables, self.source, report, pending_vectors)
        except Exception as exc:  # the history is a nicety: a failure to append loses no index data
            report.warnings.append(f"index_runs not recorded: {exc}")


@flow(name="index-code", validate_parameters=False, log_prints=False)
def index_code(
    settings: Settings,
    source: str = PROJECT_SOURCE,
    root: Path | None = None,
    force: bool = False,
    embed: bool = True,
) -> IndexReport:
    """Index one source tree (the project itself by default) into the lake, incrementally."""
    # state.json is read once a run: the run goes on from it, and without it (missing or unreadable)
    # there is no previous index for a failed write to leave readable.
    damaged: LakeError | None = None
    try:
        state = IndexState.read(settings.lake_dir)
    except LakeError as exc:
        state, damaged = None, exc
    try:
        return _index_code(settings, source, root, force, embed, state, damaged)
    except LakeError as exc:
        if state is None and exc.hint == WRITE_FAILED_HINT:
            exc.hint = COLD_WRITE_FAILED_HINT
        raise


def _index_code(settings: Settings, source: str, root: Path | None, force: bool, embed: bool,
                state: IndexState | None, damaged: LakeError | None) -> IndexReport:
    """The run, from the state index_code read (`damaged`: why state.json could not be read)."""
    started = time.perf_counter()
    root = (root or settings.root).resolve()
    lake = settings.lake_dir
    progress = reporter()
    report = IndexReport(source=source, root=str(root))

    embedder = make_embedder(settings.embed, settings.models_dir)
    # --force rebuilds whatever it finds: an unreadable state.json is no state, an unreadable table
    # or index is dropped and built again (the files are on disk, the vectors in the cache).
    if damaged is not None and not force:
        raise damaged
    if check_model(state, embedder, force):
        reset_lake(lake)
        state = None
    if force:
        report.warnings.extend(drop_unreadable(lake))
    # A table gone from disk: every file is chunked again (vectors come from the cache), as the
    # snapshot would otherwise say nothing changed.
    lost = state is not None and bool(missing_tables(lake, settings.index.graph))
    previous = None if force or lost else load_snapshot(lake, source)

    progress.start("scan", None, "scanning")
    tree, diff, stats = scan(root, settings.index, previous)
    progress.finish("scan")
    journal = freshness.read_journal(lake)
    if state is not None and (not state.clean or source in journal):
        diff = freshness.with_journal(diff, tree, journal.get(source, []))
    report.files_seen, report.skipped = stats.seen, dict(stats.skipped)
    report.warnings.extend(f"skipped {path}: its name is not valid UTF-8 or holds a control character "
                           "(rename the file to index it)" for path in stats.bad_names)
    if stats.unreadable:
        report.warnings.append(unreadable_warning(stats.unreadable))
    report.added, report.modified, report.removed = len(diff.added), len(diff.modified), len(diff.removed)

    writer = Writer(settings, source, root, embedder, state)
    writer.embed_inline = embed
    if force:
        # Without a previous snapshot every file counts as added; files the lake still holds
        # but the disk no longer has must go too. Nothing is deleted up front, so readers see
        # the old index until each batch of files is replaced.
        gone = sorted(indexed_paths(writer.tables, source) - set(tree.entries))
        diff = Diff(diff.added, diff.modified, sorted(set(diff.removed) | set(gone)))
        report.removed = len(diff.removed)
    writer.known = set(tree.entries)
    if not settings.index.graph:
        clear_graph(writer.graph, source)
    writer.begin(diff)
    writer.apply(diff, report, force)
    if len(diff.changed) + len(diff.removed) > INLINE_EMBED_FILES:
        forget_known(writer.known)  # imports are resolved: its suffix index goes before the embed stage
    # Between the stages the heap's free pages go back (malloc_trim): the chunk stage and the BM25
    # build leave ~0.1-0.25 GB of them on the big repository, under the embed stage's peak.
    give_back_freed_memory()
    if build_fts(writer.tables):
        progress.note("keyword search is ready")
        give_back_freed_memory()
    # The embed stage builds the id index its writes go through; a run whose vectors all came from
    # the cache (a second checkout of a project, a lake deleted) never gets there, and without the
    # index every later upsert joins its batch against the whole table (the big tree: +0.6 GB).
    ensure_key_index(writer.tables.chunks, rebuild=False)
    writer.state.fts = FTS_TAG
    report.keyword_ready_s = time.perf_counter() - started
    writer.state.pending_vectors = writer.pending_vectors()
    writer.state.write(lake)

    if embed:
        # The count above is the stage's starting point: nothing was written since.
        writer.embed(report, force=force, pending=writer.state.pending_vectors)
        give_back_freed_memory()
    report.cochange_commits = update_cochange(writer.tables.db, lake, root, source)
    # Optimizing folds new rows into the indexes and compacts (3 s on django): worth it after a
    # big run, not after each one-file edit, whose rows stay searchable by a flat scan meanwhile.
    backlog = writer.state.unoptimized_rows + report.chunks_inserted + report.chunks_deleted + report.embedded
    deferred = os.environ.get(OPTIMIZE_ELSEWHERE_ENV) == "1"
    if force or previous is None or (backlog >= OPTIMIZE_AFTER_ROWS and not deferred):
        progress.start("optimize", None, "optimizing")
        optimize(writer.tables, whole=previous is None)
        optimize_graph(writer.graph, whole=previous is None)
        progress.finish("optimize")
        backlog = 0
    writer.state.unoptimized_rows = backlog
    report.model_setup_s = float(getattr(embedder, "setup_seconds", 0.0))
    if settings.run.executor == "dask":
        from ctxlake.tasks import dask_run

        report.executor = dask_run.describe(settings.run.dask_address)
    report.seconds = time.perf_counter() - started - report.model_setup_s
    report.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    writer.finish(tree, report)
    return report


def _write_changes(writer: Writer, diff: Diff, report: IndexReport, force: bool) -> None:
    """Changed and removed files -> the lake, one transaction per table and batch of files."""
    tables, cache, source = writer.tables, writer.cache, writer.source
    progress = reporter()
    todo = diff.changed + diff.removed
    if not todo:
        return
    # A lake with no rows of this source cannot hold stale rows: append instead of merging.
    where = f"source = {sql_str(source)}"
    cold = tables.files.count_rows(where) == 0 and tables.chunks.count_rows(where) == 0
    graph_cold = all(t.count_rows(where) == 0 for t in writer.graph)
    removed = set(diff.removed)
    jobs = [(batch, [p for p in batch if p not in removed]) for batch in slices(todo, BATCH_FILES)]
    progress.start("chunk", len(todo), "chunking")
    for batch, rows, with_graph_rows in _batch_rows(writer, jobs):
        chunks, hits = (rows.chunks, 0) if force else fill_from_cache(rows.chunks, cache)
        report.vectors_from_cache += hits
        if not force and writer.embed_inline and len(todo) <= INLINE_EMBED_FILES:
            t0 = time.perf_counter()
            chunks, encoded = embed_missing(chunks, cache, writer.embedder, INLINE_EMBED_TEXTS)
            report.embedded += encoded
            report.encode_seconds += (time.perf_counter() - t0) if encoded else 0.0
        writer.wrote(chunks)
        for reason, n in rows.skipped.items():
            report.skipped[reason] = report.skipped.get(reason, 0) + n
        report.secrets_masked += rows.secrets.masked
        report.warnings.extend(rows.warnings)
        if cold:
            append_chunks(tables, chunks, rows.files)
            report.chunks_inserted += chunks.num_rows
        else:
            result = upsert(tables, source, chunks, rows.files, batch)
            report.chunks_inserted += result.inserted
            report.chunks_deleted += result.deleted
        rows = with_graph_rows()  # after the chunks are in: an edit is searchable sooner
        if rows.graph is None:
            progress.advance("chunk", len(batch))
            continue
        # The graph after the chunks: a crash between them leaves the batch journaled, redone next run.
        report.warnings.extend(f"graph skipped {b}" for b in rows.graph_bad)
        if rows.graph_bad:
            report.skipped["graph_error"] = report.skipped.get("graph_error", 0) + len(rows.graph_bad)
        report.graph_rows += write_graph(writer.graph, source, rows.graph, batch, graph_cold)
        progress.advance("chunk", len(batch))
    progress.finish("chunk")


def _batch_rows(writer: Writer, jobs: list[tuple[list[str], list[str]]]
                ) -> Iterator[tuple[list[str], BatchRows, Callable[[], BatchRows]]]:
    """(batch, changed paths) -> (batch, its chunk and file rows, a call that adds its graph rows):
    chunked here, in order, with the graph extracted when the writer asks (after it wrote the
    chunks), or on the Dask cluster in the order workers finish; either way only this process
    writes them."""
    settings, dims = writer.settings, writer.embedder.dims
    if settings.run.executor == "dask":
        from ctxlake.tasks import dask_run

        client = dask_run.client_for(settings.run.dask_address)
        for batch, rows in dask_run.map_batches(client, writer.root, writer.source, jobs, settings.index, dims,
                                                writer.known):
            yield batch, rows, partial(_same, rows)
        return
    for batch, changed in jobs:
        chunked = chunk_files(writer.root, writer.source, changed, settings.index, dims)
        yield (batch, with_graph(chunked, writer.source, writer.known, False),
               partial(with_graph, chunked, writer.source, writer.known, settings.index.graph))


def _same(rows: BatchRows) -> BatchRows:
    return rows

"""Pipeline: plan -> scrape -> redact -> link projects -> store messages -> sessionize -> compact -> extract -> knowledge -> embed -> FTS."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow

from ctxlake.schemas.config import Settings
from ctxlake.tasks.compact import compact
from ctxlake.tasks.embed_cache import EmbeddingCache
from ctxlake.tasks.embedders import make_embedder
from ctxlake.tasks.extract import extract_candidates
from ctxlake.tasks.heap import give_back_freed_memory
from ctxlake.tasks.knowledge import ingest_knowledge, load_records
from ctxlake.tasks.lake import IndexState
from ctxlake.tasks.memory_state import (
    MANIFEST_FILE,
    clear_touched,
    embed_key,
    keep_positions,
    manifest_changed,
    read_project_paths,
    read_touched,
    save_manifest,
    take_positions,
    write_project_paths,
    write_touched,
)
from ctxlake.tasks.memory_store import (
    EMBED_WHERE,
    KNOWLEDGE_TABLE,
    MESSAGES_TABLE,
    SESSIONS_TABLE,
    RunIds,
    StoreResult,
    embed_table,
    ensure_scalar_indexes,
    index_and_optimize,
    messages_table,
    open_knowledge,
    open_memory,
    reset_vectors,
    store_messages,
    store_sessions,
    vector_width,
)
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.redact import redact_scraped
from ctxlake.tasks.scrape import (
    SCRAPERS,
    malformed_totals,
    plan,
    prune,
    read_limits,
    scrape_group,
    split,
)
from ctxlake.tasks.scrape.base import Counts, ScrapeOutput, SessionMeta
from ctxlake.tasks.sessionize import (
    known_projects,
    link_projects,
    sessionize,
    touched_filter,
    under,
)
from ctxlake.tasks.store import slices
from ctxlake.tasks.upkeep import OPTIMIZE_ELSEWHERE_ENV

SESSIONS_PER_BATCH = 200  # bounds the message rows held in memory while summarizing


@dataclass
class IngestReport:
    """What one run did; printed by the CLI, stored in the memory lake's state.json as `last_run`."""

    root: str
    embed_settings: str = ""  # lets the next no-op check know the model id without loading embedders
    embed_messages: bool = True  # [memory] embed_messages of this run: turned on, older messages need vectors
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # scraper -> counts
    files_seen: int = 0
    files_changed: int = 0
    bytes_read: int = 0
    messages_inserted: int = 0
    messages_updated: int = 0
    duplicates: int = 0
    unknown_records: int = 0
    malformed_records: int = 0
    # Over every log present (not only this run's new lines): scraper -> reason -> records.
    malformed_in_logs: dict[str, dict[str, int]] = field(default_factory=dict)
    redacted: int = 0
    linked: int = 0
    sessions_written: int = 0
    knowledge_rows: int | None = None  # None: knowledge files unchanged, table kept
    knowledge_problems: list[str] = field(default_factory=list)
    candidates: dict[str, int] = field(default_factory=dict)  # created / superseded / duplicate
    embedded: dict[str, int] = field(default_factory=dict)
    optimized: list[str] = field(default_factory=list)  # tables compacted this run (see optimize_due)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # where malformed records were skipped
    seconds: float = 0.0
    finished_at: str = ""

    _counts: dict[str, Counts] = field(default_factory=dict, repr=False)

    def add_group(self, scraper: str, out: ScrapeOutput, rows: int, stored: StoreResult, redacted: int,
                  new_bytes: int) -> None:
        """Account for one scraped and stored group of files."""
        self.messages_inserted += stored.inserted
        self.messages_updated += stored.updated
        # Copies within this batch (a fork and its parent read together) never reach the store.
        self.duplicates += stored.duplicates + len(out.messages) - rows
        self.redacted += redacted
        self.bytes_read += new_bytes
        self.warnings.extend(out.warnings[:20])
        self.problems.extend(out.problems[:50])
        self._counts.setdefault(scraper, Counts()).add(out.counts)
        self.tools[scraper] = asdict(self._counts[scraper])
        self.unknown_records = sum(c.n_unknown for c in self._counts.values())
        self.malformed_records = sum(c.n_malformed for c in self._counts.values())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("_counts")
        out["warnings"] = self.warnings[:50]
        out["problems"] = self.problems[:50]
        return out


@flow(name="ingest-conversations", validate_parameters=False, log_prints=False)
def ingest_conversations(settings: Settings, roots: dict[str, list[Path]], embed: bool = True,
                         optimize: bool = False) -> IngestReport:
    """Read every agent tool's logs into the user-wide memory lake and this project's knowledge into its lake.

    Tables are compacted when enough small ingests have piled up (`optimize_due`), or always with `optimize`.
    """
    started = time.perf_counter()
    memory = settings.memory
    report = IngestReport(root=str(settings.root), embed_settings=embed_key(settings),
                          embed_messages=memory.embed_messages)
    progress = reporter()
    embedder = make_embedder(settings.embed, settings.models_dir)
    dims = embedder.dims

    state = IndexState.read(settings.memory_dir) or IndexState()
    tables = open_memory(settings.memory_dir, dims)
    # Whether rows may lack their vector from before this run (a first run, a crash, --no-embed,
    # another model): then the embed passes scan the tables; otherwise this run's own writes,
    # embedded as they are stored when small, are all there is to embed.
    backlog = (not state.last_run or not state.clean or state.pending_vectors > 0
               or state.last_run.get("embed_messages") is not memory.embed_messages)
    for table in (tables.messages, tables.sessions):
        # Another model: rows stay (the logs may be gone), vectors are refilled from the cache.
        if state.model_id not in ("", embedder.model_id) or vector_width(table) != dims:
            reset_vectors(table, dims)
            backlog = True
    state.provider, state.model, state.model_id, state.dims = (
        settings.embed.provider, settings.embed.model, embedder.model_id, dims)
    state.clean = False
    state.write(settings.memory_dir)
    cache = EmbeddingCache(settings.cache_dir, embedder.model_id, dims)

    scrape_state, work_planned = take_positions(settings.memory_dir, roots)
    work = work_planned or plan(roots, scrape_state)
    prune(scrape_state, work.removed)
    report.files_seen, report.files_changed = work.store_files, work.changed_files
    report.warnings.extend(work.warnings)
    known = {str(settings.root)} | known_projects(tables.sessions)
    # The project paths the tables hold, recorded for the read side's scoped queries (an IN list
    # over a bitmap index); a lake from before the record is read for them once.
    project_paths = read_project_paths(settings.memory_dir)
    if project_paths is None:
        project_paths = known_projects(tables.messages) | known
        write_project_paths(settings.memory_dir, project_paths)
    # Sessions a crashed run stored messages for but never summarized are redone now.
    touched: set[tuple[str, str]] = read_touched(settings.memory_dir)
    meta: dict[tuple[str, str], SessionMeta] = {}
    limits = read_limits(memory)
    inline = {MESSAGES_TABLE: 0, SESSIONS_TABLE: 0}  # texts embedded as their rows were stored
    run_ids = RunIds() if tables.messages.count_rows() == 0 else None  # a first run appends without merging
    progress.start("scrape", work.changed_files, "reading logs")
    for item in work.items:
        for group in split(item):
            out = scrape_group(group, scrape_state, limits)
            out, redaction = redact_scraped(out, memory.max_text_chars)
            report.linked += link_projects(out, known)
            rows = messages_table(out.messages, dims)
            stored = store_messages(tables, rows, SCRAPERS[group.scraper].mutable, cache,
                                    embedder if embed else None, memory.embed_messages, run_ids)
            backlog |= stored.unembedded > 0
            if new_paths := {m.project_path for m in out.messages if m.project_path} - project_paths:
                project_paths |= new_paths
                write_project_paths(settings.memory_dir, project_paths)  # before the positions move on
            inline[MESSAGES_TABLE] += stored.embedded
            touched |= {(m.tool, m.session_id) for m in out.messages}
            # Positions are saved only once their rows are committed (a crash re-reads, ids
            # de-duplicate), and after the sessions to summarize are journaled.
            write_touched(settings.memory_dir, touched)
            scrape_state.save(settings.memory_dir)
            report.add_group(group.scraper, out, rows.num_rows, stored, redaction.masked, group.new_bytes)
            for key, facts in out.meta.items():
                meta.setdefault(key, SessionMeta(*key)).merge(facts)
            known |= {m.project_path for m in out.messages if m.project_path}
            progress.advance("scrape", len(group.files))
            # The group's parsed records and Arrow buffers are freed; their pages go back now
            # instead of staying with the allocator (see _run_flow in serve/cli/memory.py).
            give_back_freed_memory()
    progress.finish("scrape")
    scrape_state.save(settings.memory_dir)
    keep_positions(settings.memory_dir, scrape_state)  # not changed from here on
    ensure_scalar_indexes(tables.messages)  # the summaries below read messages by session id
    report.malformed_in_logs = malformed_totals(scrape_state)

    # Sessions are summarized a batch at a time: a cold ingest touches every session there is.
    for batch in slices(sorted(touched), SESSIONS_PER_BATCH):
        segments = sessionize(tables.messages, tables.sessions, set(batch), meta, memory.gap_minutes)
        rows, warnings = compact(segments, memory, dims)
        report.warnings.extend(warnings)
        written = store_sessions(tables.sessions, rows, touched_filter(batch), cache, embedder if embed else None)
        report.sessions_written += written.inserted
        backlog |= written.unembedded > 0
        inline[SESSIONS_TABLE] += written.embedded
        if memory.extract:
            mine = [s for s in segments if s.project_path and under(s.project_path, str(settings.root))]
            for result in extract_candidates(mine, settings.knowledge_dir, settings.root, settings.lake_dir, cache,
                                             embedder, memory.duplicate_threshold, memory.supersede_threshold):
                report.candidates[result.status] = report.candidates.get(result.status, 0) + 1
    clear_touched(settings.memory_dir)

    knowledge = open_knowledge(settings.lake_dir, dims)
    if manifest_changed(settings.lake_dir, settings.knowledge_dir, embedder.model_id) or not (
            settings.lake_dir / MANIFEST_FILE).exists():
        if vector_width(knowledge) != dims:
            reset_vectors(knowledge, dims)
        records, problems = load_records(settings.knowledge_dir, settings.root)
        report.knowledge_rows = ingest_knowledge(knowledge, records, cache)
        report.knowledge_problems = problems
        save_manifest(settings.lake_dir, settings.knowledge_dir, embedder.model_id)

    if embed:
        report.embedded = {
            MESSAGES_TABLE: inline[MESSAGES_TABLE] + (
                embed_table(tables.messages, MESSAGES_TABLE, cache, embedder, memory.embed_messages) if backlog else 0),
            SESSIONS_TABLE: inline[SESSIONS_TABLE] + (
                embed_table(tables.sessions, SESSIONS_TABLE, cache, embedder) if backlog else 0),
            KNOWLEDGE_TABLE: embed_table(knowledge, KNOWLEDGE_TABLE, cache, embedder),
        }
    progress.start("optimize", None, "indexing")
    compact_here = os.environ.get(OPTIMIZE_ELSEWHERE_ENV) != "1"
    report.optimized = index_and_optimize([tables.messages, tables.sessions, knowledge], force=optimize,
                                          compact_here=compact_here)
    # Rows left for a run of its own to consider compacting (memory_state.check sends that run on
    # past its no-op path); a run that looked, whatever it found due, clears them.
    rows_written = report.messages_inserted + report.messages_updated + report.sessions_written
    state.unoptimized_rows = 0 if compact_here else state.unoptimized_rows + rows_written
    cache.maintain()  # a scheduled run appends a few vectors: the cache folds them in bulk
    progress.finish("optimize")

    report.seconds = round(time.perf_counter() - started, 3)
    report.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    state.pending_vectors = 0 if embed else tables.sessions.count_rows(EMBED_WHERE[SESSIONS_TABLE]) + (
        tables.messages.count_rows(EMBED_WHERE[MESSAGES_TABLE]) if memory.embed_messages else 0)
    state.clean = True
    state.last_run = report.as_dict()
    state.write(settings.memory_dir)
    return report


__all__ = ["IngestReport", "ingest_conversations"]

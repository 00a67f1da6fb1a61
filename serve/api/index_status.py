"""Index status of a project (CHUNKS, FILES, the run state): what `ctx status` and the MCP status resource answer."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from ctxlake.errors import ConfigError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.serve.api.code_search import mark_stale
from ctxlake.serve.api.models import Status
from ctxlake.serve.api.watched import project_freshness
from ctxlake.tasks.lake import (
    CHUNKS_TABLE,
    FILES_TABLE,
    IndexState,
    WriterLock,
    connect,
    open_table,
)
from ctxlake.tasks.merkle import not_indexed
from ctxlake.tasks.run_log import folder_stamp
from ctxlake.tasks.secrets import MASK_PREFIX


def memory_malformed(memory_dir: Path) -> dict[str, dict[str, int]]:
    """Malformed records in the conversation logs as of the last `ctx run ingest` (read from its saved positions)."""
    from ctxlake.errors import LakeError
    from ctxlake.tasks.scrape import ScrapeState, malformed_totals

    try:
        return malformed_totals(ScrapeState.load(memory_dir))
    except (LakeError, TypeError, ValueError):  # a damaged state file: status still answers
        return {}


def status(settings: Settings, check_stale: bool = True) -> Status:
    """What is indexed, with which model, how fresh, and whether an indexer is running."""
    lake_dir = settings.lake_dir
    out = Status(root=str(settings.root), lake_dir=str(lake_dir), indexed=False)
    out.config_trust = _config_trust(settings)
    out.writer = WriterLock(lake_dir).held_by_other() if lake_dir.is_dir() else None
    out.memory_malformed = memory_malformed(settings.memory_dir)
    state = IndexState.read(lake_dir) if lake_dir.is_dir() else None
    if state is None:
        return out
    out.provider, out.model, out.model_id, out.dims = state.provider, state.model, state.model_id, state.dims
    out.last_run, out.clean = state.last_run, state.clean
    out.source_runs = dict(state.source_runs or {})
    lake_bytes, stamp = folder_stamp(lake_dir)
    # A clean state with nothing pending is exact (every writer of chunks is an index run, which
    # marks the state unclean until it has counted again): the count reads the whole vector column
    # (0.3 s and ~0.3 GB on the 100k-file tree).
    counts = _index_counts(lake_dir, stamp, none_pending=state.clean and state.pending_vectors == 0)
    if counts is not None:
        out.indexed = True
        out.chunks, out.pending_vectors, out.files = counts.chunks, counts.pending_vectors, counts.files
        out.embedded = out.chunks - out.pending_vectors
        out.languages, out.sources = dict(counts.languages), dict(counts.sources)
        out.masked_chunks = counts.masked_chunks
    # From the snapshot of the last whole scan (a watcher's batch sees only the changed paths).
    for _, why, _ in not_indexed(lake_dir, PROJECT_SOURCE):
        out.not_indexed[why] = out.not_indexed.get(why, 0) + 1
    out.secret_files_skipped = out.not_indexed.get("secret", 0)
    if check_stale:
        mark_stale(out, project_freshness(settings))
    out.lake_bytes = lake_bytes
    return out


def not_indexed_files(settings: Settings) -> list[tuple[str, str, int]]:
    """(path, reason, bytes) of the project's files the last scan saw but did not index, by path."""
    return not_indexed(settings.lake_dir, PROJECT_SOURCE)


class IndexCounts(NamedTuple):
    chunks: int
    pending_vectors: int
    files: int
    languages: dict[str, int]  # files per language
    sources: dict[str, int]  # chunks per source
    masked_chunks: int


# lake folder -> (its stamp when counted, the counts): a long-lived reader (the UI's Overview, the MCP
# server) recounts only after a write; the masked-text count alone reads every chunk's text (~0.3 s
# on django's lake).
_counted: dict[str, tuple[int, IndexCounts | None]] = {}


def _index_counts(lake_dir: Path, stamp: int, none_pending: bool = False) -> IndexCounts | None:
    """The index tables' counts for `status`, or None when they do not exist yet; the stamp is taken
    before the tables are read, so a write landing meanwhile is counted by the next call.
    `none_pending`: the caller knows no chunk is without a vector (not counted then)."""
    hit = _counted.get(str(lake_dir))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    db = connect(lake_dir)
    chunks, files = open_table(db, CHUNKS_TABLE), open_table(db, FILES_TABLE)
    counts = None
    if chunks is not None and files is not None:
        file_rows = files.search().select(["lang", "source"]).to_arrow()
        chunk_sources = chunks.search().select(["source"]).to_arrow()
        counts = IndexCounts(
            chunks=chunks.count_rows(), pending_vectors=0 if none_pending else chunks.count_rows("vector IS NULL"),
            files=file_rows.num_rows,
            languages=_counts(file_rows.column("lang")), sources=_counts(chunk_sources.column("source")),
            masked_chunks=chunks.count_rows(f"text LIKE '%{MASK_PREFIX}%'"))
    _counted[str(lake_dir)] = (stamp, counts)
    return counts


def _config_trust(settings: Settings) -> dict[str, Any]:
    import tomllib

    from ctxlake.schemas import trust
    from ctxlake.schemas.sources import untrusted_sources

    try:
        parsed = tomllib.loads(settings.config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        parsed = {}  # absent (reported as such) or unparsable (load_settings already said so)
    st = trust.state(settings.config_path, parsed, settings.home)
    with contextlib.suppress(ConfigError):  # a broken sources.toml is reported by the commands that use it
        st.untrusted_sources = [s.name for s in untrusted_sources(settings.root, settings.home)]
    return {**st.as_dict(), "summary": st.summary}


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    import pyarrow.compute as pc

    counts = pc.value_counts(column.fill_null("(unknown)")).to_pylist()
    return dict(sorted(((c["values"], c["counts"]) for c in counts), key=lambda kv: -kv[1]))

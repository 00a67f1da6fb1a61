"""Chunk stage: changed files of a source -> decoded text -> secrets masked -> CHUNKS rows (vectors null) and FILES rows,
then the graph stage's DEFINITIONS, REFERENCES and IMPORTS rows of the same batch."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import xxhash
from tree_sitter import Tree

from ctxlake.schemas.config import IndexSettings
from ctxlake.schemas.tables import FILES, chunks_schema
from ctxlake.tasks import safe_io
from ctxlake.tasks.chunk import Chunk, ChunkOptions, chunk_text, language_for
from ctxlake.tasks.graph import graph_files
from ctxlake.tasks.safe_io import decode_text
from ctxlake.tasks.secrets import MaskReport, mask_text
from ctxlake.tasks.stage import stage
from ctxlake.tasks.terms import chunk_terms

# --- the chunk stage: changed files -> CHUNKS rows (no vectors yet) and their FILES rows ---------

# Parses kept for the graph stage, by source size: a tree takes ~20x its text in memory, so a
# batch keeps at most ~90 MB of them; the graph parses the files beyond that again.
TREES_KEPT_CHARS = 4_000_000


class ChunkedFiles(NamedTuple):
    chunks: pa.Table  # CHUNKS rows, vector null
    files: pa.Table  # FILES rows of the files that produced chunks
    skipped: dict[str, int]  # reason -> count (vanished, undecodable, ...)
    warnings: list[str]
    secrets: MaskReport  # values masked in these files
    # path -> (masked text, lang) of the code files read, for the graph stage (no second read)
    texts: dict[str, tuple[str, str]]
    trees: dict[str, Tree]  # path -> the chunker's parse of that text, so the graph does not parse again


def chunk_id(source: str, path: str, chunk: Chunk, content_hash: str) -> str:
    key = f"{source}\0{path}\0{chunk.start_line}\0{chunk.end_line}\0{chunk.symbol or ''}\0{content_hash}"
    return xxhash.xxh3_128(key.encode()).hexdigest()


def chunk_rows(
    source: str, path: str, text: str, lang: str | None, opts: ChunkOptions
) -> tuple[list[dict[str, object]], str | None, Tree | None]:
    """One decoded file -> its CHUNKS rows (without vectors), the chunker's warning and its parse."""
    result = chunk_text(text, lang, opts)
    rows: list[dict[str, object]] = []
    for chunk in result.chunks:
        content_hash = xxhash.xxh3_128(chunk.text.encode("utf-8", "surrogatepass")).hexdigest()
        rows.append(
            {
                "id": chunk_id(source, path, chunk, content_hash),
                "source": source,
                "path": path,
                "lang": lang,
                "kind": chunk.kind,
                "symbol": chunk.symbol,
                "start_line": chunk.start_line,
                "end_line": chunk.end_line,
                "text": chunk.text,
                "terms": chunk_terms(path, chunk.symbol, chunk.text),
                "content_hash": content_hash,
                "vector": None,
            }
        )
    return rows, result.warning, result.tree


@stage("chunk")
def chunk_files(
    root: Path, source: str, paths: Sequence[str], index: IndexSettings, dims: int
) -> ChunkedFiles:
    """Changed paths of a source -> CHUNKS rows without vectors + FILES rows; bad files skipped."""
    opts = ChunkOptions.from_settings(index)
    now = datetime.now(UTC)
    chunk_rows_all: list[dict[str, object]] = []
    file_rows: list[dict[str, object]] = []
    skipped: dict[str, int] = {}
    warnings: list[str] = []
    secrets = MaskReport()
    texts: dict[str, tuple[str, str]] = {}
    trees: dict[str, Tree] = {}
    kept_chars = 0
    for path in paths:
        full = root / path
        try:
            st = full.lstat()
            data = safe_io.read_regular(full, index.max_file_bytes)
        except FileNotFoundError:
            skipped["vanished"] = skipped.get("vanished", 0) + 1
            continue
        except safe_io.NotRegularFile:
            skipped["special"] = skipped.get("special", 0) + 1  # became a FIFO or link since the scan
            continue
        except safe_io.TooLarge:
            skipped["too_large"] = skipped.get("too_large", 0) + 1
            continue
        except OSError as exc:
            skipped["unreadable"] = skipped.get("unreadable", 0) + 1
            warnings.append(f"{path}: cannot read ({exc.strerror})")
            continue
        text, warning = decode_text(data)
        if text is None:
            skipped["undecodable"] = skipped.get("undecodable", 0) + 1
            warnings.append(f"{path}: skipped, {warning}")
            continue
        if warning:
            warnings.append(f"{path}: {warning}")
        # The whole file, before chunking: a key block cut in two by a chunk boundary would not
        # be recognised in either half. Line breaks are kept, so chunk lines are the file's lines;
        # the content hash (the embedding cache's key) and the terms are those of the masked text.
        text = mask_text(text, path, secrets)
        lang = language_for(path)
        rows, chunk_warning, tree = chunk_rows(source, path, text, lang, opts)
        if chunk_warning:
            warnings.append(f"{path}: {chunk_warning}")
        chunk_rows_all.extend(rows)
        if lang is not None:
            texts[path] = (text, lang)
            if tree is not None and kept_chars + len(text) <= TREES_KEPT_CHARS:
                trees[path] = tree
                kept_chars += len(text)
        file_rows.append(
            {
                "source": source,
                "path": path,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "hash": xxhash.xxh3_128(data).hexdigest(),
                "lang": lang,
                "n_chunks": len(rows),
                "indexed_at": now,
            }
        )
    return ChunkedFiles(
        pa.Table.from_pylist(chunk_rows_all, schema=chunks_schema(dims)),
        pa.Table.from_pylist(file_rows, schema=FILES),
        skipped,
        warnings,
        secrets,
        texts,
        trees,
    )


class BatchRows(NamedTuple):
    """One batch of files, ready for the writer. Plain Arrow and built-ins, no parse trees, so a
    Dask worker can return it to the flow."""

    chunks: pa.Table  # CHUNKS rows, vector null
    files: pa.Table  # FILES rows
    skipped: dict[str, int]
    warnings: list[str]
    secrets: MaskReport
    graph: tuple[pa.Table, pa.Table, pa.Table] | None  # DEFINITIONS, REFERENCES, IMPORTS; None: graph off
    graph_bad: list[str]  # `path: reason` per file the graph stage skipped


def with_graph(rows: ChunkedFiles, source: str, known: Collection[str] | None, graph: bool) -> BatchRows:
    """A chunked batch -> the same rows plus its graph tables (imports resolve against `known`,
    every path of the source; by default the batch's own files)."""
    tables: tuple[pa.Table, pa.Table, pa.Table] | None = None
    bad: list[str] = []
    if graph:
        defs, refs, imports, bad = graph_files(rows.texts, source, known or set(rows.texts), rows.trees)
        tables = (defs, refs, imports)
    return BatchRows(rows.chunks, rows.files, rows.skipped, rows.warnings, rows.secrets, tables, bad)

"""Wire formats of the MCP tools beyond search (symbols, file context, freshness, sources, docs) and their paging cursor."""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from ctxlake.errors import InputError
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.serve.api.models import FileSearchResult, Hit, SearchResult


class CodeSearchResult(SearchResult):
    """search_code's answer: the ranked chunks, plus what was searched and how fresh it is."""


class FileRanking(FileSearchResult):
    """find_files' answer: files ranked for the query, each with its best-matching chunk."""

    stale: bool = Field(False, description="files changed since the last index run")
    stale_paths: list[str] = Field(default_factory=list, description="the changed files (at most 50)")


class Symbol(BaseModel):
    """A function, method, class or section whose name matched."""

    symbol: str = Field(description="qualified name, e.g. Flask.register_blueprint")
    kind: str = Field(description="function, method, class, section ...")
    source: str = Field(description="indexed source the file belongs to ('project' = this repository)")
    path: str = Field(description="file path relative to the source root")
    start_line: int = Field(description="first line of the definition, 1-based")
    end_line: int = Field(description="last line, inclusive")
    lang: str | None = Field(None, description="language of the file")
    score: float = Field(description="name similarity 0-100; 100 = exact (case-insensitive)")


class SymbolMatches(BaseModel):
    query: str
    symbol_type: str | None = Field(None, description="the kind filter that was applied, if any")
    matches: list[Symbol] = Field(description="best first; typos, case and separators are tolerated")
    stale: bool = Field(description="true when files changed since the last index run")
    warnings: list[str] = Field(default_factory=list)


class Outline(BaseModel):
    """A chunk of the file that overlaps the returned lines."""

    symbol: str | None = None
    kind: str
    start_line: int
    end_line: int


class FileContext(BaseModel):
    """A slice of one indexed file, read from disk, with its outline and (on request) related code."""

    source: str = Field(PROJECT_SOURCE, description="the indexed source of the file ('project' = this repository)")
    path: str = Field(description="file path relative to the project root (or to the source's root)")
    lang: str | None = None
    start_line: int = Field(description="first line returned, 1-based")
    end_line: int = Field(description="last line returned, inclusive")
    total_lines: int = Field(description="lines in the whole file")
    content: str = Field(description="the lines start_line..end_line, verbatim")
    truncated: bool = Field(description="true when fewer lines came back than asked (size bound)")
    next_start_line: int | None = Field(None, description="ask again from here to read on; null at the end")
    outline: list[Outline] = Field(default_factory=list, description="indexed chunks overlapping the slice")
    related: list[Hit] = Field(default_factory=list, description="chunks most similar to this slice in other files (include_related=true)")
    stale: bool = Field(description="true when the file on disk differs from what was indexed")
    warnings: list[str] = Field(default_factory=list)


class StaleFile(BaseModel):
    path: str
    change: Literal["added", "modified", "removed"]


class EmbeddingProgress(BaseModel):
    chunks: int
    embedded: int
    pending: int
    fraction: float = Field(description="embedded / chunks (1.0 when there are no chunks)")
    model_id: str = Field(description="the embedding model the index was built with")


class StaleStatus(BaseModel):
    """Does the index still match the files on disk, and how far has embedding got?"""

    indexed: bool
    up_to_date: bool = Field(description="true when a `ctx run index` would find nothing to do")
    reason: str = Field(description="why not up to date, in words")
    root_hash_indexed: str | None = Field(None, description="Merkle root of the files at the last clean run")
    root_hash_current: str | None = Field(None, description="Merkle root of the files on disk now")
    root_hash_match: bool
    stale_count: int = Field(description="files added, modified or removed since the last run")
    stale_files: list[StaleFile] = Field(default_factory=list, description="the first 100 of them")
    embedding: EmbeddingProgress | None = None
    last_run: dict[str, Any] | None = Field(None, description="what the last `ctx run index` did")
    indexer_running: dict[str, Any] | None = Field(None, description="the indexer holding the lake, if one runs")
    checked_in_ms: float = 0.0


class DocEntry(BaseModel):
    """One readable document. Field names follow the docs-reader contract (camelCase)."""

    path: str = Field(description="pass this to docs_content")
    name: str = Field(description="file name")
    sizeBytes: int
    modifiedAt: str = Field(description="last modification, UTC ISO 8601")


class DocsIndex(BaseModel):
    sources: list[str] = Field(description="the configured docs folders (names usable as `source`)")
    documents: list[DocEntry]
    total: int = Field(description="documents in the listing, over all pages")
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last")
    warnings: list[str] = Field(default_factory=list)


class DocContent(BaseModel):
    path: str
    chunk: int = Field(description="1-based chunk number")
    totalChunks: int
    totalLines: int
    startLine: int
    endLine: int
    content: str
    warnings: list[str] = Field(default_factory=list)


class FileEntry(BaseModel):
    source: str
    path: str
    lang: str | None = None
    size: int
    chunks: int


class FilePage(BaseModel):
    files: list[FileEntry]
    total: int
    next_cursor: str | None = Field(None, description="read ctx://files?cursor=... for the next page")


class IndexStarted(BaseModel):
    started: bool
    pid: int | None = None
    log_file: str | None = None
    message: str


# -- paging --------------------------------------------------------------------------------------


def encode_cursor(kind: str, offset: int, key: str = "") -> str:
    """An opaque cursor: which listing, where it stopped, and what it was a listing of."""
    raw = json.dumps({"k": kind, "o": offset, "q": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, kind: str, key: str = "") -> int:
    """The offset inside a cursor made by encode_cursor for the same listing; InputError otherwise."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        offset = int(data["o"])
        same = data["k"] == kind and data.get("q", "") == key
    except (ValueError, KeyError, TypeError):
        raise InputError(f"invalid cursor {cursor[:40]!r}",
                         hint="pass back the next_cursor of the previous page unchanged") from None
    if not same or offset < 0:
        raise InputError("this cursor belongs to another listing",
                         hint="start again without a cursor, with the same arguments")
    return offset


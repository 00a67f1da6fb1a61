"""Wire formats of the read side: what `--json` prints and what MCP tools return."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from ctxlake.tasks.tokens import estimate_tokens

# One vocabulary for every face: the CLI's --mode, MCP's search_type and the eval harness.
SearchMode = Literal["hybrid", "keyword", "semantic", "fuzzy"]
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)


class Hit(BaseModel):
    """One search result: a chunk of a file."""

    source: str = Field(description="which indexed source the file belongs to ('project' = this repository)")
    path: str = Field(description="file path relative to the source root")
    start_line: int = Field(description="first line of the chunk, 1-based")
    end_line: int = Field(description="last line of the chunk, inclusive")
    symbol: str | None = Field(None, description="qualified name of the function/class/section, if any")
    kind: str = Field(description="function, method, class, section, lines ...")
    lang: str | None = Field(None, description="language of the file")
    rank: int = Field(description="position in this answer: 1 is the most relevant")
    snippet: str = Field(description="the start of the chunk's text, trimmed")


class SearchResult(BaseModel):
    query: str
    mode: SearchMode
    hits: list[Hit]
    stale: bool = Field(description="true when files changed since the last index run")
    stale_paths: list[str] = Field(default_factory=list, description="changed files (first 50)")
    embedded_fraction: float | None = Field(
        None, description="share of chunks with vectors (semantic coverage); counted by hybrid and semantic searches")
    warnings: list[str] = Field(default_factory=list)
    tokens_used: int = Field(0, description="estimated tokens of the hits returned (about 4 characters a token)")
    omitted: int = Field(0, description="hits left out to stay within the token budget")
    took_ms: float = 0.0


def hit_tokens(hit: Hit) -> int:
    """What one hit costs a reader: its location line and its snippet."""
    return estimate_tokens(f"{hit.path}:{hit.start_line}-{hit.end_line} {hit.symbol or ''} {hit.kind}\n{hit.snippet}")


class Status(BaseModel):
    root: str
    lake_dir: str
    indexed: bool
    files: int = 0
    chunks: int = 0
    embedded: int = 0
    pending_vectors: int = 0
    languages: dict[str, int] = Field(default_factory=dict, description="files per language")
    sources: dict[str, int] = Field(default_factory=dict, description="chunks per source")
    provider: str = ""
    model: str = ""
    model_id: str = ""
    dims: int = 0
    last_run: dict[str, Any] | None = Field(None, description="the project's last index run")
    source_runs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="each source's last index run (`ctx add`, `ctx update`)")
    clean: bool = True
    stale: bool = False
    stale_count: int = 0
    behind: str | None = Field(None, description=(
        "why the index is behind the project's files when no file changed: not indexed yet, "
        "the last run did not finish, chunks still to embed"))
    stale_paths: list[str] = Field(default_factory=list)
    lake_bytes: int = 0
    writer: dict[str, Any] | None = Field(None, description="the indexer holding the lake, if one runs")
    config_trust: dict[str, Any] | None = Field(
        None, description="whether .ctx/config.toml is trusted to run commands (`ctx trust`), and what it sets")
    memory_malformed: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="conversation logs: malformed records and skipped files per scraper and reason")
    secret_files_skipped: int = Field(0, description="files not indexed because their name says they hold secrets")
    not_indexed: dict[str, int] = Field(
        default_factory=dict, description="the project's files seen but not indexed, per reason (binary, too_large, "
                                          "secret, generated, special, unreadable, bad_name; unreadable_folder counts folders "
                                          "that could not be listed); `ctx status --skipped` lists them")
    masked_chunks: int = Field(0, description="chunks in which the secrets stage masked a value")


class FileHit(BaseModel):
    """One file in a file-level ranking, with the chunk that matched best."""

    source: str = Field(description="which indexed source the file belongs to ('project' = this repository)")
    path: str = Field(description="file path relative to the source root")
    rank: int = Field(description="position in this ranking: 1 is the file to open first")
    start_line: int | None = Field(None, description="first line of the best-matching chunk, if a chunk matched")
    end_line: int | None = Field(None, description="last line of that chunk")
    symbol: str | None = Field(None, description="symbol of that chunk, if any")


class FileSearchResult(BaseModel):
    query: str
    mode: SearchMode
    files: list[FileHit]
    warnings: list[str] = Field(default_factory=list)
    took_ms: float = 0.0

"""Wire formats of sources and subagents: what `ctx list --json`, `ctx ask --json` and the MCP ask_codebase tool return."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SourceInfo(BaseModel):
    """One source as `ctx list` and MCP list_sources see it: 'project' (MCP only) or one from `ctx add`."""

    name: str = Field(description="the source's name; pass it in `sources` to search or ask only it")
    type: str | None = Field(None, description=(
        "git (a repository), local (a folder indexed in place) or web (llms.txt / docs pages); none for 'project'"))
    origin: str | None = Field(None, description="git URL, folder, or web URL it comes from")
    ref: str | None = Field(None, description="branch, tag or commit asked for (git); none = default branch")
    ref_kind: str | None = Field(None, description="branch | tag | commit | default (git)")
    resolved: str | None = Field(None, description="the commit sha (git) or page-set digest (web) indexed now")
    paths: list[str] = Field(default_factory=list, description="only these parts of the source are indexed")
    excludes: list[str] = Field(default_factory=list)
    docs: bool = Field(False, description="only documentation files are indexed (added with add-docs)")
    files: int = Field(0, description="files of this source in the index")
    chunks: int = Field(0, description="chunks of this source in the index")
    embedded: int = Field(0, description="chunks with vectors (listed with the index: MCP)")
    languages: dict[str, int] = Field(default_factory=dict, description="files per language (MCP)")
    last_indexed: str | None = Field(None, description="newest indexed_at of its files (UTC, ISO 8601; MCP)")
    added_at: str | None = None
    updated_at: str | None = Field(None, description="last sync that brought content")
    status: str | None = Field(None, description=(
        "ok | partial (some pages missing) | failed (last sync) | not synced | undeclared; none for 'project'"))
    message: str | None = Field(None, description="why the last sync failed or was partial")
    root: str | None = Field(None, description="the folder that is indexed")


class SourceList(BaseModel):
    sources: list[SourceInfo]
    model_id: str = Field("", description="the embedding model of the index (MCP)")
    last_run: str | None = Field(None, description="when the last index run finished (MCP)")


class AskResult(BaseModel):
    """A subagent's answer to a question about some sources."""

    agent: str = Field(description="which agent answered (claude-code, gemini, opencode, codex, ...)")
    sources: list[str] = Field(description="the sources linked into the agent's sandbox")
    answer: str = Field(description="the agent's stdout")
    stderr: str = Field("", description="the agent's stderr (logs, warnings)")
    exit_code: int | None = Field(description="the agent's exit status")
    truncated: bool = Field(False, description="true when output went over the size cap and was cut")
    seconds: float = 0.0
    hits_in_prompt: int = Field(0, description="search hits from the index written into the agent's prompt")
    indexed: bool = Field(True, description="false when the project has no index yet, so the prompt holds no search hits")
    prompt_tokens: int = 0

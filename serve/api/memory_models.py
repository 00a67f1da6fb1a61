"""Wire formats of conversation memory: what `ctx sessions/session/context/knowledge --json` print and the MCP memory tools return."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

ContextType = Literal["message", "session", "decision", "error", "insight"]
Depth = Literal["summary", "detail", "raw"]
ContextMode = Literal["hybrid", "keyword", "semantic"]


class SessionSummary(BaseModel):
    """One agent session (a segment of it, when it paused for longer than the gap setting)."""

    session_ref: str = Field(description="pass to session_detail / `ctx session show`; tool:session_id[#segment]")
    tool: str = Field(description="the agent tool that wrote it: claude, codex, gemini, cursor, copilot, opencode, antigravity")
    title: str
    project_path: str = Field(description="the folder the agent worked in ('' when the log does not say)")
    started_at: datetime
    last_active: datetime = Field(description="time of the session's last message")
    time_estimated: bool = Field(False, description=(
        "true when the log has no message times and the file's modification time stands in (Cursor transcripts, "
        "Antigravity artifacts); such a session is listed after the timestamped sessions of the same day"))
    n_messages: int
    summary: str = Field(description="what the session was about and where it stopped (LLM summary when configured)")
    decisions: list[str] = Field(default_factory=list, description="lines where a decision was stated")
    open_tasks: list[str] = Field(default_factory=list, description="TODO-like lines not checked off")
    errors: list[str] = Field(default_factory=list, description="tool failures and API errors seen")
    files: list[str] = Field(default_factory=list, description="files touched, most often first")
    commits: list[str] = Field(default_factory=list, description="the project's git commits in the session's time window")
    tokens_in: int = 0
    tokens_out: int = 0


class ToolCallOut(BaseModel):
    name: str
    input: str = ""
    is_error: bool | None = None


class MessageOut(BaseModel):
    id: str
    timestamp: datetime
    role: str = Field(description="user | assistant | tool | system")
    kind: str = Field(description="text | tool_call | tool_result | compaction | error | summary | notice | artifact")
    text: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    agent: str | None = Field(None, description="subagent id for sidechain messages")


class SessionDetail(BaseModel):
    session: SessionSummary
    messages: list[MessageOut]
    total: int = Field(description="messages in the session")
    offset: int
    next_offset: int | None = Field(None, description="pass as offset for the next page; null at the end")
    warnings: list[str] = Field(default_factory=list, description="e.g. long texts shortened to keep the answer small")


class ContextHit(BaseModel):
    """One search result: a message, a session summary or a knowledge record."""

    type: ContextType
    ref: str = Field(description="message id, session ref or knowledge id")
    session_ref: str | None = Field(None, description="the session it belongs to (messages and sessions)")
    tool: str | None = None
    timestamp: datetime
    role: str | None = None
    title: str = ""
    text: str = Field(description="summary, detail or raw text, per the requested depth")
    score: float = Field(description="fused rank score; higher is better; comparable within one result list")


class ContextResult(BaseModel):
    query: str
    mode: ContextMode
    depth: Depth
    hits: list[ContextHit]
    warnings: list[str] = Field(default_factory=list)
    took_ms: float = 0.0


class KnowledgeOut(BaseModel):
    id: str
    type: str = Field(description="decision | error | insight")
    title: str
    body: str
    created_at: datetime
    supersedes: str | None = Field(None, description="the older record this one replaces")
    superseded_by: str | None = None
    source_tool: str | None = None
    source_session: str | None = None
    files: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    path: str = Field(description="the markdown file, relative to the project root")


class KnowledgeList(BaseModel):
    records: list[KnowledgeOut]
    inbox: int = Field(0, description="candidates waiting for review in .ctx/knowledge/inbox/")
    warnings: list[str] = Field(default_factory=list, description="e.g. long texts shortened to keep the answer small")


class RememberResult(BaseModel):
    status: Literal["created", "superseded", "duplicate"] = Field(
        description="created: new record; superseded: new record replacing a similar one; duplicate: nothing written")
    id: str = Field(description="the new record's id, or the existing duplicate's")
    path: str | None = Field(None, description="the file written, relative to the project root")
    similar_to: str | None = None
    similarity: float = 0.0


# -- the hand-off brief (serve/api/handoff.py builds it) -----------------------------------------

DEFAULT_BUDGET = 1500  # tokens
TOKEN_ESTIMATE = "chars/4"  # how serve/api/handoff.py counts them


class Brief(BaseModel):
    """What `ctx handoff` prints; `text` is the rendered brief, the rest is the same facts as data."""

    session_ref: str
    tool: str
    title: str
    started_at: str
    ended_at: str
    time_estimated: bool = False  # the log has no message times; the file's modification time stands in
    goal: str
    files: list[str] = Field(default_factory=list)
    diff_stat: str = ""
    commits: list[str] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    last_user: str = ""
    last_assistant: str = ""
    failing_command: str = ""
    open_tasks: list[str] = Field(default_factory=list)
    next_step: str = ""
    text: str = ""
    tokens: int = 0
    token_estimate: str = TOKEN_ESTIMATE
    budget: int = DEFAULT_BUDGET
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

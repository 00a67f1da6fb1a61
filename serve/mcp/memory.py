"""MCP memory tools (search_context, recent_sessions, session_detail, project_knowledge; save_* with --allow-writes) over serve/api/context.py."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Literal

from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from ctxlake.schemas.config import Settings
from ctxlake.serve.api.memory_models import (
    ContextMode,
    ContextResult,
    Depth,
    KnowledgeList,
    RememberResult,
    SessionDetail,
    SessionSummary,
)
from ctxlake.serve.mcp.base import READ_ONLY, tool_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from ctxlake.serve.api.context import MemoryLake

TypeFilter = Literal["message", "session", "decision", "error", "insight", "knowledge"]
WRITES_FILES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


class TimeRange(BaseModel):
    """A time window; each bound an ISO date/time (2025-12-01, 2025-12-01T14:00) or an age (7d, 12h, 30m)."""

    after: str | None = Field(None, description="only results at or after this time")
    before: str | None = Field(None, description="only results at or before this time")


def _queries() -> ModuleType:
    """The memory read layer, imported on the first call: it pulls in pyarrow and numpy, which the
    server's start-up (answering `initialize`) must not wait for."""
    from ctxlake.serve.api import context

    return context


def register_memory_tools(server: MCPServer, settings: Settings, *, allow_writes: bool = False) -> None:
    """Add the conversation-memory tools to `server`; the save_* tools only when writes are allowed
    (they write .ctx/knowledge/ files, never tables: `ctx run ingest` picks them up)."""
    opened: list[MemoryLake] = []

    def lake() -> MemoryLake:
        # Opened once; reopened while the memory lake or the knowledge table does not exist yet,
        # so a server started before the first `ctx run ingest` sees its result.
        if not opened or opened[0].messages is None or opened[0].knowledge is None:
            opened[:] = [_queries().MemoryLake(settings)]
        return opened[0]

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def search_context(
        query: str, mode: ContextMode = "hybrid", depth: Depth = "summary", source_filter: list[str] | None = None,
        type_filter: list[TypeFilter] | None = None, time_range: TimeRange | None = None, limit: int = 10,
    ) -> ContextResult:
        """Search this project's past agent conversations (any tool: Claude Code, Codex, Gemini CLI, Cursor,
        Copilot, OpenCode, Antigravity), their session summaries, and its recorded decisions, error
        solutions and insights. depth: summary (short), detail (full message or summary), raw (everything,
        with tool calls). source_filter: agent tool names. type_filter: message, session, decision, error,
        insight, knowledge."""
        window = time_range or TimeRange()
        return _queries().search_context(
            lake(), query, mode=mode, depth=depth, types=type_filter, tools=source_filter,
            after=_queries().parse_when(window.after, "time_range.after"),
            before=_queries().parse_when(window.before, "time_range.before"), limit=limit)

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def recent_sessions(limit: int = 3, tool_filter: list[str] | None = None) -> list[SessionSummary]:
        """The most recently active agent sessions in this project, with what each was about, when it was
        last active, key decisions, open tasks and errors: start here to continue where another agent
        (or another tool) stopped. Pass a session_ref to session_detail for the messages."""
        return _queries().list_sessions(lake(), limit=limit, tools=tool_filter)

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def session_detail(session_ref: str, offset: int = 0, limit: int = 50) -> SessionDetail:
        """One session's summary and its messages in order, a page at a time (next_offset for more).
        session_ref comes from recent_sessions or search_context; a unique prefix works too."""
        return _queries().session_detail(lake(), session_ref, offset=offset, limit=limit)

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def project_knowledge(type: Literal["decision", "error", "insight"] | None = None, query: str | None = None,
                          limit: int = 20) -> KnowledgeList:
        """This project's recorded decisions, error solutions and insights (current ones; superseded
        records are left out), newest first, or the best matches for `query`."""
        return _queries().project_knowledge(lake(), type, query, limit=limit)

    if not allow_writes:
        return

    def save(kind: str, title: str, body: str, files: list[str] | None, tags: list[str] | None,
             source_tool: str | None, source_session: str | None) -> RememberResult:
        return _queries().remember(settings, kind, title, body, files=files or [], tags=tags or [],
                                source_tool=source_tool, source_session=source_session)

    @server.tool(annotations=WRITES_FILES, structured_output=True)
    @tool_errors
    def save_decision(title: str, rationale: str = "", files: list[str] | None = None, tags: list[str] | None = None,
                      source_tool: str | None = None, source_session: str | None = None) -> RememberResult:
        """Record a decision (what was chosen and why) as a knowledge file in .ctx/knowledge/decisions/.
        A near-identical existing decision makes this a duplicate (nothing written); a similar one is
        superseded by it."""
        return save("decision", title, rationale, files, tags, source_tool, source_session)

    @server.tool(annotations=WRITES_FILES, structured_output=True)
    @tool_errors
    def save_error_solution(error: str, solution: str, files: list[str] | None = None, tags: list[str] | None = None,
                            source_tool: str | None = None, source_session: str | None = None) -> RememberResult:
        """Record an error and how it was fixed, in .ctx/knowledge/errors/ (duplicates are rejected)."""
        return save("error", error, solution, files, tags, source_tool, source_session)

    @server.tool(annotations=WRITES_FILES, structured_output=True)
    @tool_errors
    def save_insight(title: str, details: str = "", files: list[str] | None = None, tags: list[str] | None = None,
                     source_tool: str | None = None, source_session: str | None = None) -> RememberResult:
        """Record an insight about this codebase in .ctx/knowledge/insights/ (duplicates are rejected)."""
        return save("insight", title, details, files, tags, source_tool, source_session)

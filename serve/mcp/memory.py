"""MCP memory tools (search_context, recent_sessions, session_detail, project_knowledge; save_* with --allow-writes) over serve/api/memory_sessions.py and context_search.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic_core
from mcp.types import CallToolResult, TextContent, ToolAnnotations
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
from ctxlake.serve.mcp.base import READ_ONLY, HeldMemory, response_size, tool_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from ctxlake.serve.api.memory_lake import MemoryLake

TypeFilter = Literal["message", "session", "decision", "error", "insight", "knowledge"]
WRITES_FILES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
# While an answer is over [mcp] max_response_chars, its long texts are cut to these many characters (and its
# lists of lines to these many entries) in turn; then items are dropped from the end, the first always kept.
CUTS = ((4000, 50), (1000, 20), (240, 5))
Texts = Callable[[], Iterable[tuple[Any, str]]]
NOTES_ROOM = 1_000  # kept free for the warnings that say what was shortened


class TimeRange(BaseModel):
    """A time window; each bound an ISO date/time (2025-12-01, 2025-12-01T14:00) or an age (7d, 12h, 30m)."""

    after: str | None = Field(None, description="only results at or after this time")
    before: str | None = Field(None, description="only results at or before this time")


# The memory read layer (serve/api/memory_lake.py, memory_sessions.py, context_search.py) is
# imported by each tool on its first call: it pulls in pyarrow and numpy, which the server's
# start-up (answering `initialize`) must not wait for.


def _cut(value: Any, chars: int, entries: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars].rstrip() + " …"
    if isinstance(value, list):
        return [_cut(v, chars, entries) for v in value[:entries]]
    return value


def fit(answer: Any, budget: int, texts: Texts, items: list[Any]) -> tuple[bool, int]:
    """Shorten `answer` in place until it is within `budget` characters on the wire: first the
    (object, field) pairs `texts` yields, then the last of `items`. Returns (shortened, dropped)."""
    shortened = False
    for chars, entries in CUTS:
        if response_size(answer) <= budget:
            break
        for obj, name in texts():
            value = getattr(obj, name)
            cut = _cut(value, chars, entries)
            if cut != value:
                setattr(obj, name, cut)
                shortened = True
    dropped = 0
    while len(items) > 1 and response_size(answer) > budget:
        items.pop()
        dropped += 1
    return shortened, dropped


def _session_texts(session: SessionSummary) -> Iterable[tuple[Any, str]]:
    for name in ("title", "summary", "decisions", "open_tasks", "errors", "files", "commits"):
        yield session, name


def _fitted(budget: int, answer: Any, texts: Texts, items: list[Any], what: str, more: str) -> list[str]:
    """`fit`, and the warnings that say what it did; `more`: where the rest is."""
    shortened, dropped = fit(answer, budget - NOTES_ROOM, texts, items)
    notes = [f"long texts shortened (…) to keep the answer under {budget:,} characters"] if shortened else []
    if dropped:
        notes.append(f"{dropped} {what} left out to keep the answer under {budget:,} characters: {more}")
    return notes


def register_memory_tools(server: MCPServer, settings: Settings, memory: Callable[[], MemoryLake] | None = None, *,
                          allow_writes: bool = False) -> None:
    """Add the conversation-memory tools to `server`, reading through `memory` (the server's shared
    reader, ServerState.memory; a HeldMemory of their own when not given); the save_* tools only
    when writes are allowed (they write .ctx/knowledge/ files, never tables: `ctx run ingest`
    picks them up)."""
    budget = settings.mcp.max_response_chars
    lake = memory or HeldMemory(settings)

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
        from ctxlake.serve.api import context_search, memory_lake

        window = time_range or TimeRange()
        result: ContextResult = context_search.search_context(
            lake(), query, mode=mode, depth=depth, types=type_filter, tools=source_filter,
            after=memory_lake.parse_when(window.after, "time_range.after"),
            before=memory_lake.parse_when(window.before, "time_range.before"), limit=limit)
        result.warnings += _fitted(budget, result, lambda: ((h, n) for h in result.hits for n in ("title", "text")),
                                   result.hits, "hit(s)", "ask for fewer, or a shallower depth")
        return result

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def recent_sessions(limit: int = 3, tool_filter: list[str] | None = None
                        ) -> Annotated[CallToolResult, list[SessionSummary]]:
        """The most recently active agent sessions in this project, with what each was about, when it was
        last active, key decisions, open tasks and errors: start here to continue where another agent
        (or another tool) stopped. Pass a session_ref to session_detail for the messages."""
        from ctxlake.serve.api import memory_sessions

        sessions: list[SessionSummary] = memory_sessions.list_sessions(lake(), limit=limit, tools=tool_filter)
        fit(sessions, budget, lambda: (p for s in sessions for p in _session_texts(s)), sessions)
        # Built here: the SDK would mirror a list as one text block per item, and an empty list as none at all.
        data = [s.model_dump(mode="json") for s in sessions]
        text = pydantic_core.to_json(data, indent=2).decode()
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content={"result": data})

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def session_detail(session_ref: str, offset: int = 0, limit: int = 50) -> SessionDetail:
        """One session's summary and its messages in order, a page at a time (next_offset for more).
        session_ref comes from recent_sessions or search_context; a unique prefix works too."""
        from ctxlake.serve.api import memory_sessions

        detail: SessionDetail = memory_sessions.session_detail(lake(), session_ref, offset=offset, limit=limit)

        def texts() -> Iterable[tuple[Any, str]]:
            yield from _session_texts(detail.session)
            for m in detail.messages:
                yield m, "text"
                yield m, "files"
                yield from ((c, "input") for c in m.tool_calls)

        detail.warnings += _fitted(budget, detail, texts, detail.messages, "message(s) of this page",
                                   "they follow from next_offset")
        if detail.messages:  # the page ends where the messages that fit end
            end = detail.offset + len(detail.messages)
            detail.next_offset = end if end < detail.total else None
        return detail

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def project_knowledge(type: Literal["decision", "error", "insight"] | None = None, query: str | None = None,
                          limit: int = 20) -> KnowledgeList:
        """This project's recorded decisions, error solutions and insights (current ones; superseded
        records are left out), newest first, or the best matches for `query`."""
        from ctxlake.serve.api import context_search

        found: KnowledgeList = context_search.project_knowledge(lake(), type, query, limit=limit)
        found.warnings += _fitted(
            budget, found, lambda: ((r, n) for r in found.records for n in ("title", "body", "files", "tags")),
            found.records, "record(s)", "ask for fewer, or narrow by type or query")
        return found

    if not allow_writes:
        return

    def save(kind: str, title: str, body: str, files: list[str] | None, tags: list[str] | None,
             source_tool: str | None, source_session: str | None) -> RememberResult:
        from ctxlake.serve.api import context_search

        return context_search.remember(settings, kind, title, body, files=files or [], tags=tags or [],
                                       source_tool=source_tool, source_session=source_session)

    @server.tool(annotations=WRITES_FILES, structured_output=True)
    @tool_errors
    def save_decision(title: str, rationale: str = "", files: list[str] | None = None, tags: list[str] | None = None,
                      source_tool: str | None = None, source_session: str | None = None) -> RememberResult:
        """Record a decision (what was chosen and why) as a knowledge file in .ctx/knowledge/decisions/.
        A near-identical existing decision makes this a duplicate (nothing written); a similar one is
        superseded by it. Title up to 200 characters, rationale up to 20,000; up to 50 files and tags."""
        return save("decision", title, rationale, files, tags, source_tool, source_session)

    @server.tool(annotations=WRITES_FILES, structured_output=True)
    @tool_errors
    def save_error_solution(error: str, solution: str, files: list[str] | None = None, tags: list[str] | None = None,
                            source_tool: str | None = None, source_session: str | None = None) -> RememberResult:
        """Record an error and how it was fixed, in .ctx/knowledge/errors/ (duplicates are rejected).
        The error is the title: up to 200 characters (one line of it); the solution up to 20,000."""
        return save("error", error, solution, files, tags, source_tool, source_session)

    @server.tool(annotations=WRITES_FILES, structured_output=True)
    @tool_errors
    def save_insight(title: str, details: str = "", files: list[str] | None = None, tags: list[str] | None = None,
                     source_tool: str | None = None, source_session: str | None = None) -> RememberResult:
        """Record an insight about this codebase in .ctx/knowledge/insights/ (duplicates are rejected).
        Title up to 200 characters, details up to 20,000; up to 50 files and tags."""
        return save("insight", title, details, files, tags, source_tool, source_session)

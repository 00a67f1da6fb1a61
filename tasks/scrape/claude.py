"""Scraper for Claude Code: ~/.claude/projects/<cwd slug>/<session>.jsonl (+ <session>/subagents/agent-*.jsonl) -> Msg rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxlake.tasks.scrape.base import (
    FileState,
    JsonlScraper,
    Msg,
    ScrapeOutput,
    SessionMeta,
    at_byte,
    first_existing,
    json_lines,
)
from ctxlake.tasks.scrape.fields import (
    answer_call,
    files_in,
    integer,
    label,
    obj,
    parse_ts,
    remember_call,
    string,
    text_of,
    tool_call,
)

# Record types that carry no conversation content (hooks, snapshots, UI state, links).
IGNORED = frozenset({
    "attachment", "progress", "file-history-snapshot", "queue-operation", "permission-mode", "mode",
    "agent-name", "last-prompt", "frame-link", "pr-link", "started", "result", "relocated",
    "worktree-state", "bridge-session", "atis-latch", "tag",
})
# System subtypes worth keeping: failures the next agent should know about, and compactions.
ERROR_SUBTYPES = frozenset({"api_error", "error", "api_refusal", "model_refusal_fallback"})
KEPT_SYSTEM = ERROR_SUBTYPES | {"compact_boundary"}
TITLE_RANK = {"custom-title": 3, "ai-title": 2, "summary": 1}


class ClaudeScraper(JsonlScraper):
    name = "claude"
    tool = "claude"

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".claude" / "projects"]

    def store_dir(self, root: Path) -> Path:
        return first_existing(root, "projects")

    def scrape_file(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        # Subagent transcripts (<session>/subagents/agent-<id>.jsonl) belong to the parent session.
        agent = None
        parent_session = None
        if path.parent.name == "subagents":
            agent = path.stem.removeprefix("agent-")
            parent_session = path.parent.parent.name
        extra = pos.extra
        for offset, rec in json_lines(path, pos, out):
            kind = string(rec.get("type"))
            subtype = string(rec.get("subtype"))
            where = at_byte(path, offset)
            if kind in ("user", "assistant") or (kind == "system" and subtype in KEPT_SYSTEM):
                self._record(rec, path, offset, where, agent, parent_session, extra, out)
            elif kind in TITLE_RANK:
                title = rec.get("customTitle") or rec.get("aiTitle") or rec.get("summary")
                session = rec.get("sessionId") or parent_session or path.stem
                if isinstance(title, str) and title and isinstance(session, str):
                    out.session(SessionMeta(self.tool, session, title=title, title_rank=TITLE_RANK[kind]))
                out.ignored()
            elif kind == "system" or kind in IGNORED:
                out.ignored()
            else:
                out.unknown(label(rec.get("type")))

    def _record(self, rec: dict[str, Any], path: Path, offset: int, where: str, agent: str | None,
                parent_session: str | None, extra: dict[str, Any], out: ScrapeOutput) -> None:
        ts = parse_ts(rec.get("timestamp"))
        uuid = rec.get("uuid")
        if ts is None:
            out.malformed("bad timestamp", where)
            return
        if not isinstance(uuid, str) or not uuid:
            out.malformed("no uuid", where)
            return
        session = parent_session or rec.get("sessionId")
        if not isinstance(session, str) or not session:
            out.malformed("no sessionId", where)
            return
        cwd = string(rec.get("cwd"))
        # A resumed session copies earlier records verbatim: uuid plus timestamp names a record
        # across files, and stays unique where a log reuses short uuids.
        base: dict[str, Any] = dict(tool=self.tool, session_id=session, timestamp=ts, seq=offset, key=f"{uuid}@{rec['timestamp']}",
                    source_file=str(path), project_path=cwd, parent_id=rec.get("parentUuid"),
                    agent=agent or (rec.get("agentId") if rec.get("isSidechain") else None))
        if cwd:
            out.session(SessionMeta(self.tool, session, project_path=cwd))
        if rec["type"] == "system":
            if rec.get("subtype") == "compact_boundary":
                meta = obj(rec.get("compactMetadata"))
                pre = integer(meta.get("preTokens"))
                text = f"conversation compacted ({rec.get('trigger') or meta.get('trigger', '?')}"
                text += f", {pre} tokens before)" if pre else ")"
                out.emit(Msg(role="system", kind="compaction", text=text, **base))
            else:
                out.emit(Msg(role="system", kind="error", text=_system_error_text(rec), **base))
            return
        message = rec.get("message")
        if not isinstance(message, dict):
            out.malformed("no message", where)
            return
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):  # a number, a mapping: drifted, not empty
            out.malformed("content not text or a list", where)
            return
        if rec["type"] == "user":
            self._user(rec, content, base, extra, out)
        else:
            self._assistant(message, content, base, extra, out)

    def _user(self, rec: dict[str, Any], content: Any, base: dict[str, Any], extra: dict[str, Any],
              out: ScrapeOutput) -> None:
        blocks = content if isinstance(content, list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            calls, texts = [], []
            for block in results:
                is_error = bool(block.get("is_error")) if "is_error" in block else None
                use_id = block.get("tool_use_id")
                calls.append({"id": use_id, "name": answer_call(extra, use_id) or "unknown", "input": "",
                              "is_error": is_error})
                texts.append(text_of(block.get("content")) or text_of(block.get("text")))
            result = rec.get("toolUseResult")
            if isinstance(result, dict) and isinstance(result.get("is_error"), bool) and calls:
                calls[-1]["is_error"] = bool(calls[-1]["is_error"]) or result["is_error"]
            out.emit(Msg(role="tool", kind="tool_result", text="\n".join(t for t in texts if t),
                         tool_calls=calls, **base))
            return
        text = text_of(content)
        if rec.get("isCompactSummary"):
            out.emit(Msg(role="system", kind="summary", text=text, **base))
        elif rec.get("isMeta"):
            out.ignored()  # caveats and command echoes the CLI injects, not the user's words
        elif text:
            out.emit(Msg(role="user", kind="text", text=text, **base))
        else:
            out.ignored()  # an image-only prompt: nothing to search

    def _assistant(self, message: dict[str, Any], content: Any, base: dict[str, Any], extra: dict[str, Any],
                   out: ScrapeOutput) -> None:
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        calls: list[dict[str, Any]] = []
        files: list[str] = []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                name = str(block.get("name") or "unknown")
                calls.append(tool_call(name, block.get("input"), block.get("id")))
                files.extend(files_in(block.get("input")))
                remember_call(extra, block.get("id"), name)
        text = text_of([b for b in blocks if isinstance(b, dict) and b.get("type") == "text"])
        if not text and not calls:
            out.ignored()  # thinking-only or an empty fallback marker
            return
        msg = Msg(role="assistant", kind="tool_call" if calls and not text else "text", text=text,
                  tool_calls=calls, files=list(dict.fromkeys(files)), model=message.get("model"), **base)
        # Claude writes one record per content block of a response, each repeating the response's
        # usage: count it on the first record of a message id only.
        usage = message.get("usage")
        usage_id = message.get("id")
        if isinstance(usage, dict) and usage_id != extra.get("usage_id"):
            msg.tokens_in = (integer(usage.get("input_tokens")) or 0) + (integer(usage.get("cache_creation_input_tokens")) or 0)
            msg.tokens_out = integer(usage.get("output_tokens")) or 0
            msg.tokens_cached = integer(usage.get("cache_read_input_tokens")) or 0
            extra["usage_id"] = usage_id
        out.emit(msg)


def _system_error_text(rec: dict[str, Any]) -> str:
    error = rec.get("error")
    parts = [str(rec.get("subtype"))]
    if isinstance(error, dict):
        status = error.get("status")
        if status:
            parts.append(f"HTTP {status}")
        message = error.get("message") or error.get("formatted")
        if isinstance(message, str):
            parts.append(message)
        limits = error.get("rateLimits")
        if isinstance(limits, dict) and limits.get("retryAfterSeconds"):
            parts.append(f"retry after {limits['retryAfterSeconds']} s")
    elif isinstance(error, str):
        parts.append(error)
    for key in ("apiRefusalExplanation", "content"):
        if isinstance(rec.get(key), str) and rec[key]:
            parts.append(rec[key])
            break
    return ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]

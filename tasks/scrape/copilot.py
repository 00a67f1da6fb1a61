"""Scrapers for GitHub Copilot: the CLI's ~/.copilot/session-state/<id>/events.jsonl and VS Code's chatSessions/*.json -> Msg rows."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from ctxlake.tasks.scrape.base import (
    FileState,
    Fingerprint,
    JsonlScraper,
    Msg,
    ScrapeOutput,
    SessionMeta,
    at_byte,
    first_existing,
    guard,
    json_lines,
    loads,
    read_document,
    scrape_each,
    stat_fingerprint,
    walk_files,
)
from ctxlake.tasks.scrape.fields import (
    answer_call,
    files_in,
    items,
    label,
    maybe_json,
    obj,
    parse_ts,
    remember_call,
    string,
    text_of,
    tool_call,
)
from ctxlake.tasks.scrape.safe_read import ReadLimits, read_bounded

IGNORED = frozenset({
    "session.info", "session.model_change", "hook.start", "hook.end", "assistant.turn_start",
    "assistant.turn_end", "tool.execution_start", "tool.execution_partial_result", "system.message",
    "system.notification", "subagent.started", "subagent.completed", "subagent.failed",
    "session.auto_mode_resolved", "session.usage_checkpoint", "session.shutdown", "assistant.reasoning",
    "abort", "tool.user_requested", "session.workspace_file_changed", "assistant.usage",
})
USED = frozenset({"session.start", "session.resume", "user.message", "assistant.message",
                  "tool.execution_complete", "session.error", "session.truncation", "session.compaction_complete"})


class CopilotCliScraper(JsonlScraper):
    name = "copilot"
    tool = "copilot"

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".copilot" / "session-state"]

    def store_dir(self, root: Path) -> Path:
        return first_existing(root, "session-state")

    def scrape_file(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        extra = pos.extra
        # <id>/events.jsonl (current) or <id>.jsonl (older): the session.start event names it too.
        extra.setdefault("session", path.parent.name if path.name == "events.jsonl" else path.stem)
        for offset, rec in json_lines(path, pos, out):
            etype = string(rec.get("type"))
            data = rec.get("data")
            where = at_byte(path, offset)
            if etype in IGNORED:
                if etype == "session.model_change" and isinstance(data, dict) and isinstance(data.get("newModel"), str):
                    extra["model"] = data["newModel"]
                out.ignored()
                continue
            if etype not in USED:
                out.unknown(label(rec.get("type")))
                continue
            ts = parse_ts(rec.get("timestamp"))
            if ts is None:
                out.malformed("bad timestamp", where)
                continue
            if not isinstance(data, dict):
                out.malformed("no data", where)
                continue
            self._event(str(etype), data, rec, ts, path, offset, extra, out)

    def _event(self, etype: str, data: dict[str, Any], rec: dict[str, Any], ts: Any, path: Path, offset: int,
               extra: dict[str, Any], out: ScrapeOutput) -> None:
        if etype in ("session.start", "session.resume"):
            context = obj(data.get("context"))
            if etype == "session.start" and isinstance(data.get("sessionId"), str):
                extra["session"] = data["sessionId"]
            if isinstance(context.get("cwd"), str):
                extra["cwd"] = context["cwd"]
            if isinstance(data.get("selectedModel"), str):
                extra["model"] = data["selectedModel"]
            out.session(SessionMeta(self.tool, extra["session"], project_path=extra.get("cwd", "")))
            out.ignored()
            return
        event_id = rec.get("id")
        # Event ids are UUIDs in real logs; with the timestamp they stay unique even where a log
        # reuses short ids, and an identical replayed event still collides.
        key = f"{event_id}@{rec.get('timestamp')}" if isinstance(event_id, str) else f"{offset}@{rec.get('timestamp')}"
        base: dict[str, Any] = dict(tool=self.tool, session_id=extra["session"], timestamp=ts, seq=offset, key=key,
                    source_file=str(path), project_path=extra.get("cwd", ""), parent_id=rec.get("parentId"),
                    agent=data.get("parentToolCallId") or None)
        if etype == "user.message":
            files = [str(a["path"]) for a in items(data.get("attachments")) if isinstance(a, dict) and isinstance(a.get("path"), str)]
            out.emit(Msg(role="user", kind="text", text=text_of(data.get("content")), files=files, **base))
        elif etype == "assistant.message":
            calls, files = [], []
            for req in items(data.get("toolRequests")):
                if not isinstance(req, dict):
                    continue
                name = str(req.get("name") or "unknown")
                args = maybe_json(req.get("arguments"))
                calls.append(tool_call(name, args, req.get("toolCallId")))
                files += files_in(args)
                remember_call(extra, req.get("toolCallId"), name)
            text = text_of(data.get("content"))
            if not text and not calls:
                out.ignored()
                return
            msg = Msg(role="assistant", kind="tool_call" if calls and not text else "text", text=text,
                      tool_calls=calls, files=files, model=data.get("model") or extra.get("model"), **base)
            # Streamed messages arrive in chunks that repeat their message id: count tokens once.
            usage_id = data.get("messageId") or event_id
            if isinstance(data.get("outputTokens"), int) and usage_id != extra.get("usage_id"):
                msg.tokens_out = data["outputTokens"]
                extra["usage_id"] = usage_id
            out.emit(msg)
        elif etype == "tool.execution_complete":
            result = obj(data.get("result"))
            call_id = data.get("toolCallId")
            success = data.get("success")
            out.emit(Msg(role="tool", kind="tool_result", text=text_of(result.get("content")) or str(result.get("content") or ""),
                         tool_calls=[{"id": call_id, "name": answer_call(extra, call_id) or "unknown", "input": "",
                                      "is_error": (not success) if isinstance(success, bool) else None}], **base))
        elif etype == "session.error":
            status = data.get("statusCode")
            text = f"{data.get('errorType', 'error')}: {'HTTP ' + str(status) + ', ' if status else ''}{data.get('message', '')}"
            out.emit(Msg(role="system", kind="error", text=text, **base))
        else:  # truncation / compaction
            dropped = data.get("droppedTokens") or data.get("tokensRemovedDuringTruncation")
            out.emit(Msg(role="system", kind="compaction",
                         text="context truncated" + (f" ({dropped} tokens dropped)" if dropped else ""), **base))


def vscode_roots(user_home: Path) -> list[Path]:
    if sys.platform == "darwin":
        return [user_home / "Library" / "Application Support" / "Code" / "User" / "workspaceStorage"]
    if sys.platform == "win32":
        return [user_home / "AppData" / "Roaming" / "Code" / "User" / "workspaceStorage"]
    return [user_home / ".config" / "Code" / "User" / "workspaceStorage"]


class CopilotVscodeScraper:
    """VS Code's Copilot Chat rewrites one JSON document per chat, `workspaceStorage/<hash>/chatSessions/<id>.json`;
    the workspace's folder (its project) is in `workspaceStorage/<hash>/workspace.json`."""

    name: ClassVar[str] = "copilot-vscode"
    tool: ClassVar[str] = "copilot"
    mutable: ClassVar[bool] = True

    def default_roots(self, user_home: Path) -> list[Path]:
        return vscode_roots(user_home)

    def store_files(self, root: Path) -> list[Path]:
        return [p for p in walk_files(root, (".json",)) if p.parent.name == "chatSessions"]

    def fingerprint(self, path: Path) -> Fingerprint | None:
        return stat_fingerprint(path)

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None:
        scrape_each(files, state, out, self._read)

    def _read(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        data = read_document(path, pos, out.limits)
        if data is not None:
            self._chat(path, data, out)

    def _chat(self, path: Path, data: bytes, out: ScrapeOutput) -> None:
        try:
            doc = loads(data)
        except ValueError:
            out.counts.records += 1
            out.malformed("not JSON", str(path))
            return
        if not isinstance(doc, dict):
            out.counts.records += 1
            out.malformed("not a JSON object", str(path))
            return
        session = string(doc.get("sessionId")) or path.stem
        project = _workspace_folder(path.parent.parent / "workspace.json")
        title = doc.get("customTitle")
        out.session(SessionMeta(self.tool, session, project_path=project,
                                title=title if isinstance(title, str) else "", title_rank=3))
        if not isinstance(doc.get("requests", []), list):
            out.counts.records += 1
            out.malformed("requests not a list", str(path))
        for i, req in enumerate(items(doc.get("requests"))):
            out.counts.records += 1
            where = f"{path}: requests[{i}]"
            guard(out, where, self._request, req, i, where, session, project, path, out)

    def _request(self, req: Any, i: int, where: str, session: str, project: str, path: Path, out: ScrapeOutput) -> None:
        if not isinstance(req, dict):
            out.malformed("not a JSON object", where)
            return
        ts = parse_ts(req.get("timestamp"))
        rid = req.get("requestId")
        if ts is None:
            out.malformed("bad timestamp", where)
            return
        if not isinstance(rid, str):
            out.malformed("no requestId", where)
            return
        base: dict[str, Any] = dict(tool=self.tool, session_id=session, timestamp=ts, source_file=str(path), scope=session,
                    project_path=project)
        message = obj(req.get("message"))
        files = _variable_files(req.get("variableData"))
        out.emit(Msg(role="user", kind="text", text=str(message.get("text") or ""), seq=2 * i, key=f"{rid}:request",
                     files=files, **base))
        texts, calls = [], []
        for part in items(req.get("response")):
            if not isinstance(part, dict):
                continue
            if part.get("kind") in ("toolInvocationSerialized", "toolInvocation"):
                invocation = part.get("invocationMessage")
                invocation = invocation.get("value") if isinstance(invocation, dict) else invocation
                calls.append(tool_call(str(part.get("toolId") or "unknown"), invocation, part.get("toolCallId")))
            elif isinstance(part.get("value"), str):
                texts.append(part["value"])
        model = req.get("modelId") if isinstance(req.get("modelId"), str) else None
        text = "".join(texts).strip()
        if text or calls:
            out.emit(Msg(role="assistant", kind="tool_call" if calls and not text else "text", text=text,
                         seq=2 * i + 1, key=f"{rid}:response", tool_calls=calls, model=model, **base))
        result = obj(req.get("result"))
        error = result.get("errorDetails")
        if isinstance(error, dict) and error.get("message"):
            out.emit(Msg(role="system", kind="error", text=str(error["message"]), seq=2 * i + 1,
                         key=f"{rid}:error", **base))


def _workspace_folder(path: Path) -> str:
    try:
        doc = loads(read_bounded(path, ReadLimits()))
    except (OSError, ValueError):
        return ""
    folder = doc.get("folder") if isinstance(doc, dict) else None
    if isinstance(folder, str) and folder.startswith("file://"):
        return unquote(urlparse(folder).path)
    return ""


def _variable_files(data: Any) -> list[str]:
    found = []
    for var in items(obj(data).get("variables")):
        value = var.get("value") if isinstance(var, dict) else None
        uri = value.get("uri") if isinstance(value, dict) else None
        if isinstance(uri, dict) and isinstance(uri.get("fsPath") or uri.get("path"), str):
            found.append(str(uri.get("fsPath") or uri.get("path")))
    return found

"""Scraper for the OpenAI Codex CLI: ~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl -> Msg rows."""

from __future__ import annotations

import re
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
    maybe_json,
    parse_ts,
    record_hash,
    remember_call,
    string,
    text_of,
    tool_call,
)

IGNORED_TOP = frozenset({"world_state", "inter_agent_communication_metadata"})
IGNORED_ITEMS = frozenset({"reasoning", "ghost_snapshot"})
CALL_ITEMS = {  # payload type -> tool name when the payload has none
    "function_call": "", "custom_tool_call": "", "tool_call": "", "local_shell_call": "shell",
    "tool_search_call": "tool_search", "web_search_call": "web_search", "image_generation_call": "image_generation",
}
OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output",
                          "local_shell_call_output", "tool_result"})
# The CLI injects these as "user" messages; they are context, not the user's words.
INJECTED = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions", "<permissions")
# Event messages that duplicate a response item when the rollout has one (see _event_messages).
EVENT_MESSAGES = {"user_message": "user", "agent_message": "assistant"}
KEEP_SAID = 200  # hashes of recent response-item messages kept per file, to recognise their event copies
ROLLOUT_ID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


class CodexScraper(JsonlScraper):
    name = "codex"
    tool = "codex"
    last_assistant: Msg | None = None  # where the next token_count's growth is counted

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".codex" / "sessions"]

    def store_dir(self, root: Path) -> Path:
        return first_existing(root, "sessions")

    def store_files(self, root: Path) -> list[Path]:
        # history.jsonl (prompt history) has another format and repeats what the rollouts hold.
        return [p for p in super().store_files(root) if p.name != "history.jsonl"]

    def scrape_file(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        extra = pos.extra
        if "session" not in extra:
            match = ROLLOUT_ID.search(path.stem)
            extra["session"] = match.group(1) if match else path.stem
        self.last_assistant = None
        events: list[tuple[dict[str, Any], Any]] = []
        try:
            self._lines(path, pos, extra, events, out)
        finally:  # also when a record broke the parser: the events read so far are not lost
            self._event_messages(events, path, extra, out)

    def _lines(self, path: Path, pos: FileState, extra: dict[str, Any], events: list[tuple[dict[str, Any], Any]],
               out: ScrapeOutput) -> None:
        for offset, rec in json_lines(path, pos, out):
            kind = string(rec.get("type"))
            payload = rec.get("payload")
            where = at_byte(path, offset)
            if kind in IGNORED_TOP:
                out.ignored()
                continue
            if kind not in ("session_meta", "turn_context", "response_item", "event_msg", "compacted"):
                out.unknown(label(rec.get("type")))
                continue
            if not isinstance(payload, dict):
                out.malformed("no payload", where)
                continue
            ptype = string(payload.get("type"))
            if kind == "event_msg" and ptype in EVENT_MESSAGES:
                ts = parse_ts(rec.get("timestamp"))
                if ts is None:
                    out.malformed("bad timestamp", where)
                else:
                    events.append((payload, ts))
                continue
            if kind == "event_msg" and ptype not in ("token_count", "error"):
                out.ignored()
                continue
            if kind == "response_item" and ptype in IGNORED_ITEMS:
                out.ignored()
                continue
            if kind == "response_item" and ptype == "message" and payload.get("role") not in ("user", "assistant"):
                out.ignored()  # developer/system instructions
                continue
            if kind == "response_item" and ptype == "message":
                said = extra.setdefault("said", [])
                said.append(_said(str(payload.get("role")), text_of(payload.get("content"), ("text",))))
                del said[: max(len(said) - KEEP_SAID, 0)]
            ts = parse_ts(rec.get("timestamp"))
            if ts is None:
                out.malformed("bad timestamp", where)
                continue
            self._record(kind, payload, ts, path, offset, where, extra, out)

    def _event_messages(self, events: list[tuple[dict[str, Any], Any]], path: Path, extra: dict[str, Any],
                        out: ScrapeOutput) -> None:
        """user_message / agent_message events repeat the response items' messages in full rollouts,
        but review-mode and subagent rollouts carry their text only there: keep those not said otherwise."""
        said = set(extra.get("said", []))
        for payload, ts in events:
            role = EVENT_MESSAGES[string(payload.get("type"))]
            text = string(payload.get("message"))
            if not text or _said(role, text) in said or (role == "user" and text.lstrip().startswith(INJECTED)):
                out.ignored()
                continue
            out.emit(Msg(tool=self.tool, session_id=extra["session"], timestamp=ts, seq=0, role=role, kind="text",
                         text=text, key=record_hash("event_msg", ts.isoformat(), payload), source_file=str(path),
                         project_path=extra.get("cwd", ""), model=extra.get("model") if role == "assistant" else None))

    def _record(self, kind: str, payload: dict[str, Any], ts: Any, path: Path, offset: int, where: str,
                extra: dict[str, Any], out: ScrapeOutput) -> None:
        if kind == "session_meta":
            # A fork starts with its own meta, then replays its parent's items (meta included):
            # the first meta names the file's session.
            sid = payload.get("id") or payload.get("session_id")
            if not extra.get("meta_seen") and isinstance(sid, str) and sid:
                extra["session"], extra["meta_seen"] = sid, True
                if isinstance(payload.get("cwd"), str):
                    extra["cwd"] = payload["cwd"]
                out.session(SessionMeta(self.tool, sid, project_path=extra.get("cwd", "")))
            out.ignored()
            return
        if kind == "turn_context":
            if isinstance(payload.get("cwd"), str) and payload["cwd"]:
                extra["cwd"] = payload["cwd"]
            if isinstance(payload.get("model"), str):
                extra["model"] = payload["model"]
            out.ignored()
            return
        base: dict[str, Any] = dict(tool=self.tool, session_id=extra["session"], timestamp=ts, seq=offset,
                    source_file=str(path), project_path=extra.get("cwd", ""))
        ptype = string(payload.get("type"))
        if kind == "event_msg" and ptype == "token_count":
            self._tokens(payload, extra)
            out.ignored()
            return
        # Forks replay their parent's items with the original timestamps: equal items, equal keys.
        has_id = isinstance(payload.get("id"), str) and payload["id"]
        key = f"{payload['id']}@{ts.isoformat()}" if has_id else record_hash(kind, ts.isoformat(), payload)
        if kind == "event_msg":  # error
            out.emit(Msg(role="system", kind="error", text=str(payload.get("message") or "error"), key=key, **base))
        elif kind == "compacted":
            summary = string(payload.get("message"))
            out.emit(Msg(role="system", kind="compaction", text=summary or "conversation compacted", key=key, **base))
        elif ptype == "message":
            text = text_of(payload.get("content"), ("text",))
            if payload.get("role") == "user" and (not text or text.lstrip().startswith(INJECTED)):
                out.ignored()
                return
            role = str(payload["role"])
            msg = out.emit(Msg(role=role, kind="text", text=text, key=key, model=extra.get("model") if role == "assistant" else None, **base))
            if role == "assistant":
                self._assistant(msg, extra)
        elif ptype == "agent_message":
            msg = out.emit(Msg(role="assistant", kind="text", text=text_of(payload.get("content")), key=key,
                               agent=str(payload.get("author") or "") or None, **base))
            self._assistant(msg, extra)
        elif ptype in CALL_ITEMS:
            name, args = _call(payload, CALL_ITEMS[ptype])
            remember_call(extra, payload.get("call_id"), name)
            msg = out.emit(Msg(role="assistant", kind="tool_call", text="", key=key,
                               tool_calls=[tool_call(name, args, payload.get("call_id"))], files=files_in(args),
                               model=extra.get("model"), **base))
            self._assistant(msg, extra)
        elif ptype in OUTPUT_ITEMS:
            text, is_error = _output(payload)
            call_id = payload.get("call_id")
            remembered = answer_call(extra, call_id)
            name = str(payload.get("name") or remembered or "unknown")
            out.emit(Msg(role="tool", kind="tool_result", text=text, key=key,
                         tool_calls=[{"id": call_id, "name": name, "input": "", "is_error": is_error}], **base))
        else:
            out.unknown(f"response_item:{label(payload.get('type'))}")

    def _assistant(self, msg: Msg, extra: dict[str, Any]) -> None:
        self.last_assistant = msg
        pending = extra.pop("pending_tokens", None)
        if pending:
            msg.tokens_in, msg.tokens_out, msg.tokens_cached = pending

    def _tokens(self, payload: dict[str, Any], extra: dict[str, Any]) -> None:
        """Token totals are cumulative per session: count the growth since the last event once."""
        info = payload.get("info")
        total = info.get("total_token_usage") if isinstance(info, dict) else None
        if not isinstance(total, dict):
            return
        now = [integer(total.get(k)) or 0 for k in ("input_tokens", "output_tokens", "cached_input_tokens")]
        before = extra.get("total", [0, 0, 0])
        if sum(now[:2]) <= sum(before[:2]):
            return  # the same totals reported again
        delta = [max(n - b, 0) for n, b in zip(now, before, strict=True)]
        extra["total"] = now
        target = self.last_assistant
        if target is None:
            extra["pending_tokens"] = delta
            return
        target.tokens_in = (target.tokens_in or 0) + delta[0]
        target.tokens_out = (target.tokens_out or 0) + delta[1]
        target.tokens_cached = (target.tokens_cached or 0) + delta[2]


def _said(role: str, text: str) -> str:
    return record_hash(role, text.strip())[:16]


def _call(payload: dict[str, Any], default_name: str) -> tuple[str, Any]:
    function = payload.get("function")
    name = payload.get("name") or (function.get("name") if isinstance(function, dict) else None) or default_name
    for key in ("arguments", "input", "action"):
        if payload.get(key) is not None:
            return str(name or "unknown"), maybe_json(payload[key])
    return str(name or "unknown"), None


def _output(payload: dict[str, Any]) -> tuple[str, bool | None]:
    raw = payload.get("output", payload.get("result", payload.get("tools")))
    raw = maybe_json(raw)
    is_error: bool | None = None
    if isinstance(raw, dict):
        meta = raw.get("metadata")
        code = (meta.get("exit_code") if isinstance(meta, dict) else None)
        code = raw.get("exitCode", raw.get("exit_code", code))
        if isinstance(code, int):
            is_error = code != 0
        if raw.get("success") is False:
            is_error = True
        text = raw.get("output") or raw.get("text") or raw.get("stdout") or ""
        if raw.get("stderr"):
            text = f"{text}\n{raw['stderr']}" if text else raw["stderr"]
        if not text and payload.get("type") == "tool_search_output":
            text = ", ".join(str(t.get("name")) for t in payload.get("tools") or [] if isinstance(t, dict))
        return str(text), is_error
    if isinstance(raw, list):
        if payload.get("type") == "tool_search_output":
            return ", ".join(str(t.get("name")) for t in raw if isinstance(t, dict)), None
        return text_of(raw), None
    return ("" if raw is None else str(raw)), None

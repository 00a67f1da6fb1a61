"""Scraper for the Gemini CLI: ~/.gemini/tmp/<project hash>/chats/session-*.json(l) -> Msg rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ctxlake.tasks.scrape.base import (
    FileState,
    Fingerprint,
    Msg,
    ScrapeOutput,
    SessionMeta,
    at_byte,
    first_existing,
    guard,
    json_lines,
    loads,
    read_document,
    reset_if_replaced,
    scrape_each,
    stat_fingerprint,
    walk_files,
)
from ctxlake.tasks.scrape.fields import (
    dicts,
    exit_code_error,
    files_in,
    items,
    label,
    obj,
    parse_ts,
    string,
    text_of,
    tool_call,
)

NOTICES = {"info": "notice", "warning": "notice", "error": "error"}


class GeminiScraper:
    """Chats are one JSON document per session (older CLIs) or JSONL whose later lines update the
    session (`$set`) or re-append a message with the same id (newer CLIs). Message ids are only
    unique within a session and a message can change, so rows are keyed by session and upserted."""

    name: ClassVar[str] = "gemini"
    tool: ClassVar[str] = "gemini"
    mutable: ClassVar[bool] = True

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".gemini" / "tmp"]

    def store_files(self, root: Path) -> list[Path]:
        # logs.json beside the chats is the prompt history, not a chat: documents without a
        # sessionId are skipped when read.
        return walk_files(first_existing(root, "tmp"), (".json", ".jsonl"))

    def fingerprint(self, path: Path) -> Fingerprint | None:
        return stat_fingerprint(path)

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None:
        scrape_each(files, state, out, self._read)

    def _read(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        if path.suffix == ".jsonl":
            self._jsonl(path, pos, out)
        else:
            self._document(path, pos, out)

    def _document(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        data = read_document(path, pos, out.limits)
        if data is None:
            return
        try:
            doc = loads(data)
        except ValueError:
            out.counts.records += 1
            out.malformed("not JSON", str(path))
            return
        if not isinstance(doc, dict) or not (isinstance(doc.get("sessionId"), str) or "messages" in doc):
            return  # not a chat (logs.json is a list of prompts; settings)
        # A chat whose header drifted (no sessionId, or not text) keeps its messages under the
        # file's name rather than losing them.
        session = string(doc.get("sessionId")) or path.stem
        self._meta({**doc, "sessionId": session}, path, out)
        messages = doc.get("messages")
        if not isinstance(messages, list):
            out.counts.records += 1
            out.malformed("messages not a list", str(path))
            return
        for i, message in enumerate(messages):
            out.counts.records += 1
            where = f"{path}: messages[{i}]"
            if not isinstance(message, dict):
                out.malformed("not a JSON object", where)
                continue
            guard(out, where, self._message, message, session, string(doc.get("projectHash")), path, i, where, out)

    def _jsonl(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        reset_if_replaced(path, pos)
        extra = pos.extra
        for offset, rec in json_lines(path, pos, out):
            if "$set" in rec or "$unset" in rec:
                if isinstance(rec.get("$set"), dict) and extra.get("session"):
                    self._meta({**rec["$set"], "sessionId": extra["session"]}, path, out)
                out.ignored()
            elif "sessionId" in rec and "type" not in rec:
                extra["session"] = str(rec["sessionId"])
                extra["project_hash"] = string(rec.get("projectHash"))
                self._meta(rec, path, out)
                out.ignored()
            elif "type" in rec and "id" in rec:
                # A message before (or without) the session header is kept under the file's name.
                session = extra.get("session") or path.stem
                self._message(rec, session, extra.get("project_hash", ""), path, offset, at_byte(path, offset), out)
            else:
                out.unknown(",".join(sorted(rec)[:3]) or "{}")

    def _meta(self, doc: dict[str, Any], path: Path, out: ScrapeOutput) -> None:
        hint = f"sha256:{doc['projectHash']}" if isinstance(doc.get("projectHash"), str) else ""
        title = doc.get("summary") or doc.get("title")
        out.session(SessionMeta(self.tool, str(doc["sessionId"]), project_hint=hint,
                                title=title if isinstance(title, str) else "", title_rank=2))

    def _message(self, m: dict[str, Any], session: str, project_hash: str, path: Path, seq: int, where: str,
                 out: ScrapeOutput) -> None:
        mtype = m.get("type")
        if mtype not in ("user", "gemini", "model", *NOTICES):
            out.unknown(f"message:{label(mtype)}")
            return
        ts = parse_ts(m.get("timestamp"))
        mid = m.get("id")
        if ts is None:
            out.malformed("bad timestamp", where)
            return
        if not isinstance(mid, str) or not mid:
            out.malformed("no id", where)
            return
        base: dict[str, Any] = dict(tool=self.tool, session_id=session, seq=seq, source_file=str(path), scope=session,
                    project_hint=f"sha256:{project_hash}" if project_hash else "")
        content = m.get("content", m.get("parts"))
        text = text_of(content) or text_of(m.get("parts"))
        if mtype == "user":
            out.emit(Msg(role="user", kind="text", text=text, timestamp=ts, key=mid, **base))
            return
        if mtype in NOTICES:
            out.emit(Msg(role="system", kind=NOTICES[str(mtype)], text=text, timestamp=ts, key=mid, **base))
            return
        calls = dicts(m.get("toolCalls"))
        tokens = obj(m.get("tokens"))
        files = [f for c in calls for f in files_in(c.get("args"))]
        out.emit(Msg(
            role="assistant", kind="text" if text or not calls else "tool_call", text=text, timestamp=ts, key=mid,
            tool_calls=[tool_call(str(c.get("name") or "unknown"), c.get("args"), c.get("id")) for c in calls],
            files=list(dict.fromkeys(files)), model=m.get("model") if isinstance(m.get("model"), str) else None,
            tokens_in=_int(tokens.get("input")), tokens_out=_int(tokens.get("output")),
            tokens_cached=_int(tokens.get("cached")), **base,
        ))
        # Results live inside the call; each becomes a tool row so failures are visible like elsewhere.
        for call in calls:
            output = _result_text(call)
            is_error = call.get("status") in ("error", "cancelled") or bool(exit_code_error(output))
            out.emit(Msg(
                role="tool", kind="tool_result", text=output, key=f"{mid}:{call.get('id')}:result",
                timestamp=parse_ts(call.get("timestamp")) or ts,
                tool_calls=[{"id": call.get("id"), "name": str(call.get("name") or "unknown"), "input": "",
                             "is_error": is_error}], **base,
            ))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _result_text(call: dict[str, Any]) -> str:
    for item in items(call.get("result")):
        response = obj(obj(item).get("functionResponse")).get("response")
        if isinstance(response, dict):
            text = response.get("output") or response.get("error")
            if isinstance(text, str):
                return text
    display = call.get("resultDisplay")
    return display if isinstance(display, str) else ""

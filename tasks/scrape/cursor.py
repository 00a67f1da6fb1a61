"""Scrapers for Cursor: agent transcripts (~/.cursor/projects/<slug>/agent-transcripts) and the IDE's state.vscdb -> Msg rows."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ctxlake.tasks.scrape.base import (
    FileState,
    Fingerprint,
    JsonlScraper,
    Msg,
    ScrapeOutput,
    SessionMeta,
    at_byte,
    counts_of,
    first_existing,
    guard,
    json_lines,
    loads,
    mtime_ts,
    stat_fingerprint,
)
from ctxlake.tasks.scrape.fields import (
    dicts,
    files_in,
    integer,
    items,
    label,
    maybe_json,
    obj,
    parse_ts,
    string,
    text_of,
    tool_call,
)
from ctxlake.tasks.scrape.safe_read import is_regular

# A busy database is waited for this long per query; the IDE's writes are short.
BUSY_TIMEOUT_MS = 2000
ROLES = {1: "user", 2: "assistant"}


class CursorTranscriptScraper(JsonlScraper):
    """Transcripts carry neither timestamps nor record ids: a line is keyed by its byte offset
    (the file only grows) and stamped with the file's modification time when first read."""

    name = "cursor"
    tool = "cursor"

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".cursor" / "projects"]

    def store_dir(self, root: Path) -> Path:
        return first_existing(root, "projects")

    def scrape_file(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        session, agent = _session_of(path)
        slug = _project_slug(path)
        ts = mtime_ts(path)
        scope = f"{session}/{agent or ''}"
        for offset, rec in json_lines(path, pos, out):
            role = rec.get("role")
            message = rec.get("message")
            if role is None and rec.get("type") in ("turn_ended", "turn_started"):
                out.ignored()
                continue
            if role not in ("user", "assistant"):
                out.unknown(label(rec.get("type") if rec.get("type") is not None else role))
                continue
            if not isinstance(message, dict):
                out.malformed("no message", at_byte(path, offset))
                continue
            blocks = message.get("content")
            blocks = blocks if isinstance(blocks, list) else [{"type": "text", "text": text_of(blocks)}]
            base: dict[str, Any] = dict(tool=self.tool, session_id=session, timestamp=ts, seq=offset, key=str(offset),
                        scope=scope, source_file=str(path), project_hint=f"slug:{slug}" if slug else "", agent=agent)
            results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
            if role == "user" and results:
                out.emit(Msg(role="tool", kind="tool_result", text="\n".join(text_of(b.get("content")) for b in results),
                             tool_calls=[{"id": b.get("tool_use_id"), "name": "unknown", "input": "",
                                          "is_error": b.get("is_error") if isinstance(b.get("is_error"), bool) else None}
                                         for b in results], **base))
                continue
            uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            text = text_of([b for b in blocks if isinstance(b, dict) and b.get("type") == "text"])
            if not text and not uses:
                # Blocks of another type that still carry text (schema drift) are kept, not ignored.
                text = text_of(blocks)
            if not text and not uses:
                kinds = sorted({label(b.get("type")) for b in blocks if isinstance(b, dict)} - {"text", "thinking"})
                if kinds:
                    out.unknown(f"content:{','.join(kinds)[:80]}")
                else:
                    out.ignored()  # an empty or thinking-only turn
                continue
            out.emit(Msg(role=str(role), kind="tool_call" if uses and not text else "text", text=text,
                         tool_calls=[tool_call(str(b.get("name") or "unknown"), b.get("input"), b.get("id")) for b in uses],
                         files=[f for b in uses for f in files_in(b.get("input"))], **base))
        if slug:
            out.session(SessionMeta(self.tool, session, project_hint=f"slug:{slug}"))


def _session_of(path: Path) -> tuple[str, str | None]:
    """<id>/<id>.jsonl is a session; <id>/subagents/<child>.jsonl belongs to it as a subagent."""
    if path.parent.name == "subagents":
        folder = path.parent.parent
        beside = sorted(folder.glob("*.jsonl"))
        return (beside[0].stem if len(beside) == 1 else folder.name), path.stem
    return path.stem, None


def _project_slug(path: Path) -> str:
    parts = path.parts
    if "agent-transcripts" in parts:
        i = parts.index("agent-transcripts")
        return parts[i - 1] if i > 0 else ""
    return ""


def ide_roots(user_home: Path) -> list[Path]:
    if sys.platform == "darwin":
        return [user_home / "Library" / "Application Support" / "Cursor" / "User" / "globalStorage"]
    if sys.platform == "win32":
        return [user_home / "AppData" / "Roaming" / "Cursor" / "User" / "globalStorage"]
    return [user_home / ".config" / "Cursor" / "User" / "globalStorage"]


class CursorIdeScraper:
    """Cursor's IDE keeps composer chats in SQLite (`cursorDiskKV`: `composerData:<id>` holds a
    chat's header and bubble order, `bubbleId:<id>:<bubble>` each message). The database is opened
    read-only by URI and queried in short statements, so the IDE can keep writing (WAL or not);
    a chat is re-read only when its `lastUpdatedAt` moved, and its rows are upserted."""

    name: ClassVar[str] = "cursor-ide"
    tool: ClassVar[str] = "cursor"
    mutable: ClassVar[bool] = True

    def default_roots(self, user_home: Path) -> list[Path]:
        return ide_roots(user_home)

    def store_files(self, root: Path) -> list[Path]:
        # Anything named state.vscdb is listed (a FIFO too), so that one which is not a regular
        # file is counted when read rather than passed over unseen.
        if root.exists() and not root.is_dir():
            return [root]
        return sorted(p for p in (root / "state.vscdb", first_existing(root, "globalStorage") / "state.vscdb")
                      if p.exists() and not p.is_dir())[:1]

    def fingerprint(self, path: Path) -> Fingerprint | None:
        # Committed pages may sit in the -wal file while the main file is untouched.
        main = stat_fingerprint(path)
        wal = stat_fingerprint(Path(str(path) + "-wal"))
        return None if main is None else main + (wal or (0, 0, 0))

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None:
        for path in files:
            pos = state.setdefault(str(path), FileState())
            # Only changed chats are re-read, but bad headers are met on every read: the counts
            # are this read's, not a running total.
            out.file_counts = counts_of(pos)
            out.file_counts.clear()
            if not is_regular(path):  # SQLite would open a FIFO and block, or read a device
                out.skipped(path, "not a regular file")
                out.file_counts = None
                continue
            try:
                self._database(path, pos, out)
            except sqlite3.Error as exc:
                out.cannot_read(path, exc)
                continue
            except Exception as exc:  # a record that broke the parser outside the per-chat guard
                out.parser_failed(exc, str(path))
            finally:
                out.file_counts = None
            out.counts.files += 1

    def _database(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        con = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "cursorDiskKV" not in tables:
                return
            seen: dict[str, Any] = pos.extra.setdefault("composers", {})
            headers = con.execute("SELECT key, value FROM cursorDiskKV WHERE key LIKE 'composerData:%'").fetchall()
            for key, value in headers:
                out.counts.records += 1
                if not isinstance(key, str):
                    out.malformed("key not text", f"{path}: composerData")
                    continue
                cid = key.split(":", 1)[1]
                try:
                    data = loads(value) if value is not None else None
                except ValueError:
                    out.malformed("not JSON", f"{path}: {key}")
                    continue
                if not isinstance(data, dict):
                    out.malformed("not a JSON object", f"{path}: {key}")
                    continue
                stamp = data.get("lastUpdatedAt") or data.get("createdAt")
                if seen.get(cid) == stamp and stamp is not None:
                    continue
                guard(out, f"{path}: {key}", self._composer, con, path, cid, data, out)
                seen[cid] = stamp if isinstance(stamp, str | int | float) else None
        finally:
            con.close()

    def _composer(self, con: sqlite3.Connection, path: Path, cid: str, data: dict[str, Any], out: ScrapeOutput) -> None:
        started = parse_ts(data.get("createdAt"))
        title = data.get("name")
        out.session(SessionMeta(self.tool, cid, title=title if isinstance(title, str) else "", title_rank=3))
        bubbles: dict[str, Any] = {}
        for key, value in con.execute("SELECT key, value FROM cursorDiskKV WHERE key LIKE ?", (f"bubbleId:{cid}:%",)):
            out.counts.records += 1
            try:
                bubbles[key.rsplit(":", 1)[1]] = loads(value)
            except (ValueError, TypeError):
                out.malformed("not JSON", f"{path}: {key}")
        order = [h.get("bubbleId") for h in dicts(data.get("fullConversationHeadersOnly"))]
        inline = dicts(data.get("conversation"))
        for b in inline:  # older versions keep bubbles inside the composer
            out.counts.records += 1
            bubbles.setdefault(str(b.get("bubbleId")), b)
            order.append(b.get("bubbleId"))
        order += sorted(set(bubbles) - set(order))
        fallback = started or parse_ts(data.get("lastUpdatedAt"))
        for seq, bid in enumerate(dict.fromkeys(o for o in order if isinstance(o, str))):
            bubble = bubbles.get(bid)
            if bubble is None:
                continue  # listed in the header, not written yet
            guard(out, f"{path}: bubbleId:{cid}:{bid}", self._bubble, path, cid, bid, seq, bubble, fallback, out)

    def _bubble(self, path: Path, cid: str, bid: str, seq: int, b: Any, fallback: Any, out: ScrapeOutput) -> None:
        where = f"{path}: bubbleId:{cid}:{bid}"
        if not isinstance(b, dict):
            out.malformed("not a JSON object", where)
            return
        btype = integer(b.get("type"))
        role = ROLES.get(btype) if btype is not None else None
        if role is None:
            out.unknown(f"bubble type {label(b.get('type')) if btype is None else btype}")
            return
        ts = parse_ts(b.get("createdAt")) or parse_ts(b.get("timingInfo", {}).get("clientStartTime") if isinstance(b.get("timingInfo"), dict) else None) or fallback
        if ts is None:
            out.malformed("bad timestamp", where)
            return
        text = string(b.get("text"))
        tool = b.get("toolFormerData") if isinstance(b.get("toolFormerData"), dict) else None
        calls, files = [], [f for f in items(b.get("relevantFiles")) if isinstance(f, str)]
        if tool:
            args = maybe_json(tool.get("rawArgs") or tool.get("params"))
            status = tool.get("status")
            calls.append(tool_call(str(tool.get("name") or "unknown"), args, tool.get("toolCallId"),
                                   status == "error" if isinstance(status, str) else None))
            files += files_in(args)
        if not text and not calls:
            out.ignored()
            return
        tokens = obj(b.get("tokenCount"))
        out.emit(Msg(tool=self.tool, session_id=cid, timestamp=ts, seq=seq, role=role,
                     kind="tool_call" if calls and not text else "text", text=text, key=f"{cid}:{bid}",
                     source_file=str(path), tool_calls=calls, files=list(dict.fromkeys(files)),
                     tokens_in=tokens.get("inputTokens") or None, tokens_out=tokens.get("outputTokens") or None))

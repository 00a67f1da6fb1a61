"""Tiny stores of all seven agent tools, one good user prompt each ("good <tool>"), for hardening tests.

Returns {scraper name: store root} in the layout each tool writes, so `--from NAME=ROOT` and
`SCRAPERS[name].store_files(root)` find them. Tests add their bad records or files beside these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memlogs import at, claude, codex_meta, codex_msg, ms, write_jsonl

TOOLS = ("claude", "codex", "gemini", "cursor", "copilot", "opencode", "antigravity")


def good_text(tool: str) -> str:
    return f"good {tool} prompt"


def log_file(name: str, root: Path) -> Path:
    """The JSONL file of a tool's store that a test appends bad lines to (Gemini's and OpenCode's are documents)."""
    return {
        "claude": root / "p" / "s.jsonl",
        "codex": root / "2026" / "03" / "02" / "rollout-2026-03-02T09-50-00-cx1.jsonl",
        "gemini": root / "h1" / "chats" / "session-2.jsonl",
        "cursor": root / "proj" / "agent-transcripts" / "c1" / "c1.jsonl",
        "copilot": root / "cp1" / "events.jsonl",
        "antigravity": root / "brain" / "ag1.jsonl",
    }[name]


def build_seven(base: Path) -> dict[str, Path]:
    roots = {tool: base / tool for tool in TOOLS}
    write_jsonl(log_file("claude", roots["claude"]), [claude("user", "u1", 0, good_text("claude"))])
    write_jsonl(log_file("codex", roots["codex"]), [codex_meta("cx1", 1), codex_msg("user", 1, good_text("codex"))])
    write_jsonl(log_file("gemini", roots["gemini"]), [
        {"sessionId": "gem-2", "projectHash": "abc", "startTime": at(2)},
        {"id": "g1", "timestamp": at(2), "type": "user", "content": [{"text": good_text("gemini")}]}])
    write_jsonl(log_file("cursor", roots["cursor"]), [
        {"role": "user", "message": {"content": [{"type": "text", "text": good_text("cursor")}]}}])
    write_jsonl(log_file("copilot", roots["copilot"]), [
        {"type": "session.start", "id": "e0", "timestamp": at(3),
         "data": {"sessionId": "cp1", "context": {"cwd": "/srv/u/proj"}}},
        {"type": "user.message", "id": "e1", "timestamp": at(3), "data": {"content": good_text("copilot")}}])
    storage = roots["opencode"]
    put_json(storage / "session" / "p" / "ses1.json", {"id": "ses1", "directory": "/srv/u/proj", "title": "t"})
    put_json(storage / "message" / "ses1" / "msg1.json",
             {"id": "msg1", "sessionID": "ses1", "role": "user", "time": {"created": ms(4)}})
    put_json(storage / "part" / "msg1" / "prt1.json", {"id": "prt1", "type": "text", "text": good_text("opencode")})
    write_jsonl(log_file("antigravity", roots["antigravity"]), [
        {"step_index": 0, "source": "USER_EXPLICIT", "type": "USER_INPUT", "status": "DONE", "created_at": at(5),
         "content": f"<USER_REQUEST>{good_text('antigravity')}</USER_REQUEST>"}])
    return roots


def put_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")
    return path

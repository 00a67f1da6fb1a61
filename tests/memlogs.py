"""Builders for the project's own small agent logs (our content, the tools' on-disk shapes), used by the memory tests."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def claude(role: str, uuid: str, minute: float, content: Any, session: str = "sess-a", cwd: str = "/srv/u/proj",
           **extra: Any) -> dict[str, Any]:
    """A Claude Code user/assistant record."""
    return {"parentUuid": None, "isSidechain": False, "type": role, "uuid": uuid, "timestamp": at(minute),
            "sessionId": session, "cwd": cwd, "version": "2.1.0", "gitBranch": "main",
            "message": {"role": role, "content": content, **extra.pop("message", {})}, **extra}


def tool_use(name: str, **inputs: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{name}_{abs(hash(json.dumps(inputs, sort_keys=True))) % 10**6}",
            "name": name, "input": inputs}


def tool_result(text: str, is_error: bool = False, use_id: str = "toolu_x") -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": use_id, "content": text, "is_error": is_error}]


def codex(kind: str, minute: float, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": at(minute), "type": kind, "payload": payload}


def codex_meta(session: str, minute: float, cwd: str = "/srv/u/proj") -> dict[str, Any]:
    return codex("session_meta", minute, {"id": session, "timestamp": at(minute), "cwd": cwd, "originator": "codex_cli_rs"})


def codex_msg(role: str, minute: float, text: str, mid: str | None = None) -> dict[str, Any]:
    kind = "input_text" if role == "user" else "output_text"
    payload: dict[str, Any] = {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
    if mid:
        payload["id"] = mid
    return codex("response_item", minute, payload)


def codex_tokens(minute: float, total_in: int, total_out: int) -> dict[str, Any]:
    usage = {"input_tokens": total_in, "cached_input_tokens": 0, "output_tokens": total_out, "total_tokens": total_in + total_out}
    return codex("event_msg", minute, {"type": "token_count", "info": {"total_token_usage": usage, "last_token_usage": usage}})


def write_jsonl(path: Path, records: list[Any], mode: str = "w") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode, encoding="utf-8") as fh:
        for rec in records:
            fh.write((rec if isinstance(rec, str) else json.dumps(rec)) + "\n")
    return path


def cursor_db(path: Path, composers: dict[str, dict[str, Any]], bubbles: dict[str, dict[str, dict[str, Any]]],
              wal: bool = True) -> sqlite3.Connection:
    """A Cursor state.vscdb in the documented shape: cursorDiskKV(key, value) with composerData:<id>
    and bubbleId:<id>:<bubble> JSON values. Returns the open writer connection."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    con.execute(f"PRAGMA journal_mode={'WAL' if wal else 'DELETE'}")
    con.execute("CREATE TABLE IF NOT EXISTS ItemTable (key TEXT UNIQUE ON CONFLICT REPLACE, value BLOB)")
    con.execute("CREATE TABLE IF NOT EXISTS cursorDiskKV (key TEXT UNIQUE ON CONFLICT REPLACE, value BLOB)")
    for cid, data in composers.items():
        put_composer(con, cid, data)
    for cid, items in bubbles.items():
        for bid, data in items.items():
            put_bubble(con, cid, bid, data)
    return con


def put_composer(con: sqlite3.Connection, cid: str, data: dict[str, Any]) -> None:
    con.execute("INSERT INTO cursorDiskKV VALUES (?, ?)", (f"composerData:{cid}", json.dumps({"composerId": cid, **data})))


def put_bubble(con: sqlite3.Connection, cid: str, bid: str, data: dict[str, Any]) -> None:
    con.execute("INSERT INTO cursorDiskKV VALUES (?, ?)", (f"bubbleId:{cid}:{bid}", json.dumps({"bubbleId": bid, "_v": 2, **data})))


def ms(minute: float) -> int:
    return int((T0 + timedelta(minutes=minute)).timestamp() * 1000)


# A planted secret (built from parts so the repository holds no scanner bait) and a harmless
# marker: the marker must be found in the lake's bytes, proving the byte scan can see text.
SECRET = "ghp_" + "Zq8Xw7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9Ff8Dd"
CANARY = "canary-7f3a9c-marker"


def build_stores(base: Path, project: Path, other: str = "/srv/u/other") -> dict[str, Path]:
    """Small stores of three tools for one project (and one session elsewhere): a planted secret,
    a 31-minute pause, a forked Codex rollout, a Gemini chat linked to the project by its path hash."""
    import hashlib

    cwd = str(project)
    claude_root = base / "claude" / "projects"
    write_jsonl(claude_root / slug(cwd) / "sess-a.jsonl", [
        claude("user", "u1", 0, f"Deploy fails: export GITHUB_TOKEN={SECRET} did not help", cwd=cwd),
        claude("assistant", "a1", 1, [{"type": "text", "text": f"Checking the deploy script. {CANARY}"},
                                      tool_use("Bash", command="./deploy.sh --dry-run")], cwd=cwd),
        claude("user", "u2", 2, tool_result("error: permission denied (publickey)", is_error=True), cwd=cwd),
        claude("assistant", "a2", 3, [tool_use("Bash", command="ssh-add ~/.ssh/deploy && ./deploy.sh --dry-run")], cwd=cwd),
        claude("user", "u3", 4, tool_result("dry run ok"), cwd=cwd),
        claude("assistant", "a3", 5, [{"type": "text", "text": "The deploy key was not loaded; ssh-add fixed it. "
                                                             "We decided to use a dedicated deploy key.\nTODO: rotate the old key"}], cwd=cwd),
        # 31 minutes later the same session continues: a new segment.
        claude("user", "u4", 36, "Now write the release notes", cwd=cwd),
        claude("assistant", "a4", 37, [{"type": "text", "text": "Release notes drafted in CHANGELOG.md."},
                                       tool_use("Edit", file_path=f"{cwd}/CHANGELOG.md")], cwd=cwd),
    ])
    write_jsonl(claude_root / slug(other) / "sess-z.jsonl", [
        claude("user", "z1", 10, "Unrelated project question", session="sess-z", cwd=other)])
    codex_root = base / "codex" / "sessions"
    day = codex_root / "2026" / "03" / "02"
    parent = [codex_meta("cx-parent", 50, cwd=cwd), codex_msg("user", 50, "Add a health check endpoint"),
              codex_msg("assistant", 51, "Added GET /healthz.", "msg-1"), codex_tokens(51.1, 900, 120)]
    write_jsonl(day / "rollout-2026-03-02T09-50-00-parent.jsonl", parent)
    write_jsonl(day / "rollout-2026-03-02T10-30-00-fork.jsonl", [
        codex_meta("cx-fork", 90, cwd=cwd), *parent, codex_msg("assistant", 91, "Also added /readyz on the fork.", "msg-2"),
        codex_tokens(91.1, 1300, 170)])
    gemini_root = base / "gemini" / "tmp"
    digest = hashlib.sha256(cwd.encode()).hexdigest()
    (gemini_root / digest / "chats").mkdir(parents=True)
    (gemini_root / digest / "chats" / "session-1.json").write_text(json.dumps({
        "sessionId": "gem-1", "projectHash": digest, "startTime": at(120), "messages": [
            {"id": "m1", "timestamp": at(120), "type": "user", "content": "Why is the health check slow?"},
            {"id": "m2", "timestamp": at(121), "type": "gemini", "content": "It opens a database connection per call.",
             "tokens": {"input": 50, "output": 12}}]}))
    return {"claude": claude_root, "codex": codex_root, "gemini": gemini_root}


def slug(path: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9]", "-", path)

"""Scrapers on the project's own logs: appended lines, partial lines, malformed records, rewritten files,
resumed and forked copies, token de-duplication, SQLite read while written, whole-document stores."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
from memlogs import (
    claude,
    codex,
    codex_meta,
    codex_msg,
    codex_tokens,
    cursor_db,
    ms,
    put_bubble,
    put_composer,
    tool_result,
    tool_use,
    write_jsonl,
)

from ctxlake.tasks.memory_store import messages_table, open_memory, store_messages
from ctxlake.tasks.scrape import ScrapeState, plan, scrape_group
from ctxlake.tasks.scrape.base import ScrapeOutput

DIMS = 8


def run(name: str, root: Path, state: ScrapeState) -> ScrapeOutput:
    """One incremental pass of a scraper over a root: only changed files are read."""
    out = ScrapeOutput()
    for item in plan({name: [root]}, state).items:
        part = scrape_group.fn(item, state)
        out.messages += part.messages
        out.counts.add(part.counts)
        out.meta.update(part.meta)
    return out


def texts(out: ScrapeOutput) -> list[str]:
    return [m.text for m in out.messages]


@pytest.fixture
def claude_root(tmp_path: Path) -> Path:
    return tmp_path / ".claude" / "projects"


def test_appended_lines_are_the_only_ones_read(claude_root: Path) -> None:
    log = write_jsonl(claude_root / "-home-u-proj" / "sess-a.jsonl", [
        claude("user", "u1", 0, "Add a retry to the HTTP client"),
        claude("assistant", "a1", 1, [{"type": "text", "text": "Adding exponential backoff."}]),
        claude("user", "u2", 2, "Also log each retry"),
    ])
    state = ScrapeState()
    assert texts(run("claude", claude_root, state)) == [
        "Add a retry to the HTTP client", "Adding exponential backoff.", "Also log each retry"]
    assert plan({"claude": [claude_root]}, state).changed_files == 0
    size = log.stat().st_size
    write_jsonl(log, [claude("assistant", "a2", 3, [{"type": "text", "text": "Logging at WARNING."}]),
                      claude("user", "u3", 4, "Thanks")], mode="a")
    work = plan({"claude": [claude_root]}, state)
    assert work.changed_files == 1 and work.items[0].new_bytes == log.stat().st_size - size
    assert texts(run("claude", claude_root, state)) == ["Logging at WARNING.", "Thanks"]
    assert state.files["claude"][str(log)].offset == log.stat().st_size


def test_a_partial_last_line_waits_for_its_end(claude_root: Path) -> None:
    log = write_jsonl(claude_root / "p" / "s.jsonl", [claude("user", "u1", 0, "first")])
    state = ScrapeState()
    run("claude", claude_root, state)
    line = json.dumps(claude("user", "u2", 1, "second"))
    with log.open("a") as fh:
        fh.write(line[:25])  # the tool is mid-write
    out = run("claude", claude_root, state)
    assert texts(out) == [] and out.counts.n_malformed == 0
    with log.open("a") as fh:
        fh.write(line[25:] + "\n")
    assert texts(run("claude", claude_root, state)) == ["second"]


def test_malformed_and_unknown_records_are_counted_and_skipped(claude_root: Path) -> None:
    bad_uuid = claude("user", "x", 1, "no id")
    del bad_uuid["uuid"]
    write_jsonl(claude_root / "p" / "s.jsonl", [
        "{not json", "[1, 2, 3]", {"type": "future-record", "sessionId": "sess-a"}, bad_uuid,
        claude("user", "u1", 2, "kept"), b"\xff\xfe broken bytes".decode("latin-1"),
    ])
    out = run("claude", claude_root, ScrapeState())
    assert texts(out) == ["kept"]
    assert out.counts.malformed == {"truncated JSON": 1, "not JSON": 1, "not a JSON object": 1, "no uuid": 1}
    assert out.counts.unknown == {"future-record": 1}
    assert out.counts.records == 6


def test_content_of_the_wrong_type_is_malformed_not_ignored(claude_root: Path) -> None:
    write_jsonl(claude_root / "p" / "s.jsonl", [
        claude("user", "u1", 1, 7), claude("assistant", "a1", 2, {"text": "a mapping"}),
        claude("user", "u2", 3, "kept"), claude("user", "u3", 4, []),  # an empty list: nothing to say, ignored
    ])
    out = run("claude", claude_root, ScrapeState())
    assert texts(out) == ["kept"]
    assert out.counts.malformed == {"content not text or a list": 2}


def test_a_rewritten_file_is_read_again_from_the_start(claude_root: Path) -> None:
    log = write_jsonl(claude_root / "p" / "s.jsonl", [claude("user", "u1", 0, "one"), claude("user", "u2", 1, "two")])
    state = ScrapeState()
    run("claude", claude_root, state)
    log.unlink()  # a tool that rewrites its log makes a new, shorter file
    write_jsonl(log, [claude("user", "u9", 5, "new start")])
    assert texts(run("claude", claude_root, state)) == ["new start"]


def test_claude_usage_is_counted_once_per_response_even_across_runs(claude_root: Path) -> None:
    usage = {"input_tokens": 100, "output_tokens": 40, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 3}
    log = write_jsonl(claude_root / "p" / "s.jsonl", [
        claude("assistant", "a1", 0, [{"type": "text", "text": "Reading the file."}], message={"id": "msg_1", "usage": usage}),
    ])
    state = ScrapeState()
    first = run("claude", claude_root, state)
    # The same response's next content block arrives in a later run, repeating its usage.
    write_jsonl(log, [claude("assistant", "a2", 0.1, [tool_use("Read", file_path="/srv/u/proj/app.py")],
                             message={"id": "msg_1", "usage": usage}),
                      claude("assistant", "a3", 1, [{"type": "text", "text": "Done."}], message={"id": "msg_2", "usage": usage})],
                mode="a")
    second = run("claude", claude_root, state)
    counted = [(m.tokens_in, m.tokens_out, m.tokens_cached) for m in first.messages + second.messages]
    assert counted == [(103, 40, 7), (None, None, None), (103, 40, 7)]
    assert second.messages[0].files == ["/srv/u/proj/app.py"]


def test_resumed_claude_session_copies_are_stored_once(tmp_path: Path, claude_root: Path) -> None:
    original = [claude("user", "u1", 0, "Plan the migration"),
                claude("assistant", "a1", 1, [{"type": "text", "text": "Three steps."}])]
    write_jsonl(claude_root / "p" / "sess-a.jsonl", original)
    # `claude --resume` starts a new session file that begins with verbatim copies of the old records.
    copies = [{**r, "sessionId": "sess-b"} for r in original]
    write_jsonl(claude_root / "p" / "sess-b.jsonl", [*copies, claude("user", "u2", 40, "Step one done", session="sess-b")])
    out = run("claude", claude_root, ScrapeState())
    assert len(out.messages) == 5
    tables = open_memory(tmp_path / "memory", DIMS)
    rows = messages_table(out.messages, DIMS)
    assert rows.num_rows == 3  # the copies share their originals' ids
    store_messages.fn(tables, rows, False, None)
    stored = tables.messages.search().select(["session_id", "text"]).to_arrow().to_pylist()
    assert sorted((r["session_id"], r["text"]) for r in stored) == [
        ("sess-a", "Plan the migration"), ("sess-a", "Three steps."), ("sess-b", "Step one done")]


def test_codex_fork_replays_parent_items_which_are_stored_once(tmp_path: Path) -> None:
    root = tmp_path / ".codex" / "sessions" / "2026" / "03" / "02"
    parent = [codex_meta("parent-1111", 0), codex_msg("user", 0, "Write the parser"),
              codex_msg("assistant", 1, "Parser written.", "msg-p1"), codex_tokens(1.1, 1000, 200),
              codex_msg("user", 2, "Add tests")]
    write_jsonl(root / "rollout-2026-03-02T09-00-00-parent.jsonl", parent)
    # A fork starts with its own meta, then replays the parent's items with their original
    # (earlier) timestamps, then continues with its own.
    write_jsonl(root / "rollout-2026-03-02T10-00-00-fork.jsonl", [
        codex_meta("fork-2222", 60), *parent,
        codex_msg("assistant", 61, "Tests added on the fork.", "msg-f1"), codex_tokens(61.1, 1500, 260)])
    out = run("codex", root.parent.parent.parent, ScrapeState())
    rows = messages_table(out.messages, DIMS).to_pylist()
    by_session: dict[str, list[str]] = {}
    for r in rows:
        by_session.setdefault(r["session_id"], []).append(r["text"])
    assert by_session == {"parent-1111": ["Write the parser", "Parser written.", "Add tests"],
                          "fork-2222": ["Tests added on the fork."]}
    tokens = {r["text"]: (r["tokens_in"], r["tokens_out"]) for r in rows if r["tokens_in"]}
    # The fork's totals are cumulative over the replayed history: only the growth is its own.
    assert tokens == {"Parser written.": (1000, 200), "Tests added on the fork.": (500, 60)}


def test_cursor_database_is_read_while_the_ide_writes(tmp_path: Path) -> None:
    db = tmp_path / "globalStorage" / "state.vscdb"
    writer = cursor_db(db, {"c1": {"name": "Fix login", "createdAt": ms(0), "lastUpdatedAt": ms(2),
                                   "fullConversationHeadersOnly": [{"bubbleId": "b1", "type": 1}, {"bubbleId": "b2", "type": 2}]}},
                       {"c1": {"b1": {"type": 1, "text": "Login fails with 401", "createdAt": ms(0)},
                               "b2": {"type": 2, "text": "", "createdAt": ms(1),
                                      "toolFormerData": {"name": "read_file", "rawArgs": '{"target_file": "src/auth.ts"}', "status": "completed"}}}})
    # The IDE holds a write transaction open while we read.
    writer.execute("BEGIN IMMEDIATE")
    put_bubble(writer, "c1", "b9", {"type": 2, "text": "uncommitted", "createdAt": ms(3)})
    state = ScrapeState()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    out = run("cursor-ide", db.parent, state)
    assert [(m.role, m.text or m.tool_calls[0]["name"]) for m in out.messages] == [("user", "Login fails with 401"), ("assistant", "read_file")]
    assert out.messages[1].files == ["src/auth.ts"]
    assert out.meta[("cursor", "c1")].title == "Fix login"
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # we never write the tool's file
    writer.execute("COMMIT")
    put_composer(writer, "c1", {"name": "Fix login", "createdAt": ms(0), "lastUpdatedAt": ms(5),
                                "fullConversationHeadersOnly": [{"bubbleId": b, "type": 1} for b in ("b1", "b2", "b9", "b10")]})
    put_bubble(writer, "c1", "b10", {"type": 1, "text": "Now it works", "createdAt": ms(5)})
    put_composer(writer, "c2", {"name": "Unchanged", "createdAt": ms(1), "lastUpdatedAt": ms(1)})
    writer.execute("INSERT INTO cursorDiskKV VALUES ('composerData:c3', 'not json')")
    out = run("cursor-ide", db.parent, state)
    # The changed chat is re-read whole (its rows are upserted); the broken one is counted.
    assert [m.text for m in out.messages if m.text] == ["Login fails with 401", "uncommitted", "Now it works"]
    assert out.counts.malformed == {"not JSON": 1}
    assert run("cursor-ide", db.parent, state).messages == []
    writer.close()


def test_cursor_database_in_rollback_mode_is_read_while_a_writer_holds_a_lock(tmp_path: Path) -> None:
    db = tmp_path / "state.vscdb"
    writer = cursor_db(db, {"c1": {"createdAt": ms(0), "lastUpdatedAt": ms(1)}},
                       {"c1": {"b1": {"type": 1, "text": "hello", "createdAt": ms(0)}}}, wal=False)
    writer.execute("BEGIN IMMEDIATE")  # a RESERVED lock: readers may still read
    put_bubble(writer, "c1", "b2", {"type": 2, "text": "pending", "createdAt": ms(1)})
    out = run("cursor-ide", db, ScrapeState())
    assert [m.text for m in out.messages] == ["hello"]
    writer.execute("COMMIT")
    writer.close()
    assert not Path(str(db) + "-journal").exists()


def test_vscode_chat_documents_are_reread_when_their_content_changes(tmp_path: Path) -> None:
    ws = tmp_path / "workspaceStorage" / "9f1c"
    (ws / "chatSessions").mkdir(parents=True)
    (ws / "workspace.json").write_text(json.dumps({"folder": "file:///srv/u/my%20proj"}))
    chat = {"version": 3, "sessionId": "chat-1", "customTitle": "Date parsing", "requests": [
        {"requestId": "r1", "timestamp": ms(0), "message": {"text": "Why does parse_date fail on 2024-02-30?"},
         "variableData": {"variables": [{"value": {"uri": {"fsPath": "/srv/u/my proj/dates.py"}}}]},
         "response": [{"value": "Because February has no 30th; validate first."}], "modelId": "copilot/gpt-4o"},
    ]}
    doc = ws / "chatSessions" / "chat-1.json"
    doc.write_text(json.dumps(chat))
    state = ScrapeState()
    out = run("copilot-vscode", tmp_path / "workspaceStorage", state)
    assert [(m.role, m.project_path) for m in out.messages] == [("user", "/srv/u/my proj"), ("assistant", "/srv/u/my proj")]
    assert out.messages[0].files == ["/srv/u/my proj/dates.py"]
    os.utime(doc, ns=(doc.stat().st_atime_ns, doc.stat().st_mtime_ns + 10**9))  # touched, same content
    assert run("copilot-vscode", tmp_path / "workspaceStorage", state).messages == []
    chat["requests"].append({"requestId": "r2", "timestamp": ms(3), "message": {"text": "Add a test"},
                             "response": [], "result": {"errorDetails": {"message": "Rate limit exceeded"}}})
    doc.write_text(json.dumps(chat))
    out = run("copilot-vscode", tmp_path / "workspaceStorage", state)
    assert [(m.role, m.kind, m.text) for m in out.messages][-2:] == [("user", "text", "Add a test"), ("system", "error", "Rate limit exceeded")]


def test_gemini_jsonl_update_lines_replace_the_message(tmp_path: Path) -> None:
    log = tmp_path / "tmp" / "abc" / "chats" / "session-1.jsonl"
    write_jsonl(log, [{"sessionId": "g1", "projectHash": "00", "startTime": "2026-03-02T09:00:00Z", "kind": "main"},
                      {"id": "m1", "timestamp": "2026-03-02T09:00:01Z", "type": "gemini", "content": "Working on it"}])
    state = ScrapeState()
    first = run("gemini", tmp_path, state)
    write_jsonl(log, [{"$set": {"lastUpdated": "2026-03-02T09:00:05Z"}},
                      {"id": "m1", "timestamp": "2026-03-02T09:00:01Z", "type": "gemini", "content": "Done: 3 files changed"}], mode="a")
    second = run("gemini", tmp_path, state)
    assert first.messages[0].id == second.messages[0].id
    tables = open_memory(tmp_path / "memory", DIMS)
    store_messages.fn(tables, messages_table(first.messages, DIMS), True, None)
    result = store_messages.fn(tables, messages_table(second.messages, DIMS), True, None)
    assert (result.inserted, result.updated) == (0, 1)
    assert tables.messages.search().select(["text"]).to_arrow().column("text").to_pylist() == ["Done: 3 files changed"]


def test_tool_results_carry_failures(claude_root: Path) -> None:
    write_jsonl(claude_root / "p" / "s.jsonl", [
        claude("assistant", "a1", 0, [tool_use("Bash", command="pytest -q")]),
        claude("user", "u1", 1, tool_result("1 failed: test_login", is_error=True)),
    ])
    out = run("claude", claude_root, ScrapeState())
    assert out.messages[0].tool_calls[0]["input"] == "pytest -q"
    assert out.messages[1].role == "tool" and out.messages[1].tool_calls[0]["is_error"] is True


def test_sqlite_file_that_is_not_a_cursor_database_is_skipped(tmp_path: Path) -> None:
    db = tmp_path / "state.vscdb"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE ItemTable (key TEXT, value BLOB)")
    con.commit()
    con.close()
    out = run("cursor-ide", db, ScrapeState())
    assert out.messages == [] and out.warnings == []


def test_codex_context_survives_a_new_process(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    log = write_jsonl(root / "rollout-2026-03-02T09-00-00-abc.jsonl", [
        codex_meta("sess-codex", 0, cwd="/srv/u/api"), codex_msg("user", 0, "Bump the API version"),
        codex_msg("assistant", 1, "Bumped to v2."), codex_tokens(1.1, 800, 90)])
    state = ScrapeState()
    run("codex", root, state)
    state.save(tmp_path / "memory")
    write_jsonl(log, [codex_msg("assistant", 5, "Changelog updated."), codex_tokens(5.1, 1200, 150),
                      codex_tokens(5.2, 1200, 150)], mode="a")
    later = run("codex", root, ScrapeState.load(tmp_path / "memory"))
    [msg] = later.messages
    assert (msg.session_id, msg.project_path, msg.tokens_in, msg.tokens_out) == ("sess-codex", "/srv/u/api", 400, 60)


def test_a_result_in_a_later_run_is_named_and_answered_calls_leave_the_saved_state(tmp_path: Path,
                                                                                   claude_root: Path) -> None:
    """The saved context holds only calls still waiting for their result: a long history's
    positions file (and the service that keeps it) no longer grows with every call ever made."""
    use = tool_use("Bash", command="pytest -q")
    log = write_jsonl(claude_root / "p" / "s.jsonl", [claude("assistant", "a1", 0, [use])])
    state = ScrapeState()
    run("claude", claude_root, state)
    assert state.files["claude"][str(log)].extra["calls"] == {use["id"]: "Bash"}
    state.save(tmp_path / "memory")
    write_jsonl(log, [claude("user", "u1", 1, tool_result("2 passed", use_id=use["id"]))], mode="a")
    later = ScrapeState.load(tmp_path / "memory")
    [result] = run("claude", claude_root, later).messages
    assert result.tool_calls[0]["name"] == "Bash"
    assert "calls" not in later.files["claude"][str(log)].extra

    root = tmp_path / "sessions"
    rollout = write_jsonl(root / "rollout-2026-03-02T09-00-00-abc.jsonl", [
        codex_meta("sess-codex", 0),
        codex("response_item", 1, {"type": "function_call", "name": "shell", "arguments": '{"command": ["ls"]}',
                                   "call_id": "call_1"}),
        codex("response_item", 2, {"type": "function_call_output", "call_id": "call_1", "output": "README.md"})])
    state = ScrapeState()
    out = run("codex", root, state)
    assert [m.tool_calls[0]["name"] for m in out.messages if m.role == "tool"] == ["shell"]
    assert "calls" not in state.files["codex"][str(rollout)].extra

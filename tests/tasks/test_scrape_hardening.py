"""Scrapers that cannot take ingestion down: crash forms, encodings, FIFOs, /dev/zero, oversize lines, schema drift.

Every scenario writes tiny stores of all seven tools (one good prompt each) beside its bad input and
asserts both that every tool's good record still comes out (and fits the MESSAGES table) and how
the bad input was counted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from memlogs import at, claude, ms, write_jsonl
from sevenlogs import TOOLS, build_seven, good_text, log_file, put_json

from ctxlake.tasks.memory_store import messages_table
from ctxlake.tasks.scrape import SCRAPERS, ScrapeState, malformed_totals, plan, scrape_group
from ctxlake.tasks.scrape.base import Counts, Msg
from ctxlake.tasks.scrape.safe_read import ReadLimits


def scrape_all(roots: dict[str, Path], state: ScrapeState | None = None,
               limits: ReadLimits | None = None) -> tuple[dict[str, list[Msg]], dict[str, Counts]]:
    """Every scraper over its root as ingest runs it; rows must convert to the MESSAGES table."""
    state = state or ScrapeState()
    msgs: dict[str, list[Msg]] = {}
    counts: dict[str, Counts] = {}
    for item in plan({name: [root] for name, root in roots.items()}, state).items:
        out = scrape_group.fn(item, state, limits)
        messages_table(out.messages, 8)
        msgs.setdefault(item.scraper, []).extend(out.messages)
        counts.setdefault(item.scraper, Counts()).add(out.counts)
    return msgs, counts


def assert_all_good(msgs: dict[str, list[Msg]]) -> None:
    for tool in TOOLS:
        assert good_text(tool) in [m.text for m in msgs.get(tool, [])], tool


def test_the_reported_record_no_longer_stops_ingestion(tmp_path: Path) -> None:
    roots = build_seven(tmp_path)
    write_jsonl(log_file("claude", roots["claude"]), ['{"type":["user"],"sessionId":"x","uuid":"y"}'], mode="a")
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    assert counts["claude"].unknown == {"<list>": 1}
    assert not any("parser error" in r for c in counts.values() for r in c.malformed)


# Records with a list where a string is expected, an int where a list is, an object where a
# type name is: the crash sites fuzzing found, one or more per scraper.
CRASH_FORMS: list[tuple[str, list[Any]]] = [
    ("claude", [{"type": "system", "subtype": ["api_error"], "uuid": "s1", "timestamp": at(1), "sessionId": "x"},
                claude("assistant", "a1", 1, [{"type": "tool_use", "id": ["t"], "name": "Bash", "input": {}}],
                       message={"usage": {"input_tokens": [1], "output_tokens": {"n": 2}}}),
                claude("user", "u9", 1, [{"type": "tool_result", "tool_use_id": {"a": 1}, "content": 5}])]),
    ("codex", [{"timestamp": at(1), "type": "response_item", "payload": {"type": ["message"], "role": "user"}},
               {"timestamp": at(1), "type": "event_msg",
                "payload": {"type": "token_count", "info": {"total_token_usage": {"input_tokens": [5]}}}},
               {"timestamp": at(1), "type": "response_item",
                "payload": {"type": "function_call", "call_id": ["c"], "name": 3, "arguments": 7}}]),
    ("gemini", [{"id": "g2", "timestamp": at(2), "type": "gemini", "content": "x", "toolCalls": 5},
                {"id": "g3", "timestamp": at(2), "type": "gemini", "content": "y",
                 "toolCalls": [{"name": "read", "result": [{"functionResponse": ["no"]}], "args": []}]},
                {"id": "g4", "timestamp": at(2), "type": {"t": 1}}]),
    ("cursor", [{"role": "user", "message": {"content": 7}}, {"role": ["user"], "message": {}},
                {"role": "assistant", "message": {"content": [{"type": "tool_use", "input": [1], "name": ["x"]}]}}]),
    ("copilot", [{"type": ["user.message"], "data": {}},
                 {"type": "assistant.message", "id": "e2", "timestamp": at(3), "data": {"toolRequests": 3, "content": "ok"}},
                 {"type": "user.message", "id": "e3", "timestamp": at(3), "data": {"attachments": 9, "content": "att"}}]),
    ("antigravity", [{"step_index": 1, "type": "PLANNER_RESPONSE", "created_at": at(5), "tool_calls": 5, "content": "plan"},
                     {"step_index": 2, "type": ["VIEW_FILE"], "created_at": at(5)}]),
]


@pytest.mark.parametrize(("tool", "records"), CRASH_FORMS, ids=[t for t, _ in CRASH_FORMS])
def test_crash_forms_are_parsed_or_counted(tmp_path: Path, tool: str, records: list[Any]) -> None:
    roots = build_seven(tmp_path)
    write_jsonl(log_file(tool, roots[tool]), records, mode="a")
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    c = counts[tool]
    emitted_by_bad = len(msgs[tool]) - 1 - (tool == "codex")  # codex's session_meta emits nothing
    assert c.records >= len(records)
    # every bad record came out as a row, or was counted ignored / unknown / malformed
    assert emitted_by_bad + c.ignored + c.n_unknown + c.n_malformed >= len(records)
    assert not any("parser error" in r for r in c.malformed), c.malformed


def test_opencode_crash_forms(tmp_path: Path) -> None:
    roots = build_seven(tmp_path)
    storage = roots["opencode"]
    put_json(storage / "part" / "msg1" / "prt2.json", {"id": "prt2", "type": {"a": 1}})
    put_json(storage / "part" / "msg1" / "prt3.json", {"id": "prt3", "type": "patch", "files": 4})
    put_json(storage / "message" / "ses1" / "msg2.json", {"id": "msg2", "sessionID": "ses1", "role": ["user"]})
    put_json(storage / "part" / "msg2" / "prt1.json", {"id": "p", "type": "text", "text": "orphan"})
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    assert counts["opencode"].unknown == {"part:<dict>": 1, "role:<list>": 1}
    assert counts["opencode"].malformed == {"part of an unreadable message": 1}


def test_an_unforeseen_parser_failure_costs_one_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: a parser bug on one line is counted and reading resumes at the next line."""
    roots = build_seven(tmp_path)
    write_jsonl(log_file("claude", roots["claude"]), [claude("user", "boom", 1, "explodes"),
                                                      claude("user", "u3", 2, "after the bad one")], mode="a")
    scraper = SCRAPERS["claude"]
    original = type(scraper)._record

    def flaky(self: Any, rec: dict[str, Any], *args: Any) -> None:
        if rec.get("uuid") == "boom":
            raise RuntimeError("injected")
        original(self, rec, *args)

    monkeypatch.setattr(type(scraper), "_record", flaky)
    state = ScrapeState()
    msgs, counts = scrape_all(roots, state)
    assert_all_good(msgs)
    assert "after the bad one" in [m.text for m in msgs["claude"]]
    assert counts["claude"].malformed == {"parser error (RuntimeError)": 1}
    assert malformed_totals(state) == {"claude": {"parser error (RuntimeError)": 1}}
    monkeypatch.undo()
    again, _ = scrape_all(roots, state)
    assert again == {}  # the position moved past the bad line: nothing is re-read


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "latin-1"])
def test_log_encodings_are_detected(tmp_path: Path, encoding: str) -> None:
    roots = build_seven(tmp_path)
    text = "café crème, naïve"  # Latin-1 encodable
    lines = [claude("user", "e1", 1, text), claude("user", "e2", 2, "second line")]
    path = roots["claude"] / "enc" / "e.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode(encoding))
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    assert {text, "second line"} <= {m.text for m in msgs["claude"]}
    assert counts["claude"].n_malformed == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "latin-1"])
def test_json_documents_in_other_encodings(tmp_path: Path, encoding: str) -> None:
    roots = build_seven(tmp_path)
    doc = {"sessionId": "gem-9", "messages": [{"id": "m1", "timestamp": at(9), "type": "user", "content": "déjà vu"}]}
    path = roots["gemini"] / "h9" / "chats" / "session-9.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(json.dumps(doc, ensure_ascii=False).encode(encoding))
    msgs, _ = scrape_all(roots)
    assert_all_good(msgs)
    assert "déjà vu" in [m.text for m in msgs["gemini"]]


@pytest.mark.timeout(30)
def test_fifo_and_dev_zero_in_log_folders_are_skipped(tmp_path: Path) -> None:
    roots = build_seven(tmp_path)
    os.mkfifo(roots["claude"] / "p" / "pipe.jsonl")  # opening it to read would block forever
    os.symlink("/dev/zero", roots["codex"] / "2026" / "zero.jsonl")  # reading it never ends
    os.symlink("/dev/zero", roots["gemini"] / "h1" / "chats" / "session-0.json")
    os.mkfifo(roots["opencode"] / "message" / "ses1" / "msg9.json")
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    for tool in ("claude", "codex", "gemini", "opencode"):
        assert counts[tool].malformed == {"file not a regular file": 1}, tool


@pytest.mark.timeout(30)
def test_cursor_database_that_is_a_fifo_is_skipped(tmp_path: Path) -> None:
    db = tmp_path / "globalStorage" / "state.vscdb"
    db.parent.mkdir()
    os.mkfifo(db)
    _, counts = scrape_all({"cursor-ide": db.parent})
    assert counts["cursor-ide"].malformed == {"file not a regular file": 1}


def test_oversize_line_and_file_are_counted(tmp_path: Path) -> None:
    roots = build_seven(tmp_path)
    write_jsonl(log_file("claude", roots["claude"]), [claude("user", "big", 1, "x" * 5000),
                                                      claude("user", "u5", 2, "after the big one")], mode="a")
    big_doc = roots["gemini"] / "h2" / "chats" / "session-big.json"
    put_json(big_doc, {"sessionId": "big", "messages": [{"id": "m", "timestamp": at(1), "type": "user", "content": "y" * 9000}]})
    msgs, counts = scrape_all(roots, limits=ReadLimits(max_file_bytes=8000, max_line_bytes=2000))
    assert_all_good(msgs)
    assert "after the big one" in [m.text for m in msgs["claude"]]
    assert counts["claude"].malformed == {"line over 2,000 bytes": 1}
    assert counts["gemini"].malformed == {"file over 8,000 bytes": 1}


def test_schema_drift_loses_nothing_silently(tmp_path: Path) -> None:
    roots = build_seven(tmp_path)
    # Gemini: a chat document without sessionId keeps its messages (under the file's name).
    put_json(roots["gemini"] / "h3" / "chats" / "session-nohdr.json",
             {"messages": [{"id": "m1", "timestamp": at(1), "type": "user", "content": "no header"}]})
    # OpenCode's older layout: metadata.time / metadata.sessionID and inline parts.
    put_json(roots["opencode"] / "message" / "ses1" / "msg_old.json", {
        "id": "msg_old", "role": "assistant", "metadata": {"time": {"created": ms(6)}, "sessionID": "ses1",
                                                        "assistant": {"modelID": "m-1", "tokens": {"input": 3}}},
        "parts": [{"type": "text", "text": "legacy assistant text"},
                  {"type": "tool-invocation", "toolInvocation": {"toolName": "read", "toolCallId": "c1",
                                                                 "args": {"filePath": "/a.py"}, "result": "body"}}]})
    # Cursor: a block type other than "text" that carries text.
    write_jsonl(log_file("cursor", roots["cursor"]), [
        {"role": "assistant", "message": {"content": [{"type": "output_text", "text": "drifted block"}]}}], mode="a")
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    assert "no header" in [m.text for m in msgs["gemini"]]
    old = [m for m in msgs["opencode"] if m.key.startswith("msg_old")]
    assert [(m.role, m.text) for m in old] == [("assistant", "legacy assistant text"), ("tool", "body")]
    assert old[0].files == ["/a.py"] and old[0].model == "m-1" and old[0].tokens_in == 3
    assert "drifted block" in [m.text for m in msgs["cursor"]]
    assert all(c.n_malformed == 0 for c in counts.values())


def test_codex_event_only_messages_are_kept_and_copies_are_not(tmp_path: Path) -> None:
    """Review-mode and subagent rollouts carry their text only in user_message / agent_message events."""
    root = tmp_path / "codex"
    day = root / "2026" / "03" / "02"
    write_jsonl(day / "rollout-2026-03-02T09-00-00-sub.jsonl", [
        {"timestamp": at(1), "type": "event_msg", "payload": {"type": "user_message", "message": "review this"}},
        {"timestamp": at(2), "type": "event_msg", "payload": {"type": "agent_message", "message": "review done"}}])
    write_jsonl(day / "rollout-2026-03-02T10-00-00-full.jsonl", [
        {"timestamp": at(3), "type": "response_item",
         "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}},
        {"timestamp": at(3), "type": "event_msg", "payload": {"type": "user_message", "message": "hello"}},
        {"timestamp": at(4), "type": "event_msg", "payload": {"type": "agent_message", "message": "hi there"}},
        {"timestamp": at(4), "type": "response_item",
         "payload": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi there"}]}}])
    msgs, counts = scrape_all({"codex": root})
    assert sorted((m.role, m.text) for m in msgs["codex"]) == [
        ("assistant", "hi there"), ("assistant", "review done"), ("user", "hello"), ("user", "review this")]
    assert counts["codex"].ignored == 2  # the two event copies of the full rollout


def test_cursor_ide_and_copilot_vscode_crash_forms(tmp_path: Path) -> None:
    from memlogs import cursor_db

    con = cursor_db(tmp_path / "cursor" / "state.vscdb", {
        "c1": {"createdAt": ms(1), "lastUpdatedAt": ms(2), "name": ["t"],
               "fullConversationHeadersOnly": 5, "conversation": {"x": 1}}},
        {"c1": {"b1": {"type": 1, "text": "good cursor-ide prompt", "createdAt": ms(1), "relevantFiles": 4},
                "b2": {"type": [2], "text": "odd type"},
                "b3": {"type": 2, "text": "fine", "tokenCount": {"inputTokens": "many"}, "toolFormerData": {"name": []}}}})
    con.close()
    vscode = tmp_path / "vscode"
    put_json(vscode / "ws1" / "chatSessions" / "chat1.json", {"sessionId": ["s"], "requests": [
        {"requestId": "r1", "timestamp": ms(3), "message": {"text": "good copilot-vscode prompt"},
         "variableData": [1, 2], "response": {"value": "x"}},
        {"requestId": ["r2"], "timestamp": ms(3)}, 7]})
    put_json(vscode / "ws1" / "chatSessions" / "chat2.json", {"requests": 12})
    os.mkfifo(vscode / "ws1" / "chatSessions" / "pipe.json")
    msgs, counts = scrape_all({"cursor-ide": tmp_path / "cursor", "copilot-vscode": vscode})
    assert "good cursor-ide prompt" in [m.text for m in msgs["cursor-ide"]]
    assert "good copilot-vscode prompt" in [m.text for m in msgs["copilot-vscode"]]
    assert counts["cursor-ide"].unknown == {"bubble type <list>": 1}
    assert counts["copilot-vscode"].malformed == {"no requestId": 1, "not a JSON object": 1,
                                                  "requests not a list": 1, "file not a regular file": 1}
    assert not any("parser error" in r for c in counts.values() for r in c.malformed)


def test_log_file_names_that_are_not_utf8(tmp_path: Path) -> None:
    """A non-UTF-8 file name reaches Python as surrogate escapes; its rows must still be storable."""
    roots = build_seven(tmp_path)
    claude_dir = os.fsencode(roots["claude"] / "p")
    with open(os.path.join(claude_dir, b"s\xff.jsonl"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(claude("user", "n1", 1, "odd file name")) + "\n")
    codex_day = os.fsencode(log_file("codex", roots["codex"]).parent)
    with open(os.path.join(codex_day, b"rollout-\xfe.jsonl"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"timestamp": at(1), "type": "response_item", "payload": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "odd rollout"}]}}) + "\n")
    msgs, _ = scrape_all(roots)  # scrape_all converts the rows to the MESSAGES table
    assert_all_good(msgs)
    odd = [m for m in msgs["claude"] + msgs["codex"] if m.text in ("odd file name", "odd rollout")]
    assert len(odd) == 2 and all("\ufffd" in m.source_file for m in odd)


def test_a_store_folder_that_cannot_be_listed_costs_only_that_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection (tests run as root here, so permissions cannot make listing fail)."""
    roots = build_seven(tmp_path)

    def denied(self: Any, root: Path) -> list[Path]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(SCRAPERS["claude"]), "store_files", denied)
    found = plan({name: [root] for name, root in roots.items()}, ScrapeState())
    assert found.warnings == [f"{roots['claude']}: cannot list (Permission denied)"]
    assert sorted(i.scraper for i in found.items) == sorted(t for t in TOOLS if t != "claude")


def test_scrape_state_round_trips_odd_paths_and_skips_unchanged_writes(tmp_path: Path) -> None:
    from ctxlake.tasks.scrape import STATE_FILE
    from ctxlake.tasks.scrape.base import FileState

    odd = "/logs/caf\udce9.jsonl"  # a name that is not UTF-8, as os.fsdecode keeps it
    state = ScrapeState({"claude": {odd: FileState([1, 2, 3], 3, 40, "", {"calls": {"t1": "Read"}}),
                                    "/logs/plain.jsonl": FileState([4, 5, 6], 6, 9)}})
    state.save(tmp_path)
    loaded = ScrapeState.load(tmp_path)
    assert loaded.files == state.files
    inode = os.stat(tmp_path / STATE_FILE).st_ino
    loaded.save(tmp_path)  # nothing moved: the file is left as it is
    assert os.stat(tmp_path / STATE_FILE).st_ino == inode
    loaded.files["claude"]["/logs/plain.jsonl"].offset = 10
    loaded.save(tmp_path)
    assert os.stat(tmp_path / STATE_FILE).st_ino != inode
    assert ScrapeState.load(tmp_path).files["claude"]["/logs/plain.jsonl"].offset == 10


def test_checks_reuse_the_saved_positions_until_the_file_changes(tmp_path: Path) -> None:
    from ctxlake.tasks import memory_state
    from ctxlake.tasks.scrape.base import FileState

    ScrapeState({"claude": {"/logs/a.jsonl": FileState([1, 2, 3], 3, 40)}}).save(tmp_path)
    first = memory_state._saved_positions(tmp_path)[0]
    assert memory_state._saved_positions(tmp_path)[0] is first  # unchanged file: no second read
    ScrapeState({"claude": {"/logs/a.jsonl": FileState([1, 2, 3], 3, 80)}}).save(tmp_path)
    second = memory_state._saved_positions(tmp_path)[0]
    assert second is not first and second.files["claude"]["/logs/a.jsonl"].offset == 80


def test_a_run_takes_the_kept_positions_and_gives_them_back_after_saving(tmp_path: Path) -> None:
    from ctxlake.tasks import memory_state
    from ctxlake.tasks.scrape.base import FileState

    ScrapeState({"claude": {"/logs/a.jsonl": FileState([1, 2, 3], 3, 40)}}).save(tmp_path)
    checked = memory_state._saved_positions(tmp_path)[0]
    taken, planned = memory_state.take_positions(tmp_path, {})
    assert taken is checked and planned is None  # no check handed over: the run plans itself
    # While a run holds them, a check reads the file, not the positions being advanced.
    taken.files["claude"]["/logs/a.jsonl"].offset = 99
    assert memory_state._saved_positions(tmp_path)[0].files["claude"]["/logs/a.jsonl"].offset == 40
    taken.save(tmp_path)
    memory_state.keep_positions(tmp_path, taken)
    assert memory_state._saved_positions(tmp_path)[0] is taken
    assert memory_state.take_positions(tmp_path, {})[0] is taken


def test_a_failed_run_gives_nothing_back(tmp_path: Path) -> None:
    from ctxlake.tasks import memory_state
    from ctxlake.tasks.scrape.base import FileState

    ScrapeState({"claude": {"/logs/a.jsonl": FileState([1, 2, 3], 3, 40)}}).save(tmp_path)
    memory_state._saved_positions(tmp_path)
    taken, _ = memory_state.take_positions(tmp_path, {})
    taken.files["claude"]["/logs/a.jsonl"].offset = 99  # advanced, then the run failed before saving
    again, _ = memory_state.take_positions(tmp_path, {})
    assert again is not taken and again.files["claude"]["/logs/a.jsonl"].offset == 40


def test_kept_positions_are_dropped_when_another_process_writes_the_file(tmp_path: Path) -> None:
    from ctxlake.tasks import memory_state
    from ctxlake.tasks.scrape.base import FileState

    ScrapeState({"claude": {"/logs/a.jsonl": FileState([1, 2, 3], 3, 40)}}).save(tmp_path)
    taken, _ = memory_state.take_positions(tmp_path, {})
    taken.save(tmp_path)
    memory_state.keep_positions(tmp_path, taken)
    ScrapeState({"claude": {"/logs/a.jsonl": FileState([1, 2, 3], 3, 80)}}).save(tmp_path)  # e.g. a scheduled run
    fresh, _ = memory_state.take_positions(tmp_path, {})
    assert fresh is not taken and fresh.files["claude"]["/logs/a.jsonl"].offset == 80


def test_a_run_uses_the_plan_of_the_check_handed_to_it(tmp_path: Path) -> None:
    from ctxlake.schemas.config import load_settings
    from ctxlake.tasks import memory_state

    logs = tmp_path / "logs"
    (logs / "p").mkdir(parents=True)
    (logs / "p" / "s.jsonl").write_text("{}\n")
    settings = load_settings(tmp_path)
    roots = {"claude": [logs]}
    fresh = memory_state.check(settings, roots, "m")
    assert fresh.plan.changed_files == 1
    with memory_state.planned(fresh, roots):
        state, planned = memory_state.take_positions(settings.memory_dir, {"codex": [logs]})
        assert planned is None  # other roots: that plan says nothing about them
    with memory_state.planned(fresh, roots):  # before any run: no positions file yet
        state, planned = memory_state.take_positions(settings.memory_dir, roots)
        assert state is fresh.state and planned is fresh.plan
    state.save(settings.memory_dir)
    memory_state.keep_positions(settings.memory_dir, state)
    fresh = memory_state.check(settings, roots, "m")
    with memory_state.planned(fresh, roots):
        again, planned = memory_state.take_positions(settings.memory_dir, roots)
        assert again is state and planned is fresh.plan
    assert memory_state.take_positions(settings.memory_dir, roots)[1] is None  # outside the block: plan again


def test_walk_files_sorts_like_paths(tmp_path: Path) -> None:
    from ctxlake.tasks.scrape.base import walk_files

    for rel in ("a-b/x.jsonl", "a/x.jsonl", "a/sub/y.jsonl", "a/z.txt", "a/.hidden/h.jsonl", "b.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    found = walk_files(tmp_path, (".jsonl",))
    assert found == sorted(found)  # pathlib's order: by parts, so a/ before a-b/
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a/sub/y.jsonl", "a/x.jsonl", "a-b/x.jsonl", "b.jsonl"]


def test_a_lone_surrogate_escape_keeps_the_gemini_session_and_the_claude_record(tmp_path: Path) -> None:
    """JS-based CLIs write `"\\ud83d"` when they cut a string inside an emoji: valid JSON orjson refuses."""
    roots = build_seven(tmp_path)
    doc = json.dumps({"sessionId": "gem-cut", "messages": [
        {"id": "m1", "timestamp": at(9), "type": "user", "content": "cut here \ud83d"},
        {"id": "m2", "timestamp": at(10), "type": "gemini", "content": "whole \ud83d\ude00 emoji"}]})
    assert '"cut here \\ud83d"' in doc  # the escape as written, not a character
    path = roots["gemini"] / "h9" / "chats" / "session-cut.json"
    path.parent.mkdir(parents=True)
    path.write_text(doc)
    line = json.dumps(claude("user", "s1", 3, "claude cut \udc00 mid-emoji"))
    with (roots["claude"] / "p" / "s.jsonl").open("a") as fh:
        fh.write(line + "\n")
    msgs, counts = scrape_all(roots)  # rows convert to Arrow: no surrogate may survive
    assert_all_good(msgs)
    gemini = [m.text for m in msgs["gemini"]]
    assert "cut here \ufffd" in gemini and "whole \U0001f600 emoji" in gemini
    assert "claude cut \ufffd mid-emoji" in [m.text for m in msgs["claude"]]
    assert counts["gemini"].n_malformed == 0 and counts["claude"].n_malformed == 0


def test_one_bad_byte_in_a_utf8_line_loses_only_that_byte(tmp_path: Path) -> None:
    roots = build_seven(tmp_path)
    line = json.dumps(claude("user", "b1", 3, "café crème BAD naïve"), ensure_ascii=False).encode()
    with (roots["claude"] / "p" / "s.jsonl").open("ab") as fh:
        fh.write(line.replace(b"BAD", b"\xff") + b"\n")
    doc = json.dumps({"sessionId": "gem-b", "messages": [{"id": "m1", "timestamp": at(9), "type": "user",
                                                          "content": "déjà BAD vu"}]}, ensure_ascii=False).encode()
    path = roots["gemini"] / "h9" / "chats" / "session-b.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(doc.replace(b"BAD", b"\xe2\x82"))  # a 3-byte sequence cut short
    msgs, counts = scrape_all(roots)
    assert_all_good(msgs)
    assert "café crème \ufffd naïve" in [m.text for m in msgs["claude"]]  # not "cafÃ© crÃ¨me"
    assert "déjà \ufffd vu" in [m.text for m in msgs["gemini"]]
    assert counts["claude"].n_malformed == 0

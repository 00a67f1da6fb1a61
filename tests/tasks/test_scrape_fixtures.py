"""Every agent-log fixture in ../shared parses with the message counts verified by hand (see each comment)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import shared_path

from ctxlake.tasks.scrape import SCRAPERS, ScrapeState, WorkItem, scrape_group
from ctxlake.tasks.scrape.base import Msg, ScrapeOutput

# (scraper, file under agent-logs/, messages, malformed, {role: count}). Counted by reading each
# file line by line; the rules: a record that carries content becomes one row; records a tool
# writes for itself (hooks, snapshots, UI state, injected instructions) are ignored; a record we
# would use whose timestamp does not parse ("[trimmed for fixture]") is malformed.
CASES = [
    # Claude small: u1 Hello; a1 text+bash; u2, u2b tool results (u2b denied = error); a2 Done.;
    # a3 Partial reply; api_refusal; compact_boundary; u3 compact summary; a-nested-1 (usage 10/5);
    # u-nested-1 tool result; system error 429. Records 46-86 with trimmed timestamps: 11 user/
    # assistant, 4 api_error, 1 compact_boundary, 1 model_refusal_fallback = 17 malformed.
    ("claude", "claude/small.jsonl", 12, 17, {"user": 1, "assistant": 4, "tool": 3, "system": 4}),
    # Claude large: Start / Ok, running. (+bash) / tool result / Continuing. / Step 1-3 with Ok each.
    ("claude", "claude/large.jsonl", 10, 0, {"user": 4, "assistant": 5, "tool": 1}),
    # Parent: session_start ignored, one prompt, one reply that spawns Task.
    ("claude", "claude/subagent/0a1b2c3d-4e5f-4061-8071-2a3b4c5d6e7f.jsonl", 2, 0, {"user": 1, "assistant": 1}),
    # Subagent: prompt, reply with grep, its result; the hook attachment is ignored.
    ("claude", "claude/subagent/0a1b2c3d-4e5f-4061-8071-2a3b4c5d6e7f/subagents/agent-a0ad4f44468bdf20d.jsonl", 3, 0,
     {"user": 1, "assistant": 1, "tool": 1}),
    # Codex small, records 0-25: user msg-1; custom_tool_call, function_call, tool_search_call,
    # web_search_call; their 3 outputs (+ tool_search_output); assistant msg-2; compacted. Event
    # copies (user_message, agent_message) of response items and reasoning are ignored. Records
    # 26-117 have trimmed timestamps; 33 are types we use: 8 turn_context, 6 session_meta, 5
    # compacted, 2 token_count, 1 error event, 2 user_message events (kept when no response item
    # repeats them), 9 response items (calls, outputs, agent messages, image generation).
    ("codex", "codex/small.jsonl", 10, 33, {"user": 1, "assistant": 5, "tool": 3, "system": 1}),
    # Codex large: Start, Acknowledged., tool_call, tool_result, Captured..., Step 1-5 / Ok x5; the
    # <environment_context> message is injected context, not the user's words.
    ("codex", "codex/large.jsonl", 15, 0, {"user": 6, "assistant": 8, "tool": 1}),
    ("gemini", "gemini/small.json", 2, 0, {"user": 1, "assistant": 1}),
    # Gemini large: m1; m2 + its tool result; m2b + its result (exit code 1); m3 info; m4; m5; m6.
    ("gemini", "gemini/large.json", 9, 0, {"user": 2, "assistant": 4, "tool": 2, "system": 1}),
    # Gemini JSONL: header and $set lines update the session; a user line, a tool call + result, a reply.
    ("gemini", "gemini/jsonl_v040.jsonl", 4, 0, {"user": 1, "assistant": 2, "tool": 1}),
    ("cursor", "cursor/small.jsonl", 4, 0, {"user": 2, "assistant": 2}),
    ("cursor", "cursor/large.jsonl", 10, 0, {"user": 3, "assistant": 5, "tool": 2}),
    ("cursor", "cursor/subagent/parent.jsonl", 2, 0, {"user": 1, "assistant": 1}),
    ("cursor", "cursor/subagent/subagents/child.jsonl", 2, 0, {"user": 1, "assistant": 1}),
    # Copilot large: system.message (instructions) ignored; Step 1-3, Ok, tool request, its result,
    # Captured..., Ok; session.truncation -> a compaction row.
    ("copilot", "copilot/large.jsonl", 9, 0, {"user": 3, "assistant": 4, "tool": 1, "system": 1}),
    # Copilot small: session.error; prompt; reply with a shell request; its result; Done. Records
    # 16-31 have trimmed timestamps; 10 are types we use: 3 tool.execution_complete, 3
    # assistant.message, 2 session.resume, 1 session.truncation, 1 user.message.
    ("copilot", "copilot/small.jsonl", 5, 10, {"user": 1, "assistant": 2, "tool": 1, "system": 1}),
    ("copilot", "copilot/subdir_v1/aaaabbbb-1111-2222-3333-ccccddddeeee/events.jsonl", 4, 0,
     {"user": 1, "assistant": 2, "tool": 1}),
    # Antigravity: USER_INPUT, 3 PLANNER_RESPONSEs (one thinking-only step has content), 5 tool
    # steps, a CHECKPOINT; CONVERSATION_HISTORY and 2 SYSTEM_MESSAGEs ignored; 6 trimmed steps.
    ("antigravity", "antigravity/cli_small.jsonl", 10, 6, {"user": 1, "assistant": 3, "tool": 5, "system": 1}),
    ("antigravity", "antigravity/small.md", 1, 0, {"system": 1}),
]


def scrape_file(name: str, path: Path, root: Path | None = None) -> ScrapeOutput:
    fp = SCRAPERS[name].fingerprint(path)
    assert fp is not None
    return scrape_group.fn(WorkItem(name, root or path.parent, [path], {str(path): fp}), ScrapeState())


@pytest.mark.parametrize(("name", "rel", "n", "malformed", "roles"), CASES, ids=[c[1] for c in CASES])
def test_fixture_counts(name: str, rel: str, n: int, malformed: int, roles: dict[str, int]) -> None:
    path = shared_path("fixtures", "agent-logs", rel)
    out = scrape_file(name, path)
    assert out.counts.messages == len(out.messages) == n
    assert out.counts.n_malformed == malformed
    assert out.counts.n_unknown == 0, out.counts.unknown
    assert dict(Counter(m.role for m in out.messages)) == roles
    assert all(m.timestamp.tzinfo is not None and m.tool == SCRAPERS[name].tool for m in out.messages)
    assert len({m.id for m in out.messages}) == n, "record ids must be unique within a file"


def test_every_fixture_file_is_covered() -> None:
    base = shared_path("fixtures", "agent-logs")
    logs = {p.relative_to(base).as_posix() for p in base.rglob("*") if p.suffix in (".jsonl", ".json", ".md")
            and "opencode" not in p.parts and p.name != "SOURCES.md"}
    assert logs - {c[1] for c in CASES} == {"claude/subagent/0a1b2c3d-4e5f-4061-8071-2a3b4c5d6e7f/subagents/agent-a0ad4f44468bdf20d.meta.json"}


def by_text(out: ScrapeOutput) -> dict[str, Msg]:
    return {m.text: m for m in out.messages if m.text}


def test_claude_small_details() -> None:
    out = scrape_file("claude", shared_path("fixtures", "agent-logs", "claude", "small.jsonl"))
    rows = by_text(out)
    nested = rows["Listing the files."]
    assert (nested.tokens_in, nested.tokens_out, nested.tokens_cached, nested.model) == (10, 5, 0, "claude-opus-5")
    denied = rows["The user doesn't want to proceed with this tool use."]
    assert denied.role == "tool" and denied.tool_calls[0]["is_error"] is True
    assert rows["I'll list files."].tool_calls[0] | {"id": None} == {"id": None, "name": "bash", "input": "ls", "is_error": None}
    assert {m.project_path for m in out.messages} == {"/tmp"} and {m.session_id for m in out.messages} == {"ses_stage0_small"}
    assert rows["Summary of prior context."].kind == "summary"
    assert "HTTP 429" in next(m.text for m in out.messages if m.kind == "error" and "429" in m.text)
    # The user's custom title beats the AI title written after it.
    assert out.meta[("claude", "ses_stage0_small")].title == "Stage0 small fixture"


def test_claude_subagent_rows_belong_to_the_parent_session() -> None:
    base = shared_path("fixtures", "agent-logs", "claude", "subagent")
    child = next(base.rglob("agent-*.jsonl"))
    out = scrape_file("claude", child, base)
    assert {m.session_id for m in out.messages} == {"0a1b2c3d-4e5f-4061-8071-2a3b4c5d6e7f"}
    assert {m.agent for m in out.messages} == {"a0ad4f44468bdf20d"}


def test_codex_tokens_are_counted_once_from_cumulative_totals() -> None:
    out = scrape_file("codex", shared_path("fixtures", "agent-logs", "codex", "small.jsonl"))
    counted = [(m.tokens_in, m.tokens_out, m.tokens_cached) for m in out.messages if m.tokens_in]
    assert counted == [(16341, 81, 3584)]  # one token_count event with a valid timestamp
    assert {m.session_id for m in out.messages} == {"019fc8be-3658-7ca3-9e29-000000000000"}
    assert any(m.kind == "compaction" for m in out.messages)
    large = scrape_file("codex", shared_path("fixtures", "agent-logs", "codex", "large.jsonl"))
    assert [(m.tokens_in, m.tokens_out) for m in large.messages if m.tokens_in] == [(12091, 182)]
    assert not any("environment_context" in m.text for m in large.messages)


def test_gemini_exit_codes_and_project_hash() -> None:
    out = scrape_file("gemini", shared_path("fixtures", "agent-logs", "gemini", "large.json"))
    results = [m for m in out.messages if m.role == "tool"]
    assert [r.tool_calls[0]["is_error"] for r in results] == [False, True]
    assert {m.project_hint for m in out.messages} == {"sha256:205016864bd110904e9ad8314192344ab398d043e779da15bedbb9ee9be00da2"}


def test_copilot_output_tokens_and_errors() -> None:
    out = scrape_file("copilot", shared_path("fixtures", "agent-logs", "copilot", "small.jsonl"))
    assert [m.tokens_out for m in out.messages if m.role == "assistant"] == [12, 3]
    assert "HTTP 400" in out.messages[0].text and out.messages[0].kind == "error"
    assert {m.project_path for m in out.messages} == {"/tmp/repo"}


def test_opencode_storage() -> None:
    root = shared_path("fixtures", "agent-logs", "opencode")
    st = ScrapeState()
    from ctxlake.tasks.scrape import plan

    work = plan({"opencode": [root]}, st)
    out = scrape_group.fn(work.items[0], st)
    # small: Hello / Found 2 files. (+bash) / its result; large: Step 1 / reply with a failing bash,
    # its result, a compaction part and the message's abort error / Step 2 / Ok.
    assert out.counts.messages == 10 and out.counts.n_malformed == 0
    assert Counter(m.role for m in out.messages) == {"user": 3, "assistant": 3, "tool": 2, "system": 2}
    failing = next(m for m in out.messages if m.role == "tool" and "non-existent" in m.text)
    assert failing.tool_calls[0]["is_error"] is True and failing.project_path == "/tmp/large"
    reply = next(m for m in out.messages if m.text == "Command failed with exit code 1.")
    assert reply.files == ["/tmp/large/error.log"] and (reply.tokens_in, reply.tokens_out) == (120, 16)
    assert out.meta[("opencode", "s_stage0_small")].title == "OpenCode Small"


def test_antigravity_files_and_tool_steps() -> None:
    out = scrape_file("antigravity", shared_path("fixtures", "agent-logs", "antigravity", "cli_small.jsonl"))
    files = {f for m in out.messages for f in m.files}
    assert files == {"/tmp/repo/a.txt", "/tmp/repo/notes.md"}
    assert [c["name"] for m in out.messages if m.role == "tool" for c in m.tool_calls] == [
        "list_directory", "view_file", "run_command", "code_action", "search_web"]
    assert out.messages[0].text == "List the files."  # the <USER_REQUEST> wrapper is dropped

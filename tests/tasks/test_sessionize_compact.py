"""Sessionize and compact over a real lake: gap splitting, project linking, the rule-based summary, git commits, LLM stubs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from memlogs import T0, at, claude, tool_result, tool_use, write_jsonl

from ctxlake.schemas.config import MemorySettings
from ctxlake.tasks.compact import compact
from ctxlake.tasks.memory_store import MemoryTables, messages_table, open_memory, store_messages
from ctxlake.tasks.scrape import ScrapeState, plan, scrape_group
from ctxlake.tasks.scrape.base import Msg, ScrapeOutput, SessionMeta
from ctxlake.tasks.sessionize import Segment, link_projects, resolve_hint, sessionize, slugify

DIMS = 8


def ingest(tmp_path: Path, records: list[dict[str, Any]], tables: MemoryTables | None = None) -> tuple[MemoryTables, ScrapeOutput]:
    root = tmp_path / "claude"
    write_jsonl(root / "p" / f"{records[0]['sessionId']}.jsonl", records)
    state = ScrapeState()
    out = ScrapeOutput()
    for item in plan({"claude": [root]}, state).items:
        out = scrape_group.fn(item, state)
    tables = tables or open_memory(tmp_path / "memory", DIMS)
    store_messages.fn(tables, messages_table(out.messages, DIMS), False, None)
    return tables, out


def segments_of(tables: MemoryTables, out: ScrapeOutput, gap: int = 30) -> list[Segment]:
    touched = {(m.tool, m.session_id) for m in out.messages}
    return sessionize.fn(tables.messages, tables.sessions, touched, out.meta, gap)


@pytest.mark.parametrize(("pause", "expected"), [(31, 2), (30, 1), (29, 1)])
def test_a_pause_longer_than_the_gap_starts_a_new_segment(tmp_path: Path, pause: float, expected: int) -> None:
    tables, out = ingest(tmp_path, [
        claude("user", "u1", 0, "Start the refactor"),
        claude("assistant", "a1", 2, [{"type": "text", "text": "Renamed the module."}]),
        claude("user", "u2", 2 + pause, "Back: continue with the tests"),
        claude("assistant", "a2", 3 + pause, [{"type": "text", "text": "Tests updated."}]),
    ])
    segs = segments_of(tables, out)
    assert len(segs) == expected
    assert [s.ref for s in segs] == ["claude:sess-a", "claude:sess-a#2"][:expected]
    assert sum(len(s.rows) for s in segs) == 4
    if expected == 2:
        assert [r["text"] for r in segs[1].rows] == ["Back: continue with the tests", "Tests updated."]


def commit_at(repo: Path, minute: float, message: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": at(minute), "GIT_COMMITTER_DATE": at(minute)}
    (repo / "log.txt").write_text(message)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env, capture_output=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", message], check=True, env=env, capture_output=True)


def test_compaction_summarizes_files_tools_errors_tasks_decisions_and_commits(
        tmp_path: Path, make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"README.md": "# api\n"}, name="api", commit=False)
    commit_at(repo, -120, "before the session")
    commit_at(repo, 12, "Switch uploader to httpx")  # after the last message, inside the slack
    commit_at(repo, 300, "long after")
    cwd = str(repo)
    tables, out = ingest(tmp_path, [
        claude("user", "u1", 0, "The uploader times out on large files", cwd=cwd),
        claude("assistant", "a1", 1, [{"type": "text", "text": "Let me look."}, tool_use("Read", file_path=f"{cwd}/uploader.py")], cwd=cwd),
        claude("user", "u2", 2, tool_result("ok"), cwd=cwd),
        claude("assistant", "a2", 3, [tool_use("Bash", command="pytest tests/test_upload.py")], cwd=cwd),
        claude("user", "u3", 4, tool_result("FAILED tests/test_upload.py::test_big - TimeoutError", is_error=True), cwd=cwd),
        claude("assistant", "a3", 5, [{"type": "text", "text": "We decided to use httpx instead of requests for streaming.\n- [ ] update docs\nTODO: add retries to the uploader"},
                                      tool_use("Edit", file_path=f"{cwd}/uploader.py")], cwd=cwd),
        claude("assistant", "a4", 6, [tool_use("Bash", command="pytest tests/test_upload.py")], cwd=cwd),
        claude("user", "u4", 7, tool_result("1 passed"), cwd=cwd),
        claude("assistant", "a5", 8, [{"type": "text", "text": "Fixed: streaming upload passes.\n- [x] update docs"}], cwd=cwd),
    ])
    [seg] = segments_of(tables, out)
    rows, warnings = compact.fn([seg], MemorySettings(compact_messages=2), DIMS)
    [row] = rows.to_pylist()
    assert warnings == []
    assert row["id"] == "claude:sess-a" and row["project_path"] == cwd
    assert row["files"] == [f"{cwd}/uploader.py"]
    assert {t["name"]: t["count"] for t in row["tool_counts"]} == {"Bash": 2, "Read": 1, "Edit": 1}
    assert row["errors"] == ["unknown: FAILED tests/test_upload.py::test_big - TimeoutError"]
    assert row["open_tasks"] == ["add retries to the uploader"]  # "update docs" was checked off
    assert row["decisions"] == ["We decided to use httpx instead of requests for streaming."]
    assert [c.split(" ", 1)[1] for c in row["commits"]] == ["Switch uploader to httpx"]
    assert row["first_messages"] == ["user: The uploader times out on large files", "assistant: Let me look."]
    assert row["last_messages"][-1].startswith("assistant: Fixed: streaming upload passes.")
    assert (row["n_messages"], row["n_user"], row["n_assistant"]) == (9, 1, 5)
    assert row["title"] == "The uploader times out on large files"
    for needle in ("uploader.py", "TimeoutError", "httpx", "add retries", "Switch uploader"):
        assert needle in row["text"]
    assert row["llm_summary"] is None


def test_projects_are_linked_from_hints_and_file_paths() -> None:
    root = "/srv/u/code/my_app"
    assert resolve_hint("sha256:" + hashlib.sha256(root.encode()).hexdigest(), [root, "/other"]) == root
    assert resolve_hint("slug:" + slugify(root), ["/other", root]) == root
    assert slugify(root) == "-srv-u-code-my-app"
    assert resolve_hint("sha256:00", [root]) == ""
    when = datetime(2026, 1, 1, tzinfo=UTC)

    def msg(session: str, **kw: Any) -> Msg:
        return Msg(tool="antigravity", session_id=session, timestamp=when, seq=0, role="assistant", kind="text",
                   text="x", key=session, source_file="f", **kw)

    out = ScrapeOutput(messages=[msg("a", files=[f"{root}/src/main.py"]), msg("b", project_hint="slug:-srv-u-code-my-app"),
                                 msg("c", files=["/elsewhere/x.py"])],
                       meta={("antigravity", "d"): SessionMeta("antigravity", "d", project_path="/srv/u/notes")})
    out.messages.append(msg("d"))
    assert link_projects.fn(out, {root}) == 3
    assert [m.project_path for m in out.messages] == [root, root, "", "/srv/u/notes"]


@pytest.fixture
def stub_llm(tmp_path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server answering like Ollama (/api/generate) and OpenAI (/chat/completions)."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            if self.path == "/api/generate":
                answer: dict[str, Any] = {"response": "Ollama summary: uploader fixed."}
            else:
                answer = {"choices": [{"message": {"content": "OpenAI summary: uploader fixed."}}]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def one_segment(tmp_path: Path) -> Segment:
    tables, out = ingest(tmp_path, [claude("user", "u1", 0, "Fix the uploader"),
                                    claude("assistant", "a1", 1, [{"type": "text", "text": "Done, it streams now."}])])
    [seg] = segments_of(tables, out)
    return seg


def test_llm_compaction_through_ollama_and_openai_endpoints(tmp_path: Path, stub_llm: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = stub_llm
    seg = one_segment(tmp_path)
    rows, _ = compact.fn([seg], MemorySettings(llm="ollama", llm_url=url, llm_model="tiny"), DIMS)
    assert rows.column("llm_summary").to_pylist() == ["Ollama summary: uploader fixed."]
    assert seen[-1]["path"] == "/api/generate" and seen[-1]["body"]["model"] == "tiny"
    assert "Fix the uploader" in seen[-1]["body"]["prompt"]
    rows, _ = compact.fn([seg], MemorySettings(llm="openai", llm_url=url, llm_model="m",
                                               llm_api_key="sk-test-not-a-real-key"), DIMS)
    assert rows.column("llm_summary").to_pylist() == ["OpenAI summary: uploader fixed."]
    assert seen[-1]["path"] == "/chat/completions" and seen[-1]["auth"] == "Bearer sk-test-not-a-real-key"
    assert "Summary: OpenAI summary" in rows.column("text").to_pylist()[0]


def test_llm_compaction_through_a_command_and_its_failure(tmp_path: Path) -> None:
    script = tmp_path / "summarize.py"
    script.write_text("import sys\nprompt = sys.stdin.read()\nprint('CMD summary of', len(prompt.splitlines()), 'lines')\n")
    seg = one_segment(tmp_path)
    rows, warnings = compact.fn([seg], MemorySettings(llm="command", llm_command=f"{sys.executable} {script}"), DIMS)
    assert rows.column("llm_summary").to_pylist()[0].startswith("CMD summary of") and warnings == []
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nsys.stderr.write('model not found')\nsys.exit(3)\n")
    rows, warnings = compact.fn([seg], MemorySettings(llm="command", llm_command=f"{sys.executable} {failing}"), DIMS)
    assert rows.column("llm_summary").to_pylist() == [None]  # the rule-based summary stays
    assert len(warnings) == 1 and "exited 3" in warnings[0] and "model not found" in warnings[0]


def test_unchanged_session_keeps_its_llm_summary_without_a_new_call(tmp_path: Path) -> None:
    seg = one_segment(tmp_path)
    counter = tmp_path / "calls.txt"
    script = tmp_path / "count.py"
    script.write_text(f"import sys\nsys.stdin.read()\nopen({str(counter)!r}, 'a').write('x')\nprint('summary')\n")
    memory = MemorySettings(llm="command", llm_command=f"{sys.executable} {script}")
    rows, _ = compact.fn([seg], memory, DIMS)
    seg.previous = rows.to_pylist()[0]
    again, _ = compact.fn([seg], memory, DIMS)
    assert again.column("llm_summary").to_pylist() == ["summary"]
    assert counter.read_text() == "x"


def test_time_zone_of_segments_is_utc(tmp_path: Path) -> None:
    seg = one_segment(tmp_path)
    assert seg.rows[0]["timestamp"] == T0

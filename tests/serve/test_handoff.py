"""`ctx handoff` over a lake the real ingest flow built from a synthetic Claude Code session with known facts."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import git
from memlogs import claude, slug, tool_result, tool_use, write_jsonl

from ctxlake.tasks.open_tasks import open_tasks
from ctxlake.tasks.tokens import estimate_tokens


def row(role: str, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"role": role, "kind": "text", "text": text, "tool_calls": calls or [], "agent": None}


def test_open_tasks_come_only_from_explicit_signals() -> None:
    rows = [
        row("user", "search the repo for TODO comments and list them"),
        row("assistant", "I found a TODO in main.py about caching.\n- [ ] add a cache test\n- [x] read the code\n"
                         "TODO: document the flag\nNext I will wire the CLI option"),
        row("assistant", "- [x] add a cache test"),
    ]
    assert open_tasks(rows) == ["document the flag", "wire the CLI option"]


def test_a_todo_tool_call_replaces_the_older_list() -> None:
    first = {"name": "TodoWrite", "input": json.dumps({"todos": [{"content": "old", "status": "pending"}]})}
    second = {"name": "TodoWrite", "input": json.dumps({"todos": [{"content": "old", "status": "completed"},
                                                                  {"content": "ship it", "status": "in_progress"}]})}
    assert open_tasks([row("assistant", "", [first]), row("assistant", "", [second])]) == ["ship it"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Iterator[dict[str, Any]]:
    from ctxlake.serve.cli.app import run

    base = tmp_path_factory.mktemp("handoff")
    repo = base / "app"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "cache.py").write_text("x = 1\n")
    git(repo, "add", ".")
    dated = {**os.environ, "GIT_COMMITTER_DATE": "2026-03-01T09:00:00Z", "GIT_AUTHOR_DATE": "2026-03-01T09:00:00Z"}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start"],
                   env=dated, check=True)
    (repo / "cache.py").write_text("x = 2\ny = 3\n")
    cwd = str(repo)
    write_jsonl(base / "claude" / "projects" / slug(cwd) / "s1.jsonl", [
        claude("user", "u1", 0, "Add an LRU cache to the fetcher and make the tests pass", session="s1", cwd=cwd),
        claude("assistant", "a1", 1, [{"type": "text", "text": "We decided to use functools.lru_cache with maxsize 256."},
                                      tool_use("Edit", file_path=f"{cwd}/cache.py")], session="s1", cwd=cwd),
        claude("user", "u2", 2, tool_result("ok"), session="s1", cwd=cwd),
        claude("user", "u3", 3, "also search the repo for TODO comments", session="s1", cwd=cwd),
        claude("assistant", "a3", 4, [{"type": "text", "text": "- [ ] add an eviction test\nRunning the tests."},
                                      tool_use("Bash", command="pytest -q tests/test_cache.py")], session="s1", cwd=cwd),
        claude("user", "u4", 5, tool_result("FAILED tests/test_cache.py::test_hit - KeyError", is_error=True),
               session="s1", cwd=cwd),
    ])
    env = {"CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash", "HOME": str(base / "home")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.chdir(repo)
        assert run(["run", "ingest", f"--from=claude={base / 'claude'}", "--json"]) == 0
    yield {"repo": repo, "env": env, "run": run}


@pytest.fixture
def here(project: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for key, value in project["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(project["repo"])
    return project


def test_brief_carries_the_known_facts(here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    project = here
    capsys.readouterr()
    assert project["run"](["handoff", "--json"]) == 0
    brief = json.loads(capsys.readouterr().out)
    assert brief["goal"].startswith("Add an LRU cache")
    assert any(f.endswith("cache.py") for f in brief["files"])
    assert "cache.py" in brief["diff_stat"]
    assert any("lru_cache" in d for d in brief["decisions"])
    assert "pytest -q tests/test_cache.py" in brief["failing_command"]
    assert brief["open_tasks"] == ["add an eviction test"]
    assert brief["last_user"].startswith("also search the repo")
    assert "failing" in brief["next_step"].lower()
    assert brief["tokens"] <= 1500 and brief["tokens"] == estimate_tokens(brief["text"])
    assert brief["token_estimate"] == "chars/4"


def test_budget_bounds_the_text_and_bad_input_is_an_error(here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    project = here
    capsys.readouterr()
    assert project["run"](["handoff", "--budget", "200"]) == 0
    text = capsys.readouterr().out
    assert estimate_tokens(text.rstrip("\n")) <= 200 and "Hand-off" in text
    assert project["run"](["handoff", "--budget", "10"]) != 0
    assert project["run"](["handoff", "--session", "nope-no-such"]) != 0



def test_mcp_tool_and_prompt_give_the_same_brief(here: dict[str, Any]) -> None:
    import asyncio

    from mcp import Client
    from mcp.server import MCPServer

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.mcp.base import ServeOptions, ServerState
    from ctxlake.serve.mcp.handoff import register_handoff

    server: MCPServer[ServerState] = MCPServer("handoff-test")
    register_handoff(server, ServerState(load_settings(here["repo"]), ServeOptions()))

    async def go() -> tuple[Any, Any, Any]:
        async with Client(server) as client:
            brief = await client.call_tool("handoff_brief", {"from_tool": "claude"})
            prompt = await client.get_prompt("continue_work", {})
            missing = await client.call_tool("handoff_brief", {"from_tool": "gemini"})
            return brief, prompt, missing

    brief, prompt, missing = asyncio.run(go())
    assert not brief.is_error
    data = brief.structured_content
    assert data["open_tasks"] == ["add an eviction test"] and data["tokens"] <= 1500
    assert data["text"] in prompt.messages[0].content.text
    assert missing.is_error and "no session" in missing.content[0].text


def test_remembered_knowledge_shows_before_the_next_ingest(here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    run = here["run"]
    assert run(["remember", "decision", "Pin the cache size to 256 entries", "--json"]) == 0
    capsys.readouterr()
    assert run(["knowledge", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    records = listed["records"] if isinstance(listed, dict) else listed
    assert any(r["title"] == "Pin the cache size to 256 entries" for r in records)


def test_a_session_resumed_after_a_long_pause_keeps_its_goal_and_open_tasks(
        tmp_path_factory: pytest.TempPathFactory, prefect_server: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A pause over [memory] gap_minutes splits one tool session into two segments; the brief of
    the last one (a single "go on") must still carry the goal and the open tasks set before it."""
    from ctxlake.serve.cli.app import run

    base = tmp_path_factory.mktemp("resumed")
    repo = base / "app"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    cwd = str(repo)
    write_jsonl(base / "claude" / "projects" / slug(cwd) / "s9.jsonl", [
        claude("user", "v1", 0, "Port the settings loader to TOML", session="s9", cwd=cwd),
        claude("assistant", "b1", 1, [{"type": "text", "text": "- [ ] write the migration\nStarting with the parser."}],
               session="s9", cwd=cwd),
        claude("user", "v2", 50, "go on", session="s9", cwd=cwd),  # after a 49-minute pause
    ])
    for key, value in {"CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash",
                       "HOME": str(base / "home")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(repo)
    assert run(["run", "ingest", f"--from=claude={base / 'claude'}", "--json"]) == 0
    capsys.readouterr()
    assert run(["sessions", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2  # the pause made two segments
    assert run(["handoff", "--json"]) == 0
    brief = json.loads(capsys.readouterr().out)
    assert brief["goal"].startswith("Port the settings loader")
    assert brief["open_tasks"] == ["write the migration"]
    assert brief["next_step"].startswith("Continue with the first open task")


def test_the_servers_memory_tools_share_one_reader(here: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """handoff_brief and tool_preferences opened a new memory reader per call (37.7 ms each for the
    brief); every tool of a server now reads through the one search_context keeps."""
    import asyncio

    from mcp import Client

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api import memory_lake
    from ctxlake.serve.mcp.server import build_server

    opened: list[Any] = []
    real_init = memory_lake.MemoryLake.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        opened.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(memory_lake.MemoryLake, "__init__", counting)
    server = build_server(load_settings(here["repo"]))

    async def go() -> list[Any]:
        async with Client(server) as client:
            return [await client.call_tool(name, args) for name, args in [
                ("handoff_brief", {}), ("handoff_brief", {"from_tool": "claude"}),
                ("search_context", {"query": "lru cache"}), ("tool_preferences", {}), ("handoff_brief", {})]]

    results = asyncio.run(go())
    assert [r.is_error for r in results] == [False] * 5, [r.content[0].text for r in results if r.is_error]
    assert results[2].structured_content["hits"], "search_context found nothing to show it read the lake"
    assert len(opened) == 1, f"{len(opened)} memory readers opened for five calls"

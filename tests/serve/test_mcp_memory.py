"""MCP memory tools on a bare MCPServer through the SDK's in-memory Client, over a lake the real flow built."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import git
from mcp import Client
from mcp.server import MCPServer
from mcp_helpers import call_memory_tool
from memlogs import build_stores

from ctxlake.schemas.config import Settings, load_settings
from ctxlake.serve.mcp.memory import register_memory_tools

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Iterator[dict[str, Any]]:
    """One ingest for the module: a project repo and three tools' stores, under a private HOME."""
    from ctxlake.serve.cli.app import run

    base = tmp_path_factory.mktemp("mcp")
    repo = base / "app"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    stores = build_stores(base / "stores", repo)
    env = {"CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash", "HOME": str(base / "home")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.chdir(repo)
        assert run(["run", "ingest", *[f"--from={n}={p}" for n, p in stores.items()], "--json"]) == 0
    yield {"repo": repo, "env": env, "settings": load_settings(repo, env={**os.environ, **env})}


def call(settings: Settings, tool: str, args: dict[str, Any], allow_writes: bool = False) -> Any:
    return call_memory_tool(settings, tool, args, allow_writes)


def ok(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    data = result.structured_content
    return data["result"] if isinstance(data, dict) and set(data) == {"result"} else data


def tool_list(settings: Settings, allow_writes: bool) -> dict[str, Any]:
    server = MCPServer("memory-test")
    register_memory_tools(server, settings, allow_writes=allow_writes)

    async def go() -> Any:
        async with Client(server) as client:
            return (await client.list_tools()).tools

    return {t.name: t for t in asyncio.run(go())}


def test_write_tools_only_when_allowed(lake: dict[str, Any]) -> None:
    read = tool_list(lake["settings"], False)
    assert sorted(read) == ["project_knowledge", "recent_sessions", "search_context", "session_detail"]
    assert all(t.annotations.read_only_hint for t in read.values())
    full = tool_list(lake["settings"], True)
    assert sorted(set(full) - set(read)) == ["save_decision", "save_error_solution", "save_insight"]
    assert not any(full[n].annotations.read_only_hint for n in ("save_decision", "save_error_solution", "save_insight"))
    assert set(read["search_context"].input_schema["properties"]) == {
        "query", "mode", "depth", "source_filter", "type_filter", "time_range", "limit"}


def normalise(data: Any, repo: Path) -> Any:
    text = json.dumps(data, sort_keys=True).replace(str(repo), "<repo>")
    text = re.sub(r'"(\d{4}-\d\d-\d\dT[^"]+)"', '"<time>"', text)
    return json.loads(text)


def test_recent_sessions_snapshot(lake: dict[str, Any]) -> None:
    sessions = ok(call(lake["settings"], "recent_sessions", {}))
    assert [s["session_ref"] for s in sessions] == ["gemini:gem-1", "codex:cx-fork", "codex:cx-parent"]
    got = normalise(sessions, lake["repo"])
    snapshot = SNAPSHOTS / "recent_sessions.json"
    if not snapshot.exists():
        snapshot.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        pytest.fail(f"wrote {snapshot}: review it, then run again")
    assert got == json.loads(snapshot.read_text())
    claude = ok(call(lake["settings"], "recent_sessions", {"limit": 5, "tool_filter": ["claude"]}))
    assert [s["session_ref"] for s in claude] == ["claude:sess-a#2", "claude:sess-a"]
    assert claude[1]["open_tasks"] == ["rotate the old key"] and claude[1]["errors"]


def test_session_detail_pages_and_bad_refs(lake: dict[str, Any]) -> None:
    page = ok(call(lake["settings"], "session_detail", {"session_ref": "claude:sess-a", "offset": 0, "limit": 4}))
    assert (page["total"], page["next_offset"], len(page["messages"])) == (6, 4, 4)
    assert page["messages"][0]["text"].startswith("Deploy fails: export GITHUB_TOKEN=[REDACTED:")
    assert page["messages"][1]["tool_calls"] == [{"name": "Bash", "input": "./deploy.sh --dry-run", "is_error": None}]
    rest = ok(call(lake["settings"], "session_detail", {"session_ref": "claude:sess-a", "offset": 4}))
    assert rest["next_offset"] is None and len(rest["messages"]) == 2
    bad = call(lake["settings"], "session_detail", {"session_ref": "nope"})
    assert bad.is_error and "no session matches 'nope'" in bad.content[0].text
    negative = call(lake["settings"], "session_detail", {"session_ref": "claude:sess-a", "offset": -1})
    assert negative.is_error and "offset must be >= 0" in negative.content[0].text


def test_search_context_filters_and_errors(lake: dict[str, Any]) -> None:
    s = lake["settings"]
    hits = ok(call(s, "search_context", {"query": "deploy key", "mode": "keyword"}))["hits"]
    assert hits and hits[0]["session_ref"].startswith("claude:sess-a")
    codex = ok(call(s, "search_context", {"query": "health", "source_filter": ["codex"], "type_filter": ["message"]}))["hits"]
    assert codex and {h["tool"] for h in codex} == {"codex"} and {h["type"] for h in codex} == {"message"}
    late = ok(call(s, "search_context", {"query": "health", "mode": "keyword", "time_range": {"after": "2026-03-02T10:45"}}))
    assert {h["tool"] for h in late["hits"]} == {"gemini"}
    detail = ok(call(s, "search_context", {"query": "readyz", "depth": "detail", "type_filter": ["session"]}))["hits"]
    assert detail[0]["ref"] == "codex:cx-fork" and "Also added /readyz" in detail[0]["text"]
    for args, words in [({"query": ""}, "empty query"), ({"query": "x", "mode": "fuzzy"}, "mode"),
                        ({"query": "x", "time_range": {"before": "soonish"}}, "not a date"),
                        ({"query": "x", "limit": 0}, "limit must be between 1 and 200")]:
        result = call(s, "search_context", args)
        assert result.is_error and words in result.content[0].text, (args, result.content[0].text)


def test_save_tools_write_files_only(lake: dict[str, Any]) -> None:
    s = lake["settings"]
    memory_versions = {p.name: len(list(p.rglob("*.manifest"))) for p in s.memory_dir.glob("*.lance")}
    before = ok(call(s, "project_knowledge", {}))
    saved = ok(call(s, "save_decision", {"title": "Deploy with a dedicated key",
                                          "rationale": "CI loads it with ssh-add; personal keys are not used.",
                                          "files": ["deploy.sh"], "source_tool": "claude", "source_session": "claude:sess-a"},
                    allow_writes=True))
    assert saved["status"] == "created" and (lake["repo"] / saved["path"]).is_file()
    again = ok(call(s, "save_decision", {"title": "Deploy with a dedicated key",
                                          "rationale": "CI loads it with ssh-add; personal keys are not used."}, allow_writes=True))
    assert again["status"] == "duplicate" and again["id"] == saved["id"]
    fix = ok(call(s, "save_error_solution", {"error": "permission denied (publickey)", "solution": "ssh-add the deploy key"},
                  allow_writes=True))
    assert fix["status"] == "created" and fix["path"].startswith(".ctx/knowledge/errors/")
    # Files only (the tables are unchanged until the next `ctx run ingest`), yet listed at once.
    after = ok(call(s, "project_knowledge", {}))
    assert {r["id"] for r in after["records"]} == {r["id"] for r in before["records"]} | {saved["id"], fix["id"]}
    assert {p.name: len(list(p.rglob("*.manifest"))) for p in s.memory_dir.glob("*.lance")} == memory_versions
    refused = call(s, "save_insight", {"title": "x"}, allow_writes=False)
    assert refused.is_error


def test_the_memory_tools_never_import_prefect(lake: dict[str, Any]) -> None:
    script = f"""
import asyncio, json, sys
from pathlib import Path
from mcp import Client
from mcp.server import MCPServer
from ctxlake.schemas.config import load_settings
from ctxlake.serve.mcp.memory import register_memory_tools
server = MCPServer("t")
register_memory_tools(server, load_settings(Path({str(lake['repo'])!r})))
async def go():
    async with Client(server) as c:
        a = await c.call_tool("recent_sessions", {{"limit": 2}})
        b = await c.call_tool("search_context", {{"query": "deploy"}})
        return a.is_error or b.is_error
print(json.dumps({{"error": asyncio.run(go()), "prefect": "prefect" in sys.modules}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **lake["env"]})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"error": False, "prefect": False}

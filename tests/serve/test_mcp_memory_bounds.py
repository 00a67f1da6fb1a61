"""The memory tools' answers stay under [mcp] max_response_chars whatever the lake holds (a 300 KB
message, a hand-written 300 KB knowledge record, 80 messages in a session), and the save_* tools
refuse over-long input instead of writing it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from helpers import git
from mcp_helpers import call_memory_tool
from memlogs import claude, slug, write_jsonl

from ctxlake.schemas.config import Settings, load_settings

BIG = 300_000
BUDGET = 60_000  # the default [mcp] max_response_chars


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Iterator[Settings]:
    from ctxlake.serve.cli.app import run
    from ctxlake.tasks.knowledge import Record, render

    base = tmp_path_factory.mktemp("bounds")
    repo = base / "app"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    cwd = str(repo)
    records = [claude("user", "u0", 0, "Why does the nightly export time out? " + "export row " * (BIG // 11),
                      session="long", cwd=cwd)]
    records += [claude("assistant" if i % 2 else "user", f"m{i}", i, f"export step {i}: " + "x" * 2_000,
                       session="long", cwd=cwd) for i in range(1, 80)]
    write_jsonl(base / "claude" / "projects" / slug(cwd) / "long.jsonl", records)
    # Written by hand (as an old or edited file would be): the save tools refuse a record this long.
    folder = repo / ".ctx" / "knowledge" / "insights"
    folder.mkdir(parents=True)
    for n in range(3):
        record = Record(id=f"insight-20260101-0000000{n}", type="insight", title=f"Export {n} " + "T" * 5_000,
                        body="The export batches rows. " * (BIG // 25), created_at=datetime(2026, 1, 1, n, tzinfo=UTC),
                        path="")
        (folder / f"{record.id}.md").write_text(render(record), encoding="utf-8")
    env = {"CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash",
           "HOME": str(base / "home")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.chdir(repo)
        assert run(["run", "ingest", f"--from=claude={base / 'claude'}", "--json"]) == 0
    yield load_settings(repo, env={**os.environ, **env})


def call(settings: Settings, tool: str, args: dict[str, Any], allow_writes: bool = False) -> Any:
    return call_memory_tool(settings, tool, args, allow_writes)


def bounded(result: Any) -> Any:
    """The structured answer, after checking that it and its text mirror fit the budget together."""
    assert not result.is_error, result.content[0].text
    structured = json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
    size = sum(len(c.text) for c in result.content) + len(structured)
    assert size <= BUDGET, size
    return result.structured_content


def test_search_context_at_raw_depth_stays_under_the_budget(lake: Settings) -> None:
    for types in (["message"], ["knowledge"], None):
        answer = bounded(call(lake, "search_context", {"query": "export", "depth": "raw", "type_filter": types,
                                                       "mode": "keyword", "limit": 50}))
        assert answer["hits"] and any("shortened" in w for w in answer["warnings"]), types


def test_project_knowledge_stays_under_the_budget(lake: Settings) -> None:
    answer = bounded(call(lake, "project_knowledge", {}))
    assert answer["records"] and answer["records"][0]["body"].endswith(" …")
    assert any("shortened" in w for w in answer["warnings"])


def test_session_detail_pages_what_fits_and_continues_at_next_offset(lake: Settings) -> None:
    first = bounded(call(lake, "session_detail", {"session_ref": "claude:long", "limit": 100}))
    assert first["total"] == 80 and first["messages"][0]["text"].endswith(" …")
    assert first["next_offset"] == len(first["messages"]) < 80 and first["warnings"]
    rest = bounded(call(lake, "session_detail", {"session_ref": "claude:long", "offset": first["next_offset"]}))
    assert rest["messages"][0]["id"] != first["messages"][-1]["id"]


def test_recent_sessions_has_a_json_text_mirror_even_when_empty(lake: Settings) -> None:
    result = call(lake, "recent_sessions", {"tool_filter": ["cursor"]})
    assert not result.is_error and result.structured_content == {"result": []}
    assert [c.text for c in result.content] == ["[]"]
    found = call(lake, "recent_sessions", {})
    assert len(found.content) == 1 and json.loads(found.content[0].text) == bounded(found)["result"]


def test_limits_below_one_are_refused_by_every_memory_tool(lake: Settings) -> None:
    for tool, args in [("project_knowledge", {"limit": -1}), ("project_knowledge", {"limit": 0}),
                       ("recent_sessions", {"limit": -1}), ("session_detail", {"session_ref": "claude:long", "limit": 0}),
                       ("search_context", {"query": "export", "limit": 0})]:
        result = call(lake, tool, args)
        assert result.is_error and "limit" in result.content[0].text, (tool, args)


@pytest.mark.parametrize(("args", "words"), [
    ({"title": "A" * 100_000, "details": "short"}, "the title is 100,000 characters; at most 200"),
    ({"title": "Exports batch rows", "details": "B" * 10_000_000}, "the body is 10,000,000 characters; at most 20,000"),
    ({"title": "Exports batch rows", "tags": [f"t{i}" for i in range(51)]}, "51 tags; at most 50"),
    ({"title": "Exports batch rows", "files": ["f" * 501]}, "one of the files is 501 characters"),
])
def test_save_tools_refuse_over_long_input_and_write_nothing(lake: Settings, args: dict[str, Any], words: str) -> None:
    before = sorted(lake.knowledge_dir.rglob("*.md"))
    result = call(lake, "save_insight", args, allow_writes=True)
    assert result.is_error and words in result.content[0].text
    assert sorted(lake.knowledge_dir.rglob("*.md")) == before

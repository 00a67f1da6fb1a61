"""MCP tools, resources and prompts through the SDK's in-memory Client over a real indexed lake."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import git, write_files
from mcp import Client, MCPError
from mcp_helpers import PROJECT, call_error, call_ok, check_snapshot, scrub

from ctxlake.schemas.config import Settings, load_settings
from ctxlake.serve.api.tool_models import decode_cursor
from ctxlake.serve.mcp.server import ServeOptions, build_server

pytestmark = pytest.mark.usefixtures("prefect_server")

CONTRACT = {
    "search_code": {"query", "top_k", "search_type", "bm25_weight", "fuzziness", "file_filter", "sources", "budget_tokens"},
    "find_files": {"query", "top_k", "search_type", "file_filter", "exclude_tests", "sources"},
    "fuzzy_find": {"symbol_name", "symbol_type"},
    "get_file_context": {"filepath", "start_line", "end_line", "include_related", "source"},
    "get_stale_status": set(),
    "list_sources": set(),
    "docs_index": {"source", "cursor"},
    "docs_content": {"path", "chunk"},
    "search_context": {"query", "mode", "depth", "source_filter", "type_filter", "time_range", "limit"},
    "recent_sessions": {"limit", "tool_filter"},
    "session_detail": {"session_ref", "offset", "limit"},
    "handoff_brief": {"from_tool", "session_ref", "budget"},
    "list_configs": {"kind"},
    "get_config": {"name", "kind"},
    "tool_preferences": set(),
    "project_knowledge": {"type", "query", "limit"},
    "find_definition": {"symbol", "from_path", "limit", "source"},
    "find_references": {"symbol", "offset", "limit", "include_imports", "source"},
    "related_files": {"path", "limit", "source"},
    "file_outline": {"path", "limit", "source"},
}
SAVE_TOOLS = {"save_decision", "save_error_solution", "save_insight"}


def index_project(root: Path, env: dict[str, str]) -> None:
    """`ctx run index` in this process (the session's Prefect server) with the given environment."""
    from ctxlake.serve.cli.app import run

    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.chdir(root)
        assert run(["run", "index"]) == 0


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Iterator[tuple[Path, dict[str, str]]]:
    """One indexed project shared by the read-only tests of this module (fake embedder)."""
    root = tmp_path_factory.mktemp("mcp") / "shop"
    write_files(root, PROJECT)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "shop")
    env = {"CTX_HOME": str(tmp_path_factory.mktemp("home")), "CTX_EMBED_PROVIDER": "fake",
           "CTX_EMBED_MODEL": "hash"}
    index_project(root, env)
    yield root, env


def settings_for(root: Path, env: dict[str, str], **mcp: Any) -> Settings:
    overrides = {"mcp": {"stale_check_s": 0, **mcp}}
    return load_settings(root, overrides, env={**os.environ, **env})


def with_client(server: Any, body: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with Client(server) as client:
            await body(client)

    try:
        anyio.run(main)
    except BaseExceptionGroup as group:
        # Show the failing assertion itself, not the task groups wrapped around it.
        inner: BaseException = group
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        raise inner from None


def test_tool_list_is_the_contract(shop: tuple[Path, dict[str, str]]) -> None:
    server = build_server(settings_for(*shop))

    async def body(client: Client) -> None:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == set(CONTRACT), "index_codebase must not be exposed by default"
        for name, params in CONTRACT.items():
            tool = tools[name]
            assert set(tool.input_schema.get("properties", {})) == params, name
            assert tool.output_schema is not None and tool.description, name
            ann = tool.annotations
            assert ann is not None and ann.read_only_hint and ann.idempotent_hint, name
            assert ann.open_world_hint is False and ann.destructive_hint is False, name
        search = tools["search_code"].input_schema["properties"]
        assert search["search_type"]["enum"] == ["hybrid", "keyword", "semantic", "fuzzy"]  # the CLI's --mode words
        assert search["top_k"]["default"] == 10 and search["fuzziness"]["anyOf"][0]["maximum"] == 2
        check_snapshot("mcp_tools_list", [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                                          for t in sorted(tools.values(), key=lambda t: t.name)])

    with_client(server, body)


def test_allow_writes_adds_only_the_knowledge_save_tools(shop: tuple[Path, dict[str, str]]) -> None:
    """`ctx serve --allow-writes` adds the save_* tools to the same server; they write a file only."""
    settings = settings_for(*shop)
    server = build_server(settings, ServeOptions(allow_writes=True))

    async def body(client: Client) -> None:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == set(CONTRACT) | SAVE_TOOLS
        assert all(tools[n].annotations.read_only_hint is False for n in SAVE_TOOLS)
        saved = await call_ok(client, "save_insight", {
            "title": "Invoices round half up", "details": "Totals use Decimal with ROUND_HALF_UP."})
        assert saved["status"] == "created"
        written = settings.root / saved["path"]
        assert written.parent == settings.knowledge_dir / "insights" and "ROUND_HALF_UP" in written.read_text()
        written.unlink()

    with_client(server, body)


def test_search_code_modes_and_snapshot(shop: tuple[Path, dict[str, str]]) -> None:
    root, env = shop
    server = build_server(settings_for(root, env))

    async def body(client: Client) -> None:
        keyword = await call_ok(client, "search_code", {"query": "invoice total tax", "search_type": "keyword", "top_k": 3})
        assert keyword["mode"] == "keyword" and keyword["stale"] is False
        check_snapshot("mcp_search_code_keyword", scrub(keyword, root))
        hybrid = await call_ok(client, "search_code", {"query": "compute the invoice total with tax"})
        assert hybrid["hits"][0]["path"] == "src/billing/invoice.py" and hybrid["embedded_fraction"] == 1.0
        semantic = await call_ok(client, "search_code", {"query": "compute invoice total", "search_type": "semantic"})
        assert semantic["hits"][0]["path"] == "src/billing/invoice.py" and semantic["mode"] == "semantic"
        fuzzy = await call_ok(client, "search_code", {"query": "getUsrByld", "search_type": "fuzzy"})
        assert "UserRepository.getUserById" in fuzzy["hits"][0]["symbol"]
        # One typo per word: found with fuzziness 1, not with exact words.
        exact = await call_ok(client, "search_code", {"query": "invoise", "search_type": "keyword"})
        assert exact["hits"] == []
        typo = await call_ok(client, "search_code", {"query": "invoise", "search_type": "keyword", "fuzziness": 1})
        assert any(h["path"] == "src/billing/invoice.py" for h in typo["hits"])
        only_js = await call_ok(client, "search_code", {"query": "invoice", "file_filter": "*.js", "search_type": "keyword"})
        assert {h["path"] for h in only_js["hits"]} == {"web/app.js"}
        # The CLI's check (`ctx search --sources`): a typo is an error, not an empty answer.
        for tool in ("search_code", "find_files"):
            assert "unknown source(s): elsewhere" in await call_error(client, tool, {"query": "invoice",
                                                                                     "sources": ["elsewhere"]})

    with_client(server, body)


def test_find_files_ranks_files_for_an_issue_text(shop: tuple[Path, dict[str, str]]) -> None:
    server = build_server(settings_for(*shop))
    issue = ("Invoice totals are off by a cent\n\n"
             "compute_invoice_total() rounds after adding tax, so a 0.5 cent subtotal comes out wrong.")

    async def body(client: Client) -> None:
        ranked = await call_ok(client, "find_files", {"query": issue, "top_k": 3})
        assert ranked["files"][0]["path"] == "src/billing/invoice.py" and ranked["mode"] == "hybrid"
        assert ranked["files"][0]["start_line"] is not None and len(ranked["files"]) <= 3
        users = await call_ok(client, "find_files", {"query": "UserRepository.getUserById returns None",
                                                     "search_type": "keyword"})
        assert users["files"][0]["path"] == "src/users/service.py" and users["stale"] is False
        js = await call_ok(client, "find_files", {"query": "invoice", "file_filter": "*.js"})
        assert {f["path"] for f in js["files"]} == {"web/app.js"}

    with_client(server, body)


def test_search_code_rejects_bad_input(shop: tuple[Path, dict[str, str]]) -> None:
    server = build_server(settings_for(*shop))

    async def body(client: Client) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"query": "   "}, "empty query"),
            ({"query": "x", "top_k": 0}, "greater than or equal to 1"),
            ({"query": "x", "top_k": 51}, "less than or equal to 50"),
            ({"query": "x", "search_type": "vector"}, "'hybrid', 'keyword', 'semantic' or 'fuzzy'"),
            ({"query": "x", "bm25_weight": 2}, "less than or equal to 1"),
            ({"query": "x", "fuzziness": 3}, "less than or equal to 2"),
            ({"query": "x", "file_filter": "src/[abc"}, "unbalanced '['"),
            ({}, "query"),
        ]
        for args, message in cases:
            text = await call_error(client, "search_code", args)
            assert message in text, (args, text)
        with pytest.raises(MCPError, match="unknown tool 'index_codebase'"):  # a protocol error now
            await client.call_tool("index_codebase", {})

    with_client(server, body)


def test_fuzzy_find(shop: tuple[Path, dict[str, str]]) -> None:
    root, env = shop
    server = build_server(settings_for(root, env))

    async def body(client: Client) -> None:
        found = await call_ok(client, "fuzzy_find", {"symbol_name": "getUsrById"})
        assert found["matches"][0]["symbol"] == "UserRepository.getUserById"
        check_snapshot("mcp_fuzzy_find", scrub(found, root))
        classes = await call_ok(client, "fuzzy_find", {"symbol_name": "invoiceprinter", "symbol_type": "class"})
        assert [m["symbol"] for m in classes["matches"]] == ["InvoicePrinter"]
        assert classes["matches"][0]["score"] == 100.0
        assert (await call_ok(client, "fuzzy_find", {"symbol_name": "zzzqqq"}))["matches"] == []
        text = await call_error(client, "fuzzy_find", {"symbol_name": "save", "symbol_type": "struct"})
        assert "unknown symbol_type 'struct'" in text and "class" in text and "function" in text
        assert "no letters or digits" in await call_error(client, "fuzzy_find", {"symbol_name": "!!"})

    with_client(server, body)


def test_get_file_context(shop: tuple[Path, dict[str, str]]) -> None:
    root, env = shop
    server = build_server(settings_for(root, env))

    async def body(client: Client) -> None:
        ctx = await call_ok(client, "get_file_context", {"filepath": "src/billing/invoice.py", "end_line": 4})
        assert ctx["content"] == "".join(PROJECT["src/billing/invoice.py"].splitlines(keepends=True)[:4])
        assert ctx["next_start_line"] == 5 and ctx["related"] == [] and not ctx["stale"]
        check_snapshot("mcp_get_file_context", scrub(ctx, root))
        related = await call_ok(client, "get_file_context", {
            "filepath": "src/billing/invoice.py", "start_line": 12, "include_related": True})
        outline = related["outline"]
        assert outline and outline[0]["symbol"].startswith("InvoicePrinter") and outline[0]["kind"] == "class"
        assert all(o["start_line"] <= related["end_line"] and o["end_line"] >= 12 for o in outline)
        assert related["related"] and all(h["path"] != "src/billing/invoice.py" for h in related["related"])
        absolute = await call_ok(client, "get_file_context", {"filepath": str(root / "web" / "app.js")})
        assert absolute["path"] == "web/app.js" and absolute["total_lines"] == 14
        for args, message in [
            ({"filepath": "src/billing/invoise.py"}, "did you mean src/billing/invoice.py"),
            ({"filepath": "../shop/src/billing/invoice.py"}, "path traversal not allowed"),
            ({"filepath": "/etc/passwd"}, "absolute path outside the project"),
            ({"filepath": "docs/conf.py", "start_line": 40}, "start_line 40 is out of range"),
            ({"filepath": "docs/conf.py", "start_line": 0}, "greater than or equal to 1"),
            ({"filepath": "README.md", "start_line": 2, "end_line": 1}, "end_line 1 is before start_line 2"),
        ]:
            assert message in await call_error(client, "get_file_context", args), args

    with_client(server, body)


def test_status_and_sources_snapshots(shop: tuple[Path, dict[str, str]]) -> None:
    root, env = shop
    server = build_server(settings_for(root, env))

    async def body(client: Client) -> None:
        status = await call_ok(client, "get_stale_status")
        assert status["up_to_date"] and status["root_hash_match"] and status["stale_files"] == []
        assert status["embedding"]["fraction"] == 1.0 and status["indexer_running"] is None
        status["root_hash_indexed"] = status["root_hash_current"] = "<HASH>"
        check_snapshot("mcp_get_stale_status", scrub(status, root))
        sources = await call_ok(client, "list_sources")
        project = sources["sources"][0]
        assert project["name"] == "project" and project["files"] == len(PROJECT) and project["root"] == str(root)
        assert project["embedded"] == project["chunks"] > 0
        check_snapshot("mcp_list_sources", scrub(sources, root))

    with_client(server, body)


def test_resources(shop: tuple[Path, dict[str, str]]) -> None:
    root, env = shop
    server = build_server(settings_for(root, env))

    async def body(client: Client) -> None:
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert listed == {"ctx://status", "ctx://config", "ctx://files"}
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert templates == {"ctx://files{?cursor}", "ctx://file/{+path}"}
        status = json.loads((await client.read_resource("ctx://status")).contents[0].text)
        assert status["indexed"] and status["files"] == len(PROJECT)
        config = json.loads((await client.read_resource("ctx://config")).contents[0].text)
        assert config["docs"]["paths"] == ["docs"] and "api_key" not in config["embed"]
        files = json.loads((await client.read_resource("ctx://files")).contents[0].text)
        assert [f["path"] for f in files["files"]][:2] == ["README.md", "docs/billing.md"]
        assert files["total"] == len(PROJECT) and files["next_cursor"] is None
        text = (await client.read_resource("ctx://file/src/billing/invoice.py")).contents[0].text
        assert text == PROJECT["src/billing/invoice.py"]
        with pytest.raises(MCPError, match="path traversal not allowed"):
            await client.read_resource("ctx://file/../../etc/passwd")
        with pytest.raises(MCPError, match="invalid cursor"):
            await client.read_resource("ctx://files?cursor=garbage")

    with_client(server, body)


def test_file_listing_pages(shop: tuple[Path, dict[str, str]]) -> None:
    from ctxlake.serve.api.code_lake import Lake
    from ctxlake.serve.api.explore import list_files

    lake = Lake(settings_for(*shop))
    pages, cursor = [], None
    while True:
        page = list_files(lake, cursor, page=3)
        pages.append([f.path for f in page.files])
        cursor = page.next_cursor
        if cursor is None:
            break
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [p for page in pages for p in page] == sorted(PROJECT)
    assert decode_cursor(list_files(lake, None, page=3).next_cursor or "", "files") == 3


def test_prompts(shop: tuple[Path, dict[str, str]]) -> None:
    server = build_server(settings_for(*shop))

    async def body(client: Client) -> None:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert set(prompts) == {"code_review", "explain_codebase", "find_similar", "continue_work"}
        assert [a.name for a in prompts["code_review"].arguments or []] == ["filepath"]
        review = (await client.get_prompt("code_review", {"filepath": "src/billing/invoice.py"})).messages[0]
        assert "`src/billing/invoice.py`" in review.content.text and "def compute_invoice_total" in review.content.text
        assert "function compute_invoice_total (lines 1-6)" in review.content.text
        explain = (await client.get_prompt("explain_codebase")).messages[0].content.text
        assert "- src/ (2 files)" in explain and "docs/billing.md" in explain
        similar = (await client.get_prompt("find_similar", {"code": "def total(lines): return sum(lines)"})).messages[0]
        assert "Candidates" in similar.content.text and "src/billing/invoice.py" in similar.content.text
        with pytest.raises(MCPError, match="not an indexed file"):
            await client.get_prompt("code_review", {"filepath": "nope.py"})

    with_client(server, body)


# -- behaviour over time: staleness, laziness, indexing while serving --------------------------------


def test_stale_status_counts_the_vectors_once_per_table_version(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The count of chunks without a vector scans the whole vector column (~0.1 s of CPU on django,
    which every get_stale_status call paid: 11 calls/s from ten agents, against 137 keyword
    searches/s): once per version of the chunks table, as embedded_fraction already did."""
    from lancedb.table import LanceTable

    repo = make_repo(PROJECT)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    counted: list[str | None] = []
    real = LanceTable.count_rows

    def counting(self: LanceTable, filter: str | None = None) -> int:
        if filter and "vector" in filter:
            counted.append(filter)
        return int(real(self, filter))

    monkeypatch.setattr(LanceTable, "count_rows", counting)
    server = build_server(settings_for(repo, {}))

    async def body(client: Client) -> None:
        first = (await call_ok(client, "get_stale_status"))["embedding"]
        assert first["pending"] == first["chunks"] > 0 and first["fraction"] == 0.0
        assert counted  # by this call, or by the server's warm-up running beside it
        counted.clear()
        for _ in range(3):
            assert (await call_ok(client, "get_stale_status"))["embedding"] == first
        assert counted == []
        assert cli("run", "index", cwd=repo).exit_code == 0  # embeds them: a new version
        after = (await call_ok(client, "get_stale_status"))["embedding"]
        assert after["pending"] == 0 and after["embedded"] == after["chunks"] == first["chunks"]

    with_client(server, body)


def test_stale_flags_follow_edits(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    exact = build_server(settings_for(repo, {}))
    cached = build_server(settings_for(repo, {}, stale_check_s=30))

    async def before(client: Client) -> None:
        assert (await call_ok(client, "search_code", {"query": "invoice"}))["stale"] is False

    async def after(client: Client) -> None:
        found = await call_ok(client, "search_code", {"query": "invoice"})
        assert found["stale"] and found["stale_paths"] == ["src/billing/invoice.py", "src/new.py"]
        status = await call_ok(client, "get_stale_status")
        assert not status["up_to_date"] and not status["root_hash_match"] and status["stale_count"] == 2
        assert status["stale_files"] == [{"path": "src/billing/invoice.py", "change": "modified"},
                                         {"path": "src/new.py", "change": "added"}]
        ctx = await call_ok(client, "get_file_context", {"filepath": "src/billing/invoice.py"})
        assert ctx["stale"] and ctx["content"] == "def compute_invoice_total():\n    return 0\n"
        assert (await call_ok(client, "fuzzy_find", {"symbol_name": "format_currency"}))["stale"] is True

    async def watched(client: Client) -> None:
        await before(client)
        await anyio.sleep(1.0)  # the watcher starts after the first answer
        edit(repo)
        deadline = time.monotonic() + 20
        while not (await call_ok(client, "search_code", {"query": "invoice"}))["stale"]:
            assert time.monotonic() < deadline, "the file watcher never flagged the edit"
            await anyio.sleep(0.2)

    with_client(exact, before)
    with_client(cached, watched)
    with_client(exact, after)


def edit(repo: Path) -> None:
    (repo / "src" / "billing" / "invoice.py").write_text("def compute_invoice_total():\n    return 0\n")
    write_files(repo, {"src/new.py": "x = 1\n"})


def test_embedder_loads_on_first_semantic_query_only(shop: tuple[Path, dict[str, str]]) -> None:
    from ctxlake.tasks.embedders import FakeEmbedder

    server = build_server(settings_for(*shop))
    FakeEmbedder.reset_counters()

    async def body(client: Client) -> None:
        await call_ok(client, "search_code", {"query": "invoice", "search_type": "keyword"})
        await call_ok(client, "fuzzy_find", {"symbol_name": "render"})
        await call_ok(client, "get_file_context", {"filepath": "web/app.js", "include_related": True})
        assert FakeEmbedder.queries == 0
        await call_ok(client, "search_code", {"query": "invoice"})
        assert FakeEmbedder.queries == 1 and FakeEmbedder.texts_embedded == 0

    with_client(server, body)


def test_indexing_while_serving_needs_no_restart(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    repo = make_repo(PROJECT)
    (repo / ".ctx").mkdir()
    server = build_server(settings_for(repo, {}))

    async def body(client: Client) -> None:
        assert "not indexed yet" in await call_error(client, "search_code", {"query": "invoice"})
        assert (await call_ok(client, "get_stale_status"))["indexed"] is False
        assert cli("run", "index", cwd=repo).exit_code == 0
        found = await call_ok(client, "search_code", {"query": "invoice", "search_type": "keyword"})
        assert found["hits"][0]["path"] == "src/billing/invoice.py"

    with_client(server, body)


def test_answers_stay_bounded(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    """A 6,000-line file and 50 long hits: answers are trimmed or paged, never dumped."""
    body_lines = "".join(f"    invoice_total_{i} = compute(invoice, {i})  # {'x' * 200}\n" for i in range(60))
    files = {f"src/m{i:02}.py": f"def invoice_handler_{i}(invoice):\n{body_lines}    return invoice\n"
             for i in range(60)}
    files["src/huge.py"] = "".join(f"value_{i} = {i}  # {'y' * 80}\n" for i in range(6000))
    repo = make_repo(files)
    assert cli("run", "index", cwd=repo).exit_code == 0
    settings = settings_for(repo, {})
    server = build_server(settings)
    budget = settings.mcp.max_response_chars

    async def body(client: Client) -> None:
        result = await client.call_tool("search_code", {"query": "invoice total compute", "top_k": 50,
                                                        "budget_tokens": 20000})
        size = len(result.content[0].text) + len(json.dumps(result.structured_content))
        assert len(result.structured_content["hits"]) == 50 and size <= budget
        assert any("snippets shortened" in w for w in result.structured_content["warnings"])
        # The default token budget (2,000) keeps the first hits whole and says how many it left out.
        capped = await call_ok(client, "search_code", {"query": "invoice total compute", "top_k": 50})
        assert 1 <= len(capped["hits"]) < 50 and capped["omitted"] == 50 - len(capped["hits"])
        assert capped["tokens_used"] <= 2000 and [h["rank"] for h in capped["hits"]] == list(range(1, len(capped["hits"]) + 1))
        ctx = await call_ok(client, "get_file_context", {"filepath": "src/huge.py", "end_line": 6000})
        assert ctx["truncated"] and ctx["end_line"] < 6000 and ctx["next_start_line"] == ctx["end_line"] + 1
        assert 2 * len(ctx["content"]) <= budget
        nxt = await call_ok(client, "get_file_context", {"filepath": "src/huge.py", "start_line": ctx["next_start_line"]})
        assert nxt["content"].startswith(f"value_{ctx['end_line']} = ")
        text = (await client.read_resource("ctx://file/src/huge.py")).contents[0].text
        assert len(text) <= budget and "get_file_context(filepath='src/huge.py'" in text

    with_client(server, body)


@pytest.mark.slow
def test_index_codebase_only_when_allowed(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--allow-index exposes index_codebase; it starts `ctx run index` in its own process and returns."""
    from prefect.settings import PREFECT_API_URL

    # The child process talks to the session's test server instead of starting a second one on
    # the same database (which times out here).
    monkeypatch.setenv("PREFECT_API_URL", str(PREFECT_API_URL.value()))
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    edit(repo)
    server = build_server(settings_for(repo, {}), ServeOptions(allow_index=True))

    async def body(client: Client) -> None:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["index_codebase"].annotations.read_only_hint is False
        started = time.monotonic()
        answer = await call_ok(client, "index_codebase")
        assert answer["started"] and answer["pid"] and time.monotonic() - started < 5
        deadline = time.monotonic() + 240
        while not (status := await call_ok(client, "get_stale_status"))["up_to_date"]:
            assert time.monotonic() < deadline, Path(answer["log_file"]).read_text()[-2000:]
            await anyio.sleep(1.0)
        assert status["root_hash_match"]
        found = await call_ok(client, "search_code", {"query": "compute_invoice_total", "search_type": "keyword"})
        assert found["hits"][0]["snippet"].startswith("def compute_invoice_total():")

    with_client(server, body)


@pytest.mark.model
def test_real_model_semantic_search_over_mcp(
    make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled MiniLM answers a plain-English question; the server keeps torch to one thread."""
    import torch

    monkeypatch.setenv("CTX_EMBED_MODEL", "minilm")

    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    server = build_server(settings_for(repo, {}))
    threads_before = torch.get_num_threads()

    async def body(client: Client) -> None:
        found = await call_ok(client, "search_code", {
            "query": "add the tax rate to the sum of the invoice lines", "search_type": "semantic", "top_k": 3})
        assert found["hits"][0]["symbol"] == "compute_invoice_total"
        # Tools run on worker threads; torch's count is per thread, inherited by new threads.
        seen: list[int] = []
        worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        worker.start()
        worker.join()
        assert seen == [1]

    try:
        with_client(server, body)
    finally:
        torch.set_num_threads(threads_before)  # the test process keeps its own setting


def test_agents_and_added_sources_are_wired_into_the_server(
    tmp_path: Path, make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    repo = make_repo({"app.py": "def main():\n    return 'app'\n"})
    notes = tmp_path / "notes"
    write_files(notes, {"guide.md": "# Guide\n\nHow the app deploys.\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert cli("add", "notes", str(notes), cwd=repo).exit_code == 0
    settings = load_settings(repo, {"mcp": {"stale_check_s": 0}})

    async def without_agents(client: Client) -> None:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "ask_codebase" not in names
        listed = await call_ok(client, "list_sources")
        by_name = {s["name"]: s for s in listed["sources"]}
        assert by_name["notes"]["type"] == "local" and by_name["notes"]["origin"] == str(notes.resolve())
        assert by_name["notes"]["files"] == 1 and by_name["project"]["files"] == 1

    with_client(build_server(settings), without_agents)

    async def with_agents(client: Client) -> None:
        tool = {t.name: t for t in (await client.list_tools()).tools}["ask_codebase"]
        assert {"question", "sources"} <= set(tool.input_schema["properties"])

    with_client(build_server(settings, ServeOptions(allow_agents=True)), with_agents)


def test_graph_tools_answer_through_the_client(shop: tuple[Path, dict[str, str]]) -> None:
    """find_references / find_definition / related_files / file_outline over the shop's graph."""
    server = build_server(settings_for(*shop))

    async def body(client: Client) -> None:
        refs = await call_ok(client, "find_references", {"symbol": "compute_invoice_total"})
        assert [(r["path"], r["line"], r["kind"], r["enclosing"]) for r in refs["references"]] == [
            ("src/billing/invoice.py", 15, "call", "InvoicePrinter.render")]
        assert refs["references"][0]["snippet"].startswith("total = compute_invoice_total(")
        found = await call_ok(client, "find_definition", {"symbol": "UserRepository.getUserById"})
        first = found["definitions"][0]
        assert (first["path"], first["start_line"], first["kind"]) == ("src/users/service.py", 10, "method")
        assert first["doc"] == "Return the user with this id, or None." and found["confidence"] == 1.0
        outline = await call_ok(client, "file_outline", {"path": "web/app.js"})
        assert [(i["qualname"], i["depth"]) for i in outline["items"]] == [
            ("renderInvoice", 0), ("CartView", 0), ("CartView.constructor", 1), ("CartView.totalItems", 1)]
        related = await call_ok(client, "related_files", {"path": "src/billing/invoice.py"})
        assert related["related"] == []
        error = await call_error(client, "find_references", {"symbol": "noSuchThingAnywhere"})
        assert "unknown symbol" in error

    with_client(server, body)


def test_graph_tools_see_an_index_run_made_while_serving(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    """The server keeps its graph tables open: a file indexed after its first graph call is known
    to the next one (its outline, its imports), without a restart."""
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    server = build_server(settings_for(repo, {}))

    async def body(client: Client) -> None:
        assert (await call_ok(client, "file_outline", {"path": "web/app.js"}))["items"]
        assert "not in the index" in await call_error(client, "file_outline", {"path": "src/billing/tax.py"})
        write_files(repo, {"src/billing/tax.py": "from billing.invoice import compute_invoice_total\n\n\n"
                                                 "def tax_for(invoice):\n    return compute_invoice_total(invoice) * 0.2\n"})
        assert cli("run", "index", cwd=repo).exit_code == 0
        outline = await call_ok(client, "file_outline", {"path": "src/billing/tax.py"})
        assert [i["qualname"] for i in outline["items"]] == ["tax_for"]
        refs = await call_ok(client, "find_references", {"symbol": "compute_invoice_total"})
        assert "src/billing/tax.py" in {r["path"] for r in refs["references"]}

    with_client(server, body)

"""Hostile files in a real indexed project: a FIFO does not hang `ctx run index`, and the file
readers (docs_content, get_file_context, ctx://file) refuse links out, links into .git, FIFOs."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp_helpers import PROJECT, call_error, call_ok

from ctxlake.schemas.config import load_settings
from ctxlake.serve.mcp.server import build_server


@pytest.fixture
def indexed(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, tmp_path: Path) -> Path:
    repo = make_repo(PROJECT)
    os.mkfifo(repo / "src" / "pipe.py")  # left untracked: the scan sees it, and must not open it
    started = time.monotonic()
    result = cli("run", "index", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert time.monotonic() - started < 120
    (tmp_path / "outside.md").write_text("OUTSIDE-SECRET\n")
    return repo


def test_readers_refuse_swapped_links_and_fifos(indexed: Path, tmp_path: Path) -> None:
    repo = indexed
    service = repo / "src" / "users" / "service.py"
    service.unlink()
    service.symlink_to("../../.git/config")  # an indexed file replaced by a link into .git
    invoice = repo / "src" / "billing" / "invoice.py"
    invoice.unlink()
    os.mkfifo(invoice)  # an indexed file replaced by a FIFO
    (repo / "docs" / "out.md").symlink_to(tmp_path / "outside.md")
    server = build_server(load_settings(repo))

    async def main() -> None:
        async with Client(server) as client:
            started = time.monotonic()
            text = await call_error(client, "get_file_context", {"filepath": "src/users/service.py"})
            assert ".git" in text and "[core]" not in text, text
            text = await call_error(client, "get_file_context", {"filepath": "src/billing/invoice.py"})
            assert "FIFO" in text, text
            text = await call_error(client, "docs_content", {"path": "docs/out.md"})
            assert "outside" in text and "OUTSIDE-SECRET" not in text, text
            for uri in ["ctx://file/src/users/service.py", "ctx://file/src/billing/invoice.py"]:
                with pytest.raises(Exception) as info:
                    await client.read_resource(uri)
                assert "[core]" not in str(info.value)
            assert time.monotonic() - started < 10
            ok = await call_ok(client, "get_file_context", {"filepath": "web/app.js"})
            assert "renderInvoice" in ok["content"]

    anyio.run(main)


def test_an_absolute_filepath_with_a_nul_byte_or_a_link_loop_is_one_clear_error(indexed: Path, tmp_path: Path) -> None:
    """resolve() raised a bare ValueError (NUL) or RuntimeError (loop) for an absolute path: the
    tool said only "Error executing tool get_file_context", the prompt "Internal server error"."""
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    server = build_server(load_settings(indexed))

    async def main() -> None:
        async with Client(server) as client:
            text = await call_error(client, "get_file_context", {"filepath": f"{indexed}/web/app.js\0"})
            assert text.endswith("filepath contains a NUL byte"), text
            text = await call_error(client, "get_file_context", {"filepath": f"{tmp_path}/loop-a/x.py"})
            assert "symlink loop" in text, text
            with pytest.raises(MCPError) as info:
                await client.get_prompt("code_review", {"filepath": "/web/app.js\0"})
            assert "NUL byte" in info.value.error.message

    anyio.run(main)


def test_a_200k_character_query_answers_within_2_s(indexed: Path) -> None:
    """Query analysis was quadratic in the length of one token; the query is also cut to a bound."""
    server = build_server(load_settings(indexed))
    token = "a" * 200_000

    async def main() -> None:
        async with Client(server) as client:
            for tool, args in [("search_code", {"query": token, "search_type": "keyword"}),
                               ("search_code", {"query": "x(" * 100_000, "search_type": "keyword"}),
                               ("find_files", {"query": token})]:
                started = time.monotonic()
                result = await call_ok(client, tool, args)
                assert time.monotonic() - started < 2, tool
                assert any("only its first" in w for w in result["warnings"]), result["warnings"]
            started = time.monotonic()
            text = await call_error(client, "fuzzy_find", {"symbol_name": token})
            assert "at most 200" in text and time.monotonic() - started < 2

    anyio.run(main)


def test_add_refuses_system_and_home_folders(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"a.py": "x = 1\n"})
    home = tmp_path / "home"
    (home / "code").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for folder in ["/", "/proc", "/sys", "/dev", "/etc", "/proc/self", str(home), "~"]:
        result = cli("add", "x", folder, cwd=repo)
        assert result.exit_code == 2, (folder, result.stderr)
        assert "cannot be a source" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert cli("add", "code", str(home / "code"), cwd=repo).exit_code == 0


def test_cli_readers_apply_the_same_rules(indexed: Path, cli: Callable[..., Any]) -> None:
    """`ctx show` and `ctx docs` call the MCP readers' api functions: same refusals, one line each."""
    repo = indexed
    shown = cli("show", "src/billing/invoice.py", "--end", "2", cwd=repo)
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.splitlines()[:2] == (repo / "src/billing/invoice.py").read_text().splitlines()[:2]
    service = repo / "src" / "users" / "service.py"
    service.unlink()
    service.symlink_to("../../.git/config")
    invoice = repo / "src" / "billing" / "invoice.py"
    invoice.unlink()
    os.mkfifo(invoice)
    for args, message in [(("show", "src/users/service.py"), ".git/"), (("show", "src/billing/invoice.py"), "FIFO"),
                          (("show", "../etc/passwd"), "is outside the project"),
                          (("docs", "docs/../../x.md"), "path traversal"), (("docs", ".git/config"), "not inside a docs folder")]:
        result = cli(*args, cwd=repo)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and "[core]" not in result.stdout
    listing = cli("docs", "--json", cwd=repo)
    assert listing.exit_code == 0, listing.stderr
    assert any(d["path"].startswith("docs/") for d in json.loads(listing.stdout)["documents"])


def test_ctx_show_takes_a_place_as_search_and_refs_print_it(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    lines = "".join(f"line{i}\n" for i in range(1, 11))
    repo = make_repo({"app/mod.py": lines, "odd:3": "a file named like a place\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0

    def shown(typed: str, cwd: Path = repo) -> dict[str, Any]:
        result = cli("show", typed, "--json", cwd=cwd)
        assert result.exit_code == 0, (typed, result.stderr)
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer

    ranged = shown("app/mod.py:4-6")
    assert (ranged["path"], ranged["content"]) == ("app/mod.py", "line4\nline5\nline6\n")
    assert shown("mod.py:9", cwd=repo / "app")["content"] == "line9\nline10\n"  # from that line on
    assert shown("odd:3")["content"] == "a file named like a place\n"  # a real file of that name wins
    backwards = cli("show", "app/mod.py:6-4", cwd=repo)
    assert backwards.exit_code == 2 and "end_line 4 is before start_line 6" in backwards.stderr
    both = cli("show", "app/mod.py:4", "--start", "2", cwd=repo)  # the options decide: no place is read
    assert both.exit_code == 2 and "not an indexed file: 'app/mod.py:4'" in both.stderr


def test_ctx_show_reads_a_path_from_the_current_folder_and_still_from_the_root(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, tmp_path: Path) -> None:
    # `ctx show` read every path from the project root wherever it ran, unlike `ctx related` and
    # `ctx outline`: in app/, `ctx show util.py` showed the root's util.py, and `ctx show main.py`
    # was "not an indexed file".
    repo = make_repo({"util.py": "ROOT = 1\n", "app/util.py": "APP = 1\n", "app/main.py": "MAIN = 1\n",
                      "web/page.py": "PAGE = 1\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    app = repo / "app"

    def shown(path: str, cwd: Path) -> str:
        result = cli("show", path, "--json", cwd=cwd)
        assert result.exit_code == 0, (path, result.stderr)
        return str(json.loads(result.stdout)["path"])

    assert shown("util.py", app) == "app/util.py"  # the current folder's file comes first
    assert shown("main.py", app) == "app/main.py"
    assert shown("../web/page.py", app) == "web/page.py"
    assert shown(str(repo / "util.py"), app) == "util.py"
    assert shown("util.py", repo) == "util.py"
    # A project path typed in a subfolder, as `ctx show` took it before, still works.
    assert shown("web/page.py", app) == "web/page.py"
    assert shown("app/main.py", app) == "app/main.py"
    missing = cli("show", "nope.py", cwd=app)
    assert missing.exit_code == 2 and "not an indexed file: 'app/nope.py'" in missing.stderr, missing.stderr
    assert "nope.py was read from the current folder (as app/nope.py) and from the project root" in missing.stderr
    outside = tmp_path / "elsewhere.py"
    outside.write_text("x = 1\n")
    for path in (str(outside), "../../elsewhere.py"):
        refused = cli("show", path, cwd=app)
        assert refused.exit_code == 2, (path, refused.stderr)
        assert f"file {path!r} is outside the project {repo.resolve()}" in refused.stderr

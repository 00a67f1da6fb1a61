"""Sources and the code graph through the real CLI: two sources holding the same paths stay apart in
def/refs/outline/related/show/files, `ctx remove` takes a source's graph rows with it, and `ctx status`
keeps the project's last run apart from the sources' syncs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import git, write_files

from ctxlake.tasks.cochange import STATE_FILE
from ctxlake.tasks.lake import connect

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

PROJECT = {
    "app/ctx.py": "def project_helper():\n    return 1\n",
    "app/main.py": "from app.ctx import project_helper\n\nproject_helper()\n",
}
LIB = {
    "src/lib/adapters.py": 'class HTTPAdapter:\n    """Sends requests."""\n\n    def send(self, request):\n'
                           "        return request\n",
    "src/lib/api.py": "from lib.adapters import HTTPAdapter\n\n\ndef get(url):\n"
                      "    return HTTPAdapter().send(url)  # max_retries here\n",
}


def ok(result: Any) -> Any:
    assert result.exit_code == 0, result.stderr
    return result


def ok_json(result: Any) -> Any:
    return json.loads(ok(result).stdout)


def source_counts(project: Path) -> dict[str, dict[str, int]]:
    """table -> source -> rows, for every table of the lake with a source column."""
    db = connect(project / ".ctx" / "lake")
    out: dict[str, dict[str, int]] = {}
    for name in db.list_tables().tables:
        table = db.open_table(name)
        if "source" in table.schema.names and name != "index_runs":
            column = table.search().select(["source"]).limit(None).to_arrow().column("source").to_pylist()
            out[name] = {s: column.count(s) for s in set(column)}
    return out


@pytest.fixture
def project(make_repo: Callable[..., Path], cli: Callable[..., Any], tmp_path: Path) -> Path:
    """The project, indexed, with a local source `loc` and a git source `gitlib` holding the same files."""
    proj = make_repo(PROJECT, name="proj")
    lib = make_repo(LIB, name="lib")
    ok(cli("run", "index", cwd=proj))
    ok(cli("add", "loc", str(lib), cwd=proj))
    ok(cli("add", "gitlib", f"file://{lib}", cwd=proj))
    return proj


def test_graph_and_file_readers_keep_sources_apart(project: Path, cli: Callable[..., Any]) -> None:
    # The project by default: the library's class is in sources only, and the hint names them.
    missing = cli("def", "HTTPAdapter", cwd=project)
    assert missing.exit_code == 2 and "in the project" in missing.stderr
    assert "source 'gitlib', source 'loc'" in missing.stderr and "--source" in missing.stderr

    answer = ok_json(cli("def", "HTTPAdapter", "--source", "loc", "--json", cwd=project))
    assert [(d["source"], d["path"]) for d in answer["definitions"]] == [("loc", "src/lib/adapters.py")]
    assert answer["confidence"] == 1.0  # the other source's copy is not a rival definition
    line = ok(cli("def", "HTTPAdapter", "--source", "gitlib", cwd=project)).stdout
    assert line.startswith("[gitlib] src/lib/adapters.py:1\t")

    outline = ok_json(cli("outline", "src/lib/adapters.py", "--source", "loc", "--json", cwd=project))
    assert outline["source"] == "loc"
    assert [i["qualname"] for i in outline["items"]] == ["HTTPAdapter", "HTTPAdapter.send"]  # once each
    assert ok_json(cli("outline", "app/ctx.py", "--json", cwd=project))["source"] == "project"
    elsewhere = cli("outline", "src/lib/adapters.py", cwd=project)
    assert elsewhere.exit_code == 2 and "--source" in elsewhere.stderr

    # References carry their source, and their snippet is read from that source's folder (a clone for git).
    refs = ok_json(cli("refs", "HTTPAdapter", "--source", "gitlib", "--json", cwd=project))
    used = [r for r in refs["references"] if r["kind"] == "call"]
    assert used and {r["source"] for r in refs["references"]} == {"gitlib"}
    assert used[0]["snippet"] == "return HTTPAdapter().send(url)  # max_retries here"
    assert ok(cli("refs", "HTTPAdapter", "--source", "loc", cwd=project)).stdout.startswith("[loc] src/lib/")

    related = ok_json(cli("related", "src/lib/api.py", "--source", "loc", "--json", cwd=project))
    assert related["source"] == "loc" and [r["path"] for r in related["related"]] == ["src/lib/adapters.py"]

    # A source's file can be shown; the project's path space is the default.
    shown = ok_json(cli("show", "src/lib/adapters.py", "--source", "gitlib", "--json", cwd=project))
    assert shown["source"] == "gitlib" and "class HTTPAdapter" in shown["content"]
    refused = cli("show", "src/lib/adapters.py", cwd=project)
    assert refused.exit_code == 2 and "pass --source" in refused.stderr
    assert cli("show", "x.py", "--source", "nosuch", cwd=project).exit_code == 2

    # `ctx list` has the index's figures for each source, and lists the added sources only.
    listed = {s["name"]: s for s in ok_json(cli("list", "--json", cwd=project))["sources"]}
    assert set(listed) == {"loc", "gitlib"}
    assert listed["loc"]["embedded"] == listed["loc"]["chunks"] > 0
    assert listed["gitlib"]["languages"] == {"python": 2} and listed["gitlib"]["last_indexed"]

    files = ok(cli("files", "HTTPAdapter max_retries", "--mode", "keyword", cwd=project)).stdout
    assert "[gitlib] src/lib/api.py" in files and "[loc] src/lib/api.py" in files
    only = ok(cli("files", "HTTPAdapter", "--mode", "keyword", "--sources", "loc", cwd=project)).stdout
    assert "[loc]" in only and "[gitlib]" not in only


def test_remove_takes_every_per_source_row_and_status_keeps_the_projects_run(
    project: Path, cli: Callable[..., Any], tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    write_files(notes, {"app/ctx.py": "def injected_from_notes():\n    return 2\n"})
    git(notes, "init", "-q", "-b", "main")
    git(notes, "add", "-A")
    git(notes, "commit", "-qm", "one")
    write_files(notes, {"app/ctx.py": "def injected_from_notes():\n    return 3\n", "app/b.py": "from app.ctx import injected_from_notes\n\ninjected_from_notes()\n"})
    git(notes, "add", "-A")
    git(notes, "commit", "-qm", "two")  # a commit changing two files: co-change rows for the source
    project_run = ok_json(cli("status", "--json", cwd=project))["last_run"]
    assert project_run["source"] == "project"

    ok(cli("add", "mynotes", str(notes), cwd=project))
    status = ok_json(cli("status", "--json", cwd=project))
    assert status["last_run"] == project_run  # a source's sync is not the project's run
    assert status["source_runs"]["mynotes"]["source"] == "mynotes"
    assert "last sync mynotes" in ok(cli("status", cwd=project)).stdout
    counts = source_counts(project)
    for table in ("chunks", "files", "definitions", "refs", "imports", "cochange"):
        assert counts[table].get("mynotes"), (table, counts[table])
    # The same path in the project and the source: the outline shows the project's definitions only.
    assert [i["qualname"] for i in ok_json(cli("outline", "app/ctx.py", "--json", cwd=project))["items"]] \
        == ["project_helper"]

    ok(cli("remove", "mynotes", cwd=project))
    assert all("mynotes" not in by_source for by_source in source_counts(project).values())
    gone = cli("def", "injected_from_notes", "--source", "loc", cwd=project)
    assert gone.exit_code == 2 and "mynotes" not in gone.stderr
    assert "mynotes" not in json.loads((project / ".ctx" / "lake" / STATE_FILE).read_text())
    status = ok_json(cli("status", "--json", cwd=project))
    assert "mynotes" not in status["source_runs"] and status["last_run"] == project_run


def test_mcp_graph_tools_and_file_context_read_a_source_by_name(project: Path) -> None:
    """The MCP tools default to the project, as the CLI does, and take `source` for another."""
    import anyio
    from mcp import Client

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.mcp.server import build_server

    server = build_server(load_settings(project))

    async def call_ok(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
        result = await client.call_tool(name, args)
        assert not result.is_error, result.content
        return dict(result.structured_content or {})

    async def call_error(client: Client, name: str, args: dict[str, Any]) -> str:
        result = await client.call_tool(name, args)
        assert result.is_error
        return str(result.content[0].text)

    async def main() -> None:
        async with Client(server) as client:
            # The project defines no HTTPAdapter: the answer says which sources do.
            assert "source 'loc'" in await call_error(client, "find_definition", {"symbol": "HTTPAdapter"})
            theirs = await call_ok(client, "find_definition", {"symbol": "HTTPAdapter", "source": "loc"})
            assert [(d["path"], d["source"]) for d in theirs["definitions"]] == [("src/lib/adapters.py", "loc")]
            outline = await call_ok(client, "file_outline", {"path": "src/lib/adapters.py", "source": "gitlib"})
            assert [d["qualname"] for d in outline["items"]].count("HTTPAdapter") == 1 and outline["source"] == "gitlib"
            refs = await call_ok(client, "find_references", {"symbol": "HTTPAdapter", "source": "loc"})
            assert {r["path"] for r in refs["references"]} == {"src/lib/api.py"}
            shown = await call_ok(client, "get_file_context", {"filepath": "src/lib/api.py", "source": "loc"})
            assert "max_retries" in json.dumps(shown)
            assert "unknown source" in await call_error(client, "file_outline", {"path": "x.py", "source": "nope"})

    anyio.run(main)

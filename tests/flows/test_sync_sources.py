"""Sources end to end through the real CLI and Prefect: add, update, list, search across, remove, ask; git, local and web."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docsite import DocSite, Page, serve
from helpers import ctx_subprocess, git, write_files
from stub_agent import install_stub, read_record

from ctxlake.tasks.lake import CHUNKS_TABLE, FILES_TABLE, WriterLock, connect

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

LIB = {
    "libs/core/tools.py": 'def make_tool(name):\n    """Create a custom tool."""\n    return {"name": name}\n',
    "libs/core/graph.py": "class StateGraph:\n    def add_node(self, node):\n        return node\n",
    "libs/core/test_graph.py": "def test_graph():\n    assert True\n",
    "docs/tools.md": "# Tools\n\nUse make_tool to create a custom tool.\n\n## Naming\n\nNames are unique.\n",
    "tests/test_tools.py": "def test_tools():\n    assert True\n",
    "README.md": "# lib\n\nA library of tools.\n",
}
PROJECT = {"app/main.py": "from lib import make_tool\n\ntool = make_tool('search')\n"}


def rows(root: Path, table: str, columns: list[str], source: str | None = None) -> list[dict[str, Any]]:
    db = connect(root / ".ctx" / "lake")
    query = db.open_table(table).search()
    if source:
        query = query.where(f"source = '{source}'")
    out: list[dict[str, Any]] = query.select(columns).to_arrow().to_pylist()
    return out


def ok_json(result: Any) -> dict[str, Any]:
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture
def lib_remote(make_repo: Callable[..., Path], tmp_path: Path) -> tuple[Path, str]:
    work = make_repo(LIB, name="lib")
    bare = tmp_path / "lib.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return work, f"file://{bare}"


@pytest.fixture
def project(make_repo: Callable[..., Path]) -> Path:
    return make_repo(PROJECT, name="proj")


def push(work: Path, url: str, files: dict[str, str], message: str) -> None:
    write_files(work, files)
    git(work, "add", "-A")
    git(work, "commit", "-qm", message)
    git(work, "push", "-q", url.removeprefix("file://"), "main")


def test_git_source_add_search_update_only_changed(
    project: Path, lib_remote: tuple[Path, str], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    work, url = lib_remote
    assert cli("run", "index", cwd=project).exit_code == 0
    added = ok_json(cli("add", "lib", url, "--paths", "libs/core,docs", "--exclude", "**/test_*", "--json", cwd=project))
    report = added["sources"][0]
    assert report["status"] == "ok" and report["ref_kind"] == "default"
    assert report["resolved"] == git(work, "rev-parse", "HEAD")
    lib_paths = {r["path"] for r in rows(project, FILES_TABLE, ["path"], "lib")}
    assert lib_paths == {"libs/core/tools.py", "libs/core/graph.py", "docs/tools.md"}
    toml = (project / ".ctx" / "sources.toml").read_text()
    assert f'origin = "{url}"' in toml and 'paths = ["libs/core", "docs"]' in toml

    listed = ok_json(cli("list", "--json", cwd=project))["sources"]
    chunks = rows(project, CHUNKS_TABLE, ["id", "path", "text"], "lib")
    assert [(s["name"], s["files"], s["chunks"], s["status"]) for s in listed] == [("lib", 3, len(chunks), "ok")]
    human = cli("list", cwd=project)
    assert human.exit_code == 0 and "lib" in human.stdout and "default -> " + report["resolved"][:12] in human.stdout

    both = ok_json(cli("search", "make_tool", "--mode", "keyword", "--json", cwd=project))
    assert {h["source"] for h in both["hits"]} == {"project", "lib"}
    only = ok_json(cli("search", "make_tool", "--mode", "keyword", "--sources", "lib", "--json", cwd=project))
    assert only["hits"] and {h["source"] for h in only["hits"]} == {"lib"}
    unknown = cli("search", "make_tool", "--sources", "lib,nope", cwd=project)
    assert unknown.exit_code == 2 and "unknown source(s): nope" in unknown.stderr

    # Upstream changes one file: only its chunks are re-embedded.
    before = {r["id"]: r for r in chunks}
    push(work, url, {"docs/tools.md": LIB["docs/tools.md"].replace("unique", "unique per graph")}, "docs")
    fake_embedder.reset_counters()
    updated = ok_json(cli("update", "lib", "--json", cwd=project))["sources"][0]
    assert updated["resolved"] == git(work, "rev-parse", "HEAD") != report["resolved"]
    assert (updated["index"]["added"], updated["index"]["modified"], updated["index"]["removed"]) == (0, 1, 0)
    after = {r["id"]: r for r in rows(project, CHUNKS_TABLE, ["id", "path", "text"], "lib")}
    new_ids = set(after) - set(before)
    assert new_ids and {after[i]["path"] for i in new_ids} == {"docs/tools.md"}
    new_texts = {after[i]["text"] for i in new_ids} - {r["text"] for r in before.values()}
    assert fake_embedder.texts_embedded == len(new_texts) > 0

    fake_embedder.reset_counters()
    again = ok_json(cli("update", "--json", cwd=project))["sources"][0]
    assert again["status"] == "ok" and again["index"] is None and fake_embedder.texts_embedded == 0
    # Nothing new upstream is decided before Prefect starts: an unreachable API fails any flow.
    quick = ctx_subprocess("update", cwd=project, env={
        "PREFECT_API_URL": "http://127.0.0.1:9/api", "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"})
    assert quick.returncode == 0 and f"lib: up to date @ {updated['resolved'][:12]}" in quick.stdout, quick.stderr
    # The project's own no-op check is untouched by source runs.
    noop = cli("run", "index", cwd=project)
    assert noop.exit_code == 0 and "Up to date" in noop.stdout


def test_remove_deletes_rows_snapshot_and_unshared_clone(
    make_repo: Callable[..., Path], lib_remote: tuple[Path, str], cli: Callable[..., Any]
) -> None:
    _, url = lib_remote
    a = make_repo(PROJECT, name="a")
    b = make_repo(PROJECT, name="b")
    for proj in (a, b):
        ok_json(cli("add", "lib", url, "--json", cwd=proj))
    root_a = ok_json(cli("list", "--json", cwd=a))["sources"][0]["root"]
    assert root_a == ok_json(cli("list", "--json", cwd=b))["sources"][0]["root"]  # one shared clone
    snapshot = a / ".ctx" / "lake" / "manifest" / "lib.arrow"
    assert snapshot.is_file()

    removed = ok_json(cli("remove", "lib", "--json", cwd=a))
    assert removed["chunks"] > 0 and removed["files"] == 6 and removed["storage"] == "kept (another project uses it)"
    assert rows(a, CHUNKS_TABLE, ["id"], "lib") == [] and rows(a, FILES_TABLE, ["path"], "lib") == []
    assert not snapshot.exists() and "lib" not in (a / ".ctx" / "sources.toml").read_text()
    assert ok_json(cli("list", "--json", cwd=a))["sources"] == []
    assert Path(root_a).is_dir() and rows(b, CHUNKS_TABLE, ["id"], "lib")

    last = cli("remove", "lib", cwd=b)
    assert last.exit_code == 0 and "clone/pages deleted" in last.stdout
    assert not Path(root_a).exists()
    assert cli("remove", "lib", cwd=b).exit_code == 2


def test_failed_add_leaves_nothing_and_inputs_are_checked(
    project: Path, lib_remote: tuple[Path, str], cli: Callable[..., Any], tmp_path: Path, ctx_home: Path
) -> None:
    _, url = lib_remote
    # In a fresh process, as a user runs it: one error line with git's reason, no traceback.
    missing = ctx_subprocess("add", "gone", f"file://{tmp_path}/missing.git", cwd=project,
                             env={"CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"})
    assert missing.returncode == 9, missing.stderr
    errors = [ln for ln in missing.stderr.splitlines() if ln.startswith("ctx: error:")]
    assert errors == [f"ctx: error: cannot add gone: `git ls-remote` failed: '{tmp_path}/missing.git' "
                      "does not appear to be a git repository"]
    assert "Traceback" not in missing.stderr
    badpath = cli("add", "badpath", url, "--paths", "does/not/exist", cwd=project)
    assert badpath.exit_code == 9 and "--paths 'does/not/exist' not found" in badpath.stderr
    badref = cli("add", "lib", url, "--ref", "no-such-branch", cwd=project)
    assert badref.exit_code == 2 and "no branch or tag 'no-such-branch'" in badref.stderr
    assert "gone" not in (project / ".ctx" / "sources.toml").read_text()
    assert "badpath" not in (project / ".ctx" / "sources.toml").read_text()
    assert ok_json(cli("list", "--json", cwd=project))["sources"] == []
    assert not list((ctx_home / "sources" / "git").glob("*/tree"))
    assert cli("add", "../evil", url, cwd=project).exit_code == 2
    assert cli("add", "project", url, cwd=project).exit_code == 2
    assert cli("add", "web", "https://x.org/llms.txt", "--ref", "main", cwd=project).exit_code == 2
    held = WriterLock(project / ".ctx" / "lake", purpose="test holder").acquire()
    try:
        busy = cli("add", "lib2", url, cwd=project)
    finally:
        held.release()
    assert busy.exit_code == 5 and "lib2" not in (project / ".ctx" / "sources.toml").read_text()
    ok_json(cli("add", "lib", url, "--ref", "main", "--json", cwd=project))
    dup = cli("add", "lib", url, cwd=project)
    assert dup.exit_code == 2 and "already exists" in dup.stderr


def test_local_folder_and_docs_folder(project: Path, cli: Callable[..., Any], tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    write_files(notes, {"ideas.md": "# Ideas\n\nA graph of tools.\n", "script.py": "print('hi')\n",
                        "guide/setup.rst": "Setup\n=====\n\nInstall it.\n"})
    ok_json(cli("add", "notes", str(notes), "--json", cwd=project))
    ok_json(cli("add-docs", "notes-docs", str(notes), "--json", cwd=project))
    assert {r["path"] for r in rows(project, FILES_TABLE, ["path"], "notes")} == {"ideas.md", "script.py", "guide/setup.rst"}
    assert {r["path"] for r in rows(project, FILES_TABLE, ["path"], "notes-docs")} == {"ideas.md", "guide/setup.rst"}
    listed = {s["name"]: s for s in ok_json(cli("list", "--json", cwd=project))["sources"]}
    assert listed["notes"]["root"] == str(notes) and listed["notes-docs"]["docs"] is True
    # Indexed in place: an edit shows up on update, nothing was copied.
    (notes / "ideas.md").write_text("# Ideas\n\nA graph of tools and edges.\n")
    out = ok_json(cli("update", "notes", "--json", cwd=project))["sources"][0]
    assert out["index"]["modified"] == 1
    assert cli("remove", "notes", cwd=project).exit_code == 0 and (notes / "ideas.md").is_file()


def test_add_without_a_name_takes_it_from_the_origin(
        project: Path, cli: Callable[..., Any], tmp_path: Path, lib_remote: tuple[Path, str]) -> None:
    notes = tmp_path / "team notes"
    write_files(notes, {"ideas.md": "# Ideas\n\nA graph of tools.\n"})
    ok_json(cli("add", str(notes), "--json", cwd=project))
    ok_json(cli("add-docs", str(notes), "--json", cwd=project))
    ok_json(cli("add", lib_remote[1], "--json", cwd=project))
    listed = {s["name"]: s for s in ok_json(cli("list", "--json", cwd=project))["sources"]}
    assert set(listed) == {"team-notes", "team-notes-docs", "lib"}
    assert listed["team-notes"]["root"] == str(notes) and listed["team-notes-docs"]["docs"] is True
    again = cli("add", str(notes), cwd=project)
    assert again.exit_code == 2 and "source 'team-notes' already exists" in again.stderr
    assert "ctx add NAME ORIGIN" in again.stderr
    itself = cli("add", ".", cwd=project)
    assert itself.exit_code == 2 and "is the project itself" in itself.stderr

    # Sources came before the project's first run: status and search say the project is missing,
    # where they said "fresh yes" and "index may be behind: not indexed yet".
    status = ok_json(cli("status", "--json", cwd=project))
    assert status["stale"] is False and "project's own files are not indexed yet" in status["behind"]
    assert re.search(r"^fresh +no: the project's own files are not indexed", cli("status", cwd=project).stdout, re.M)
    found = ok_json(cli("search", "graph of tools", "--json", cwd=project))
    assert found["hits"] and any("only its sources" in w for w in found["warnings"])
    assert cli("run", "index", cwd=project).exit_code == 0
    assert ok_json(cli("status", "--json", cwd=project))["behind"] is None
    assert not ok_json(cli("search", "graph of tools", "--json", cwd=project))["warnings"]


@pytest.fixture
def site() -> Iterator[DocSite]:
    with serve(DocSite(pages={
        "/llms.txt": Page("# Demo\n\n> Demo docs.\n\n## Docs\n\n- [Tools](/docs/tools.md): tools\n"
                          "- [Missing](/docs/missing.md)\n", "text/plain"),
        "/docs/tools.md": Page("# Tools\n\nCall make_widget to build a widget.\n"),
    })) as running:
        yield running


def test_web_source_partial_is_reported_then_completes(project: Path, site: DocSite, cli: Callable[..., Any]) -> None:
    added = cli("add", "demo-docs", site.url("/llms.txt"), "--json", cwd=project)
    assert added.exit_code == 9 and "not every source synced: demo-docs (partial)" in added.stderr
    report = json.loads(added.stdout)["sources"][0]
    assert report["status"] == "partial" and "missing.md (HTTP 404)" in report["message"]
    listed = ok_json(cli("list", "--json", cwd=project))["sources"][0]
    assert listed["status"] == "partial" and listed["files"] == 2  # llms.md and docs/tools.md
    found = ok_json(cli("search", "make_widget", "--mode", "keyword", "--sources", "demo-docs", "--json", cwd=project))
    assert found["hits"][0]["path"] == "docs/tools.md"

    site.pages["/docs/missing.md"] = Page("# Missing no more\n\nmake_gadget lives here.\n")
    site.log.clear()
    done = ok_json(cli("update", "demo-docs", "--json", cwd=project))["sources"][0]
    assert done["status"] == "ok" and done["index"]["added"] == 1
    assert site.requests("/docs/tools.md") == [304]
    assert ok_json(cli("list", "--json", cwd=project))["sources"][0]["status"] == "ok"


def test_crashed_source_run_is_repaired_and_does_not_block_the_project(
    project: Path, lib_remote: tuple[Path, str], cli: Callable[..., Any]
) -> None:
    work, url = lib_remote
    assert cli("run", "index", cwd=project).exit_code == 0
    ok_json(cli("add", "lib", url, "--json", cwd=project))
    push(work, url, {"libs/core/tools.py": LIB["libs/core/tools.py"].replace("custom", "bespoke")}, "edit")

    from ctxlake.tasks.chunk_stage import chunk_files

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    # Killed after the clone moved and the run was journaled, before anything was written.
    with pytest.MonkeyPatch.context() as fault:
        fault.setattr(chunk_files, "fn", interrupted)
        fault.setattr(chunk_files, "_task", None)
        crashed = cli("update", "lib", cwd=project)
    chunk_files._task = None  # rebuild the Prefect task around the real function
    assert crashed.exit_code == 130
    # The project's fast no-op path, in a process that cannot start a flow, is not fooled.
    done = ctx_subprocess("run", "index", cwd=project, env={
        "PREFECT_API_URL": "http://127.0.0.1:9/api", "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"})
    assert done.returncode == 0 and "Up to date" in done.stdout, done.stderr
    # The next update redoes the source even though its clone is already at the new commit.
    repaired = ok_json(cli("update", "lib", "--json", cwd=project))["sources"][0]
    assert repaired["index"] is not None
    texts = [r for r in rows(project, CHUNKS_TABLE, ["path", "text", "vector"], "lib")]
    assert all(r["vector"] is not None for r in texts)
    tools = "".join(r["text"] for r in texts if r["path"] == "libs/core/tools.py")
    assert "bespoke" in tools and "custom" not in tools


def test_ask_and_chat_with_a_stub_agent(
    project: Path, lib_remote: tuple[Path, str], cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = lib_remote
    install_stub(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_RECORD", str(tmp_path / "record.json"))
    (project / ".ctx").mkdir(exist_ok=True)
    (project / ".ctx" / "config.toml").write_text(
        f'[agents]\ndefault_agent = "stub"\nsandbox_dir = "{tmp_path / "sandboxes"}"\npass_env = ["STUB_*"]\n\n'
        '[agents.commands]\nstub = "stub-agent {prompt_file}"\n\n'
        '[agents.chat_commands]\nstub = "stub-agent {prompt_file} --interactive"\n')
    assert cli("trust", cwd=project).exit_code == 0  # agent commands from the project file need it
    # No index yet: the agent still answers, and the user learns how to give it search hits.
    bare = cli("ask", "-s", "project", "-q", "graph nodes?", cwd=project)
    assert bare.exit_code == 0, bare.stderr
    assert "no index yet; `ctx run index` builds one" in bare.stderr and "0 search hits" not in bare.stderr
    ok_json(cli("add", "lib", url, "--paths", "libs/core", "--json", cwd=project))

    answer = ok_json(cli("ask", "-s", "lib", "-q", "How do I create a custom tool?", "--json", cwd=project))
    assert answer["agent"] == "stub" and answer["answer"].strip() == "ANSWER from stub: see lib"
    assert answer["hits_in_prompt"] > 0
    seen = read_record(tmp_path / "record.json")
    assert list(seen["links"]) == ["lib"]
    assert seen["links"]["lib"]["files"] == ["libs/core/graph.py", "libs/core/test_graph.py", "libs/core/tools.py"]
    assert "## 1. lib/libs/core/tools.py:1-3 (make_tool)" in seen["prompt"]
    assert '"""Create a custom tool."""' in seen["prompt"]  # the chunk's full text, read from the clone
    assert not Path(seen["cwd"]).exists()

    plain = cli("ask", "-q", "graph nodes?", cwd=project)
    assert plain.exit_code == 0 and plain.stdout.strip() == "ANSWER from stub: see lib, project"
    typed = cli("ask", "graph nodes?", cwd=project)  # the question as an argument, as one would type it
    assert typed.exit_code == 0 and typed.stdout == plain.stdout
    assert read_record(tmp_path / "record.json")["prompt"].count("graph nodes?") >= 1
    for twice_or_never in (["ask", "x", "-q", "y"], ["ask"]):
        refused = cli(*twice_or_never, cwd=project)
        assert refused.exit_code == 2 and "give the question once" in refused.stderr
    assert cli("ask", "-s", "nope", "-q", "x", cwd=project).exit_code == 2
    monkeypatch.setenv("STUB_MODE", "fail")
    failed = cli("ask", "-s", "lib", "-q", "x", cwd=project)
    assert failed.exit_code == 10 and "partial answer" in failed.stdout
    assert "agent 'stub' exited with 3: stub: model quota exceeded" in failed.stderr
    missing = cli("ask", "-s", "lib", "-q", "x", "--agent", "codex", cwd=project)
    assert missing.exit_code == 10 and "runs `codex`, which is not on PATH" in missing.stderr

    monkeypatch.delenv("STUB_MODE")
    chat = cli("chat", "-s", "lib", cwd=project)
    assert chat.exit_code == 0
    seen = read_record(tmp_path / "record.json")
    assert seen["argv"][1:] == ["--interactive"] and "# Question" not in seen["prompt"]
    assert "| lib | git |" in seen["prompt"]


def test_removing_one_of_two_sources_of_one_origin_keeps_the_clone_the_other_reads(
    project: Path, lib_remote: tuple[Path, str], cli: Callable[..., Any]
) -> None:
    _, url = lib_remote
    for name in ("lib", "lib2"):
        ok_json(cli("add", name, url, "--json", cwd=project))
    removed = ok_json(cli("remove", "lib", "--json", cwd=project))
    assert removed["storage"] == "kept (source lib2 uses it)"
    shown = cli("show", "--source", "lib2", "libs/core/tools.py", cwd=project)
    assert shown.exit_code == 0 and "make_tool" in shown.stdout, shown.stderr
    last = ok_json(cli("remove", "lib2", "--json", cwd=project))
    assert last["storage"] == "deleted"


def test_a_cloned_sources_toml_reads_nothing_outside_the_project_until_trusted(
    make_repo: Callable[..., Path], cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed sources.toml is the repository author's: it synced /etc and /proc/self with exit 0.
    Now system folders are refused always, and outside folders wait for `ctx trust`."""
    monkeypatch.setenv("HOME", str(tmp_path / "userhome"))
    write_files(tmp_path, {"notes/n.md": "# Notes\n\nwidget notes\n", "userhome/private/p.md": "# Private\n\nwidget\n"})
    declared = ('[sources.etc]\ntype = "local"\norigin = "/etc"\n[sources.procsrc]\ntype = "local"\norigin = "/proc/self"\n'
                '[sources.relsrc]\ntype = "local"\norigin = "../notes"\n[sources.home]\ntype = "local"\norigin = "~/private"\n'
                '[sources.vendored]\ntype = "local"\norigin = "vendor/lib"\n')
    upstream = make_repo({**PROJECT, "vendor/lib/v.md": "# Vendored widget\n", ".ctx/sources.toml": declared},
                         name="upstream")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(upstream), str(clone))
    assert cli("run", "index", cwd=clone).exit_code == 0

    first = cli("update", "--json", cwd=clone / "app")
    assert first.exit_code == 9
    reports = {r["name"]: r for r in json.loads(first.stdout)["sources"]}
    assert {n: r["status"] for n, r in reports.items()} == {
        "etc": "failed", "procsrc": "failed", "relsrc": "failed", "home": "failed", "vendored": "ok"}
    assert "system folder" in reports["etc"]["message"] and "system folder" in reports["procsrc"]["message"]
    assert "not trusted" in reports["relsrc"]["message"] and "ctx trust" in reports["relsrc"]["hint"]
    for name in ("etc", "procsrc", "relsrc", "home"):
        assert rows(clone, FILES_TABLE, ["path"], name) == []
    status = ok_json(cli("status", "--json", cwd=clone))["config_trust"]
    assert status["untrusted_sources"] == ["etc", "procsrc", "relsrc", "home"] and "relsrc" in status["summary"]
    shown = cli("trust", "--show", cwd=clone)
    assert "sources.relsrc: local origin = '../notes'" in shown.stdout, shown.stdout

    trusted = cli("trust", cwd=clone)
    assert trusted.exit_code == 0 and "relsrc, home" in trusted.stdout, trusted.stderr
    # Relative to the project root (not the current folder), `~` expanded.
    again = cli("update", "--json", cwd=clone / "app")
    reports = {r["name"]: r for r in json.loads(again.stdout)["sources"]}
    assert reports["relsrc"]["status"] == reports["home"]["status"] == "ok"
    assert reports["relsrc"]["root"] == str((tmp_path / "notes").resolve())
    assert {r["path"] for r in rows(clone, FILES_TABLE, ["path"], "home")} == {"p.md"}
    assert reports["etc"]["status"] == "failed", "trust never opens a system folder"
    assert ok_json(cli("status", "--json", cwd=clone))["config_trust"]["untrusted_sources"] == []
    # A pull that points a trusted name elsewhere is untrusted again.
    registry = clone / ".ctx" / "sources.toml"
    registry.write_text(registry.read_text().replace('"../notes"', '"../userhome/private"'))
    moved = cli("update", "relsrc", "--json", cwd=clone)
    assert moved.exit_code == 9 and "not trusted" in json.loads(moved.stdout)["sources"][0]["message"]


# `ctx ARGS` in a fresh process, which then says on its last stderr line whether Prefect was imported.
WITHOUT_PREFECT = """
import sys
from ctxlake.serve.cli.app import run
code = run(sys.argv[1:])
print("prefect imported:", "prefect" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def test_update_refuses_untrusted_sources_before_starting_prefect(
    make_repo: Callable[..., Path], cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Refusing a source that a cloned sources.toml points outside the project started Prefect's
    temporary server first (seconds to tens of seconds): it is now decided before any flow."""
    write_files(tmp_path, {"notes/n.md": "# Notes\n\nwidget notes\n"})
    declared = ('[sources.relsrc]\ntype = "local"\norigin = "../notes"\n'
                '[sources.etc]\ntype = "local"\norigin = "/etc"\n')
    repo = make_repo({**PROJECT, ".ctx/sources.toml": declared}, name="cloned")
    done = subprocess.run([sys.executable, "-c", WITHOUT_PREFECT, "update", "--json"], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "prefect imported: False", done.stderr
    reports = {r["name"]: r for r in json.loads(done.stdout)["sources"]}
    assert {n: r["status"] for n, r in reports.items()} == {"relsrc": "failed", "etc": "failed"}
    assert "not trusted" in reports["relsrc"]["message"] and "ctx trust" in reports["relsrc"]["hint"]
    assert "system folder" in reports["etc"]["message"] and reports["etc"]["exit_code"] == 2
    listed = {s["name"]: s for s in ok_json(cli("list", "--json", cwd=repo))["sources"]}
    assert listed["relsrc"]["status"] == "failed" and "not trusted" in listed["relsrc"]["message"]


def test_add_refuses_a_system_folder_even_as_type_local(project: Path, cli: Callable[..., Any]) -> None:
    for origin in ("/etc", "/proc/self"):
        refused = cli("add", "sys", origin, "--type", "local", cwd=project)
        assert refused.exit_code == 2 and "system folder" in refused.stderr
    assert not (project / ".ctx" / "sources.toml").exists() or "sys" not in (project / ".ctx" / "sources.toml").read_text()


def test_a_committed_origin_through_a_git_remote_helper_runs_nothing(
        cli: Callable[..., Any], project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ext::CMD` makes git run CMD. A clone's sources.toml is the repository author's: it was
    taken for a remote (host:path) and reached `git ls-remote`, so only git's own default (ext
    disallowed) stood between it and a command; a git config that allows ext ran it."""
    planted = tmp_path / "planted"
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.ext.allow")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "always")
    added = cli("add", "ext", f"ext::sh -c touch% {planted}", cwd=project)
    assert added.exit_code == 2 and not planted.exists(), added.stderr
    write_files(project, {".ctx/sources.toml": f'[sources.ext]\ntype = "git"\norigin = "ext::sh -c touch% {planted}"\n'})
    updated = cli("update", "ext", cwd=project)
    assert updated.exit_code == 3 and "remote helper" in updated.stderr, updated.stderr  # the file is refused
    assert not planted.exists()
    # And git itself is told which transports a source may use, whatever its config says.
    from ctxlake.errors import SourceError
    from ctxlake.tasks.sources import run_git

    with pytest.raises(SourceError):
        run_git(["ls-remote", f"ext::sh -c touch% {planted}"], tmp_path, timeout=30)
    assert not planted.exists()


@pytest.mark.parametrize("origin", ["https://deploy:S3cr3tPassw0rd@example.org/docs/", "https://ghp_token@example.org/r.git",
                                    "ssh://git:pw@example.org/r.git"])
def test_an_origin_with_credentials_is_refused_and_stored_nowhere(
        cli: Callable[..., Any], project: Path, origin: str) -> None:
    """sources.toml is committed and `ctx list`, `ctx sql` and ask's prompt show the origin: a
    password (or a token as an http user name) in it would travel with all of them."""
    added = cli("add", "creds", origin, "--type", "web" if origin.endswith("/") else "git", cwd=project)
    assert added.exit_code == 2 and "holds credentials" in added.stderr, added.stderr
    secret = origin.split("//", 1)[1].split("@", 1)[0]
    assert secret not in added.stderr
    assert not (project / ".ctx" / "sources.toml").exists() or secret not in (project / ".ctx" / "sources.toml").read_text()


def test_an_ssh_user_name_alone_is_no_secret(cli: Callable[..., Any], project: Path) -> None:
    from ctxlake.schemas.sources import SourceSpec

    assert SourceSpec(name="r", type="git", origin="ssh://git@example.org/r.git").origin == "ssh://git@example.org/r.git"



@pytest.mark.parametrize("origin", ["file:///etc/passwd", "ftp://example.org/docs/"])
def test_a_web_source_that_is_not_http_is_refused_as_bad_input(cli: Callable[..., Any], project: Path, origin: str) -> None:
    added = cli("add", "w", origin, "--type", "web", cwd=project)
    assert added.exit_code == 2 and "needs an http:// or https:// URL" in added.stderr, added.stderr


def test_a_source_file_gone_from_disk_points_at_ctx_update(
        project: Path, lib_remote: tuple[Path, str], cli: Callable[..., Any]) -> None:
    _, url = lib_remote
    ok_json(cli("add", "lib", url, "--json", cwd=project))
    root = Path(ok_json(cli("list", "--json", cwd=project))["sources"][0]["root"])
    (root / "libs/core/tools.py").unlink()
    shown = cli("show", "--source", "lib", "libs/core/tools.py", cwd=project)
    assert shown.exit_code == 2 and "was deleted since the last index run" in shown.stderr
    assert "ctx update lib" in shown.stderr and "ctx run index" not in shown.stderr, shown.stderr

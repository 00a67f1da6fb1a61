"""The symbol graph through `ctx run index`: built with the chunks, replaced per edited file, gone
with a deleted file, readable with `ctx sql`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxlake.tasks.graph_store import DEFINITIONS_TABLE, IMPORTS_TABLE, REFERENCES_TABLE
from ctxlake.tasks.lake import connect

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

MAIN = "from app.util import parse\n\n\ndef run(text):\n    return parse(text)\n"
UTIL = "def parse(text):\n    \"\"\"Split on commas.\"\"\"\n    return text.split(',')\n"
OTHER = "function parse(s) { return s; }\nfunction go() { return parse('x'); }\n"


def rows(root: Path, table: str) -> list[dict[str, Any]]:
    db = connect(root / ".ctx" / "lake")
    out: list[dict[str, Any]] = db.open_table(table).to_arrow().to_pylist()
    return out


def of(root: Path, table: str, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(r.items())) for r in rows(root, table) if r["path"] == path)


def test_graph_rows_follow_edits_and_deletes_file_by_file(
    make_repo: Callable[..., Path], cli: Callable[..., Any]
) -> None:
    repo = make_repo({"app/main.py": MAIN, "app/util.py": UTIL, "web/p.js": OTHER})
    assert cli("run", "index", cwd=repo).exit_code == 0
    defs = {(r["path"], r["qualname"]): r for r in rows(repo, DEFINITIONS_TABLE)}
    assert defs[("app/util.py", "parse")]["doc"] == "Split on commas."
    assert ("web/p.js", "parse") in defs and ("app/main.py", "run") in defs
    calls = {(r["path"], r["line"], r["enclosing"]) for r in rows(repo, REFERENCES_TABLE)
             if r["name"] == "parse" and r["kind"] == "call"}
    assert calls == {("app/main.py", 5, "run"), ("web/p.js", 2, "go")}
    imports = {(r["path"], r["module"]): r["resolved"] for r in rows(repo, IMPORTS_TABLE)}
    assert imports[("app/main.py", "app.util")] == "app/util.py"
    # the cold run's optimize gave the read API its lookups: refs by name, imports by target
    db = connect(repo / ".ctx" / "lake")
    indexed = {t: {tuple(i.columns) for i in db.open_table(t).list_indices()}
               for t in (DEFINITIONS_TABLE, REFERENCES_TABLE, IMPORTS_TABLE)}
    assert ("name",) in indexed[REFERENCES_TABLE] and ("name",) in indexed[DEFINITIONS_TABLE]
    assert ("resolved",) in indexed[IMPORTS_TABLE]

    js_before = {t: of(repo, t, "web/p.js") for t in (DEFINITIONS_TABLE, REFERENCES_TABLE)}
    (repo / "app" / "util.py").write_text(UTIL.replace("def parse", "def parse_csv"))
    report = json.loads(cli("run", "index", "--json", cwd=repo).stdout)
    assert report["modified"] == 1
    util_defs = {r["qualname"] for r in rows(repo, DEFINITIONS_TABLE) if r["path"] == "app/util.py"}
    assert util_defs == {"parse_csv"}
    assert {t: of(repo, t, "web/p.js") for t in js_before} == js_before

    (repo / "web" / "p.js").unlink()
    assert cli("run", "index", cwd=repo).exit_code == 0
    for table in (DEFINITIONS_TABLE, REFERENCES_TABLE, IMPORTS_TABLE):
        assert all(r["path"] != "web/p.js" for r in rows(repo, table)), table
    assert any(r["path"] == "app/main.py" for r in rows(repo, REFERENCES_TABLE))

    result = cli("sql", "--json", "SELECT count(*) AS n FROM refs WHERE name = 'parse'", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == [[2]]  # the import and the call in main.py

    # More files than write_graph's small-batch path takes: the merge replaces their rows too.
    many = {f"pkg/m{i}.py": f"def f{i}():\n    return {i}\n" for i in range(12)}
    (repo / "pkg").mkdir()
    for name, text in many.items():
        (repo / name).write_text(text)
    assert cli("run", "index", cwd=repo).exit_code == 0
    for name in many:
        (repo / name).write_text((repo / name).read_text().replace("def f", "def g"))
    assert json.loads(cli("run", "index", "--json", cwd=repo).stdout)["modified"] == 12
    pkg = {(r["path"], r["qualname"]) for r in rows(repo, DEFINITIONS_TABLE) if r["path"].startswith("pkg/")}
    assert pkg == {(f"pkg/m{i}.py", f"g{i}") for i in range(12)}


def test_imports_of_untouched_files_follow_the_files_they_name(
    make_repo: Callable[..., Path], cli: Callable[..., Any]
) -> None:
    """An import kept pointing at a deleted file, and one naming a file added later stayed
    unresolved, until a forced run: only the edited files' rows were rewritten."""
    app = "from util import helper\nfrom later import later_fn\n\n\ndef main():\n    return helper(1) + later_fn()\n"
    repo = make_repo({"app.py": app, "util.py": "def helper(x):\n    return x\n", "other.py": "import json\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert sorted((r["module"], r["resolved"]) for r in rows(repo, IMPORTS_TABLE) if r["path"] == "app.py") == [
        ("later", None), ("util", "util.py")]
    (repo / "util.py").unlink()
    (repo / "later.py").write_text("def later_fn():\n    return 2\n")
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert sorted((r["module"], r["resolved"]) for r in rows(repo, IMPORTS_TABLE) if r["path"] == "app.py") == [
        ("later", "later.py"), ("util", None)]
    assert [(r["module"], r["resolved"]) for r in rows(repo, IMPORTS_TABLE) if r["path"] == "other.py"] == [
        ("json", None)]
    related = json.loads(cli("related", "app.py", "--json", cwd=repo).stdout)
    assert "util.py" not in json.dumps(related) and "later.py" in json.dumps(related)
    # A run with nothing added or removed stays a no-op.
    assert cli("run", "index", cwd=repo).exit_code == 0


def test_cli_graph_readers_answer_in_json_rank_ambiguity_and_page(
    make_repo: Callable[..., Path], cli: Callable[..., Any]
) -> None:
    repo = make_repo({"app/main.py": MAIN, "app/util.py": UTIL, "web/p.js": OTHER,
                      "app/more.py": "from app.util import parse\nparse('a')\nparse('b')\n"})
    assert cli("refs", "parse", cwd=repo).exit_code == 4  # not indexed yet
    assert cli("run", "index", cwd=repo).exit_code == 0

    answer = json.loads(cli("def", "parse", "--from", "app/main.py", "--json", cwd=repo).stdout)
    assert [d["path"] for d in answer["definitions"]] == ["app/util.py", "web/p.js"]
    assert answer["confidence"] == 0.9 and not answer["ambiguous"]
    blind = json.loads(cli("def", "parse", "--json", cwd=repo).stdout)
    # without an asking file, the file more files import wins, less surely
    assert blind["definitions"][0]["path"] == "app/util.py" and blind["confidence"] < 0.9

    first = json.loads(cli("refs", "parse", "--no-imports", "-n", "2", "--json", cwd=repo).stdout)
    assert first["total"] == 4 and first["next_offset"] == 2
    rest = json.loads(cli("refs", "parse", "--no-imports", "--offset", "2", "--json", cwd=repo).stdout)
    got = [(r["path"], r["line"], r["resolved"]) for r in first["references"] + rest["references"]]
    assert got == [("app/main.py", 5, True), ("app/more.py", 2, True), ("app/more.py", 3, True),
                   ("web/p.js", 2, True)]  # p.js defines a parse of its own
    assert first["references"][0]["snippet"] == "return parse(text)"
    assert first["references"][0]["enclosing"] == "run"

    unknown = cli("refs", "no_such_name", cwd=repo)
    assert unknown.exit_code == 2 and "unknown symbol" in unknown.stderr

    related = json.loads(cli("related", "app/util.py", "--json", cwd=repo).stdout)
    assert {(r["path"], r["relation"]) for r in related["related"]} == {
        ("app/main.py", "imported_by"), ("app/more.py", "imported_by")}
    outline = json.loads(cli("outline", "web/p.js", "--json", cwd=repo).stdout)
    assert [(i["qualname"], i["start_line"], i["depth"]) for i in outline["items"]] == [
        ("parse", 1, 0), ("go", 2, 0)]
    # a file with uses but no definitions is known (empty outline); an unindexed one is an input error
    assert json.loads(cli("outline", "app/more.py", "--json", cwd=repo).stdout)["items"] == []
    assert cli("related", "app/nope.py", cwd=repo).exit_code == 2
    # Defined but never used, and a file linked to nothing: a line that says so, not a blank answer.
    unused = cli("refs", "run", cwd=repo)
    assert unused.exit_code == 0 and unused.stdout == ""
    assert "no references to 'run' in the project; `ctx def` shows where it is defined" in unused.stderr
    alone = cli("related", "web/p.js", cwd=repo)
    assert alone.exit_code == 0 and alone.stdout == "" and "no related files for web/p.js" in alone.stderr


def test_graph_readers_read_a_path_from_the_current_folder_like_the_shell(
    make_repo: Callable[..., Path], cli: Callable[..., Any], tmp_path: Path
) -> None:
    # `ctx related` and `ctx outline` took paths from the root wherever they ran, unlike
    # `ctx remember --file` and every path a shell user types.
    repo = make_repo({"app/main.py": MAIN, "app/util.py": UTIL, "web/p.js": OTHER})
    assert cli("run", "index", cwd=repo).exit_code == 0
    app = repo / "app"
    related = json.loads(cli("related", "util.py", "--json", cwd=app).stdout)
    assert related["path"] == "app/util.py"
    assert {(r["path"], r["relation"]) for r in related["related"]} == {("app/main.py", "imported_by")}
    outline = json.loads(cli("outline", "../web/p.js", "--json", cwd=app).stdout)
    assert outline["path"] == "web/p.js" and [i["qualname"] for i in outline["items"]] == ["parse", "go"]
    assert json.loads(cli("def", "parse", "--from", "main.py", "--json", cwd=app).stdout)["confidence"] == 0.9
    assert json.loads(cli("def", "parse", "--from", "app/main.py", "--json", cwd=app).stdout)["confidence"] == 0.9
    # An asking file the index does not hold used to change nothing, silently.
    unknown = cli("def", "parse", "--from", "nope.py", cwd=app)
    assert unknown.exit_code == 2 and "ctx: error: app/nope.py is not in the index" in unknown.stderr, unknown.stderr
    # From the root a relative path is the project path, as before; an absolute one inside the root
    # is read from anywhere in it.
    assert json.loads(cli("related", "./app/util.py", "--json", cwd=repo).stdout)["path"] == "app/util.py"
    assert json.loads(cli("outline", str(app / "util.py"), "--json", cwd=app).stdout)["path"] == "app/util.py"
    outside = tmp_path / "elsewhere.py"
    outside.write_text("x = 1\n")
    for path in (str(outside), "../../elsewhere.py", ".."):
        for command in ("related", "outline"):
            refused = cli(command, path, cwd=app)
            assert refused.exit_code == 2, (command, path, refused.stderr)
            assert f"ctx: error: file {path!r} is outside the project {repo.resolve()}" in refused.stderr
    # A root-relative path typed in a subfolder is read from the root when the current folder has no
    # such file, as `ctx show` does; one found neither way says how it was read.
    assert json.loads(cli("outline", "web/p.js", "--json", cwd=app).stdout)["path"] == "web/p.js"
    assert json.loads(cli("related", "app/util.py", "--json", cwd=app).stdout)["path"] == "app/util.py"
    lost = cli("outline", "nope.py", cwd=app)
    assert lost.exit_code == 2 and "ctx: error: app/nope.py is not in the index" in lost.stderr
    assert "nope.py was read from the current folder (as app/nope.py) and from the project root" in lost.stderr


def test_graph_switched_off_empties_the_tables_and_readers_say_so(
    make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo({"app/main.py": MAIN, "app/util.py": UTIL})
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert rows(repo, DEFINITIONS_TABLE) and rows(repo, REFERENCES_TABLE)
    monkeypatch.setenv("CTX_INDEX_GRAPH", "false")
    (repo / "app" / "more.py").write_text("from app.util import parse\nparse('a')\n")
    assert cli("run", "index", cwd=repo).exit_code == 0
    for table in (DEFINITIONS_TABLE, REFERENCES_TABLE, IMPORTS_TABLE):
        assert rows(repo, table) == [], table
    refs = cli("refs", "parse", cwd=repo)
    assert refs.exit_code == 2 and "unknown symbol" in refs.stderr
    monkeypatch.setenv("CTX_INDEX_GRAPH", "true")
    assert cli("run", "index", "--force", cwd=repo).exit_code == 0
    assert {r["path"] for r in rows(repo, REFERENCES_TABLE) if r["name"] == "parse"} == {
        "app/main.py", "app/more.py"}

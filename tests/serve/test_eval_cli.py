"""`ctx eval` end to end: a real git repo with two commits, local and mirrored, tasks with known gold files."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import git, write_files

pytestmark = pytest.mark.usefixtures("prefect_server")

FIRST = {
    "billing/invoice.py": '''"""Invoices."""


def compute_invoice_total(lines, tax_rate):
    """Sum the invoice lines and add tax."""
    subtotal = sum(line["amount"] for line in lines)
    return round(subtotal * (1 + tax_rate), 2)


def format_currency(value):
    return f"${value:,.2f}"
''',
    "users/service.py": '''class UserRepository:
    """Stores users in a dict."""

    def __init__(self):
        self.rows = {}

    def getUserById(self, user_id):
        return self.rows[user_id]

    def save_user(self, user):
        self.rows[user["id"]] = user
''',
    "tests/test_invoice.py": '''from billing.invoice import compute_invoice_total


def test_compute_invoice_total_with_tax():
    assert compute_invoice_total([{"amount": 10}], 0.5) == 15
''',
    "README.md": "# shop\n\nInvoices, users and (later) shipping.\n",
}
SECOND = {
    "shipping/rates.py": '''RATES = {"standard": 4.5, "express": 12.0}


def shipping_rate_for(method, weight_kg):
    """The price of sending a parcel of this weight."""
    return RATES[method] * max(weight_kg, 1)
''',
}


@pytest.fixture
def shop(make_repo: Callable[..., Path]) -> tuple[Path, str, str]:
    """A repository with two commits: the second adds shipping/rates.py."""
    repo = make_repo(FIRST, name="shop")
    first = git(repo, "rev-parse", "HEAD")
    write_files(repo, SECOND)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "shipping")
    return repo, first, git(repo, "rev-parse", "HEAD")


def write_tasks(path: Path, lines: list[Any]) -> Path:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_eval_end_to_end(
    shop: tuple[Path, str, str], tmp_path: Path, cli: Callable[..., Any], fake_embedder: Any, ctx_home: Path
) -> None:
    repo, first, second = shop
    # The same repository as a bare mirror, named the way SWE-bench task files name it.
    mirrors = tmp_path / "mirrors"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(mirrors / "acme+shop" / "repo")], check=True)
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"instance_id": "invoice-tax", "repo": "shop", "base_commit": first, "gold_files": ["billing/invoice.py"],
         "problem_statement": "compute_invoice_total ignores tax_rate when the lines are empty"},
        {"instance_id": "user-lookup", "fetch_source": "github:acme/shop", "repo": "acme/shop",
         "base_commit": second, "gold_files": ["users/service.py"],
         "problem_statement": 'KeyError from the repository\nTraceback (most recent call last):\n'
                              '  File "/srv/app/users/service.py", line 8, in getUserById\n'
                              "    return self.rows[user_id]\nKeyError: 42\n"},
        {"instance_id": "shipping", "fetch_source": "github:acme/shop", "repo": "acme/shop",
         "base_commit": second, "gold_files": ["shipping/rates.py"],
         "problem_statement": "shipping_rate_for charges express parcels below one kilogram as one kilogram"},
        "{not json",
        {"instance_id": "no-gold", "repo": "shop", "base_commit": first, "problem_statement": "x"},
    ])
    report_file, markdown, chart = tmp_path / "out" / "report.json", tmp_path / "out" / "report.md", tmp_path / "out" / "chart.png"
    result = cli("eval", str(tasks), "--modes", "keyword,hybrid", "--mirrors", str(mirrors), "--json",
                 "--report", str(report_file), "--markdown", str(markdown), "--plot", str(chart), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == json.loads(report_file.read_text())
    assert report["tasks"] == 3
    assert report["skipped_lines"] == ["line 4: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
                                       "line 5: gold_files must be a non-empty list of paths"]
    assert "skipped line 4" in result.stderr and "[hash 3/3] shipping" in result.stderr

    runs = {(r["mode"], r["corpus"], r["variant"]): r for r in report["runs"]}
    assert set(runs) == {(m, c, "full") for m in ("keyword", "hybrid") for c in ("all", "non-test")}
    ranks = {(r["instance_id"], r["mode"], r["corpus"]): r["rank"] for r in report["results"]}
    # Each gold file is named by the query (a function it defines, a traceback frame): rank 1.
    assert set(ranks.values()) == {1}, ranks
    full = runs[("hybrid", "all", "full")]
    assert full["n"] == 3 and full["overall"]["acc@1"]["mean"] == 1.0 and full["overall"]["mrr"]["mean"] == 1.0
    assert set(full["per_repo"]) == {"shop", "acme/shop"} and full["per_repo"]["acme/shop"]["n"] == 2
    # Test files are outside the non-test corpus, and README.md outside the *.py corpus.
    for r in report["results"]:
        assert not any(p.startswith("tests/") for p in r["ranked"]) or r["corpus"] == "all"
        assert "README.md" not in r["ranked"]

    # Each commit was materialised once, as it was: shipping/ exists only in the second.
    trees = ctx_home / "eval" / "trees"
    assert (trees / f"shop@{first[:12]}" / "billing" / "invoice.py").is_file()
    assert not (trees / f"shop@{first[:12]}" / "shipping").exists()
    assert (trees / f"acme+shop@{second[:12]}" / "shipping" / "rates.py").is_file()
    assert sorted(r["reused"] for r in report["index"]) == [False, False, True]

    assert chart.read_bytes().startswith(b"\x89PNG")
    md = markdown.read_text()
    assert "| hash | hybrid | all | full | 3 | 100.0 |" in md and "## Per repository (non-test files)" in md

    # A second run indexes nothing and starts no flow: every lake is up to date.
    again = cli("eval", str(tasks), "--modes", "keyword", "--mirrors", str(mirrors), "--json", "--ablate",
                "--corpus", "all", cwd=tmp_path)
    assert again.exit_code == 0, again.stderr
    second_report = json.loads(again.stdout)
    assert all(r["reused"] for r in second_report["index"])
    variants = {r["variant"] for r in second_report["runs"]}
    assert {"full", "plain-bm25", "-symbol_evidence", "-path_evidence", "-test_weight", "+file_sum",
            "+import_neighbours", "+cochange", "-semantic_title"} <= variants
    # --ablate gave each task's lake its repository's history up to the base commit (for +cochange);
    # the first commit is a root commit, which brings files in and pairs nothing.
    states = [json.loads(f.read_text()) for f in (ctx_home / "eval" / "lakes").rglob("cochange.json")]
    assert [s["project"]["head"] for s in states] == [second]
    # The title line alone as the query (what an agent types); a one-line issue is its own title.
    title = cli("eval", str(tasks), "--modes", "keyword", "--mirrors", str(mirrors), "--json", "--corpus", "all",
                "--query", "title", cwd=tmp_path)
    assert title.exit_code == 0, title.stderr
    titled = json.loads(title.stdout)
    assert titled["query"] == "title" and second_report["query"] == "full"
    assert {r["instance_id"]: r["rank"] for r in titled["results"]}["invoice-tax"] == 1
    assert cli("eval", str(tasks), "--query", "summary", cwd=tmp_path).exit_code == 2
    human = cli("eval", str(tasks), "--modes", "keyword", "--mirrors", str(mirrors), "--corpus", "all",
                "--ablate", "-q", cwd=tmp_path)
    assert human.exit_code == 0 and "Ablation" in human.stdout and "plain-bm25" in human.stdout
    assert human.stderr == ""


def test_eval_errors_are_clear(shop: tuple[Path, str, str], tmp_path: Path, cli: Callable[..., Any],
                               fake_embedder: Any) -> None:
    repo, first, _ = shop
    missing = cli("eval", str(tmp_path / "nope.jsonl"), cwd=tmp_path)
    assert missing.exit_code == 2 and "no task file" in missing.stderr

    remote = write_tasks(tmp_path / "remote.jsonl", [
        {"fetch_source": "github:acme/elsewhere", "base_commit": first, "gold_files": ["a.py"],
         "problem_statement": "q"}])
    no_mirrors = cli("eval", str(remote), cwd=tmp_path)
    assert no_mirrors.exit_code == 2 and "no --mirrors folder was given" in no_mirrors.stderr
    (tmp_path / "m").mkdir()
    not_there = cli("eval", str(remote), "--mirrors", str(tmp_path / "m"), cwd=tmp_path)
    assert not_there.exit_code == 2 and "no git repository for github:acme/elsewhere" in not_there.stderr

    bad_commit = write_tasks(tmp_path / "commit.jsonl", [
        {"repo": str(repo), "base_commit": "0" * 40, "gold_files": ["a.py"], "problem_statement": "q"}])
    wrong = cli("eval", str(bad_commit), cwd=tmp_path)
    assert wrong.exit_code == 2 and f"commit {'0' * 40} is not in" in wrong.stderr

    option = write_tasks(tmp_path / "option.jsonl", [
        {"repo": str(repo), "base_commit": "--output=/tmp/x", "gold_files": ["a.py"], "problem_statement": "q"}])
    refused = cli("eval", str(option), cwd=tmp_path)
    assert refused.exit_code == 2 and "is not a commit hash" in refused.stderr

    empty = write_tasks(tmp_path / "empty.jsonl", ["", "[1, 2]"])
    nothing = cli("eval", str(empty), cwd=tmp_path)
    assert nothing.exit_code == 2 and "no usable task" in nothing.stderr and "line 2: not a JSON object" in nothing.stderr

    good = write_tasks(tmp_path / "good.jsonl", [
        {"repo": str(repo), "base_commit": first, "gold_files": ["billing/invoice.py"], "problem_statement": "q"}])
    bad_mode = cli("eval", str(good), "--modes", "keyword,magic", cwd=tmp_path)
    assert bad_mode.exit_code == 2 and "unknown mode(s) magic" in bad_mode.stderr


def test_files_ranks_the_file_an_issue_is_about(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    repo = make_repo({**FIRST, **SECOND})
    assert cli("run", "index", cwd=repo).exit_code == 0
    issue = ("Express parcels are overcharged\n"
             "shipping_rate_for('express', 0.2) returns 12.0 because max(weight_kg, 1) rounds up.")
    result = cli("files", issue, "--json", "-n", "3", cwd=repo)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["files"][0]["path"] == "shipping/rates.py" and data["files"][0]["symbol"] == "shipping_rate_for"
    assert len(data["files"]) <= 3 and data["mode"] == "hybrid"
    # A test file that calls the function ranks below its definition, and --no-tests drops it.
    tests = cli("files", "compute_invoice_total with tax", "--json", cwd=repo)
    paths = [f["path"] for f in json.loads(tests.stdout)["files"]]
    assert paths.index("billing/invoice.py") < paths.index("tests/test_invoice.py")
    no_tests = cli("files", "compute_invoice_total with tax", "--json", "--no-tests", cwd=repo)
    assert "tests/test_invoice.py" not in [f["path"] for f in json.loads(no_tests.stdout)["files"]]
    human = cli("files", issue, "--mode", "keyword", cwd=repo)
    assert human.exit_code == 0 and human.stdout.startswith(" 1. shipping/rates.py")
    bad = cli("files", "x", "--mode", "fuzzy", cwd=repo)
    assert bad.exit_code == 2 and "unknown --mode" in bad.stderr


def test_index_from_before_positions_is_rebuilt_by_the_next_run(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    """A lake whose BM25 index has no positions (an older ctxlake) still answers, says what is
    off, and the next `ctx run index` rebuilds it although no file changed."""
    from lancedb.index import FTS

    from ctxlake.tasks.lake import IndexState, connect

    repo = make_repo({**FIRST, **SECOND})
    assert cli("run", "index", cwd=repo).exit_code == 0
    lake_dir = repo / ".ctx" / "lake"
    chunks = connect(lake_dir).open_table("chunks")
    for column in ("text", "terms"):
        chunks.create_index(column, config=FTS(stem=False, remove_stop_words=False, with_position=False), replace=True)
    state = IndexState.read(lake_dir)
    assert state is not None
    state.fts = ""
    state.write(lake_dir)

    old = cli("files", "shipping_rate_for is wrong", "--json", cwd=repo)
    assert old.exit_code == 0, old.stderr
    data = json.loads(old.stdout)
    assert data["files"][0]["path"] == "shipping/rates.py"
    assert any("exact identifier matching is off" in w for w in data["warnings"])

    rebuilt = cli("run", "index", cwd=repo)
    assert rebuilt.exit_code == 0 and "Up to date" not in rebuilt.stdout
    new = json.loads(cli("files", "shipping_rate_for is wrong", "--json", cwd=repo).stdout)
    assert new["warnings"] == [] and new["files"][0]["path"] == "shipping/rates.py"
    assert "Up to date" in cli("run", "index", cwd=repo).stdout


def test_eval_of_a_local_folder_without_git(tmp_path: Path, cli: Callable[..., Any], fake_embedder: Any) -> None:
    project = tmp_path / "proj"
    write_files(project, {"pkg/rates.py": SECOND["shipping/rates.py"], "pkg/other.py": "def unrelated():\n    pass\n"})
    tasks = write_tasks(tmp_path / "local.jsonl", [
        {"repo_path": "proj", "query": "shipping_rate_for rounds the weight up", "gold_files": ["pkg/rates.py"]}])
    result = cli("eval", str(tasks), "--modes", "keyword", "--corpus", "all", "--json", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["results"][0]["rank"] == 1 and report["results"][0]["instance_id"] == "proj@worktree"
    assert not (project / ".ctx").exists()  # the lake lives in the eval cache, not in the folder


def test_two_evals_sharing_the_cache_index_a_tree_once(
    shop: tuple[Path, str, str], tmp_path: Path, fake_embedder: Any, ctx_home: Path
) -> None:
    """The second eval waits on the lake's writer lock, then finds the lake current: no row is
    appended twice (two evals indexing one tree at once doubled every row, and the next vector
    write failed on the duplicate ids)."""
    import os
    import sys

    from ctxlake.tasks.lake import connect

    repo, first, _ = shop
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"instance_id": "invoice-tax", "repo": str(repo), "base_commit": first,
         "gold_files": ["billing/invoice.py"], "problem_statement": "compute_invoice_total ignores tax_rate"}])
    ctx = Path(sys.executable).parent / "ctx"
    runs = [subprocess.Popen([str(ctx), "eval", str(tasks), "--modes", "keyword", "--corpus", "all", "--json", "-q"],
                             cwd=tmp_path, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outs = [run.communicate(timeout=600) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outs]
    reports = [json.loads(out) for out, _ in outs]
    assert sorted(r["index"][0]["reused"] for r in reports) == [False, True], [r["index"] for r in reports]
    assert all(r["failed_tasks"] == [] and r["runs"][0]["overall"]["acc@1"]["mean"] == 1.0 for r in reports)
    (lake,) = (ctx_home / "eval" / "lakes").glob("*/*/.ctx/lake")
    ids = connect(lake).open_table("chunks").to_arrow().column("id").to_pylist()
    assert ids and len(ids) == len(set(ids))

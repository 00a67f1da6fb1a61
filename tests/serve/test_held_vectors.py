"""Vectors held in memory by a long-lived reader (serve/api/vectors.py): the same answers as
LanceDB's flat scan, across edits, deletions, compaction and rows still waiting for vectors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import code_lake, code_search, ranked_lists
from ctxlake.tasks.store import open_for_write, optimize

QUERIES = ["parse the config file", "render a template", "open a socket", "sum of numbers", "retry later"]


WORDS = ["parse", "config", "file", "toml", "render", "template", "html", "open", "socket", "network", "sum",
         "numbers", "math", "retry", "later", "backoff", "cache", "lookup", "key", "store", "user", "session",
         "token", "queue", "worker", "thread"]


def files(n: int, tag: str = "") -> dict[str, str]:
    """`n` small modules, each on its own few words (so that distances differ) and the tag."""
    out = {}
    for i in range(n):
        words = " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(4))
        out[f"pkg/mod{i}.py"] = (f"def task_{i}{tag}(x):\n    '''{words} {tag}'''\n    return x * {i}\n\n\n"
                                 f"class Helper{i}{tag}:\n    '''{words.split()[0]} helper'''\n")
    return out


def semantic(lake: code_lake.Lake, query: str) -> list[tuple[str, int]]:
    result = code_search.search(lake, query, mode="semantic", limit=8, check_stale=False)
    return [(h.path, h.start_line) for h in result.hits]


def ranked(lake: code_lake.Lake, query: str) -> list[tuple[float, frozenset[tuple[str, int]]]]:
    """Every chunk by distance to the query, rows at the same distance as one group (equal
    distances may come in any order: LanceDB's follows how the rows were written)."""
    rows = ranked_lists.semantic_rows(lake, query, lake.chunks.count_rows(), None)
    groups: dict[float, set[tuple[str, int]]] = {}
    for row in rows:
        groups.setdefault(round(row["_distance"], 5), set()).add((row["path"], row["start_line"]))
    return [(d, frozenset(g)) for d, g in groups.items()]


def assert_same_as_lancedb(held: code_lake.Lake, settings: Any) -> None:
    plain = code_lake.Lake(settings)  # no vectors held: LanceDB's own scan
    assert held.flat is not None and held.flat.complete()
    for query in QUERIES:
        assert ranked(held, query) == ranked(plain, query), query
    assert held.flat.stats()["rows"] == held.chunks.count_rows()
    # Loaded, appended to or compacted, the matrix stays in the layout its scan is fast over.
    assert held.flat._snapshot is not None
    assert all(seg.matrix.flags.f_contiguous for seg in held.flat._snapshot.segments)
    # Hybrid reads the shown rows' columns after fusion: every hit complete, the same hits.
    everything = held.chunks.count_rows()
    for query in QUERIES[:2]:
        mine, theirs = (code_search.search(lake, query, mode="hybrid", limit=everything, check_stale=False).hits
                        for lake in (held, plain))
        assert {(h.path, h.start_line, h.symbol, h.snippet) for h in mine} == \
            {(h.path, h.start_line, h.symbol, h.snippet) for h in theirs}
    # ... and the answers above came from the matrix, not from a fallback to LanceDB.
    assert ranked_lists._held_nearest(held, held.embedder().embed_query(QUERIES[0]), 5) is not None


def test_held_vectors_answer_as_lancedb_across_edits_deletes_and_compaction(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    repo = make_repo(files(12))
    assert cli("run", "index", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    held = code_lake.Lake(settings)
    held.keep_vectors()
    assert_same_as_lancedb(held, settings)
    assert held.flat is not None
    loaded = held.flat.stats()

    # An edit, a deletion and a new file: the same Lake object follows the new table version,
    # reading only the added rows (a second segment) and masking the deleted ones.
    (repo / "pkg/mod3.py").write_text("def changed_three(y):\n    return y - 3\n")
    (repo / "pkg/mod7.py").unlink()
    (repo / "pkg/extra.py").write_text("def brand_new():\n    return 'new'\n")
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert_same_as_lancedb(held, settings)
    stats = held.flat.stats()
    assert stats["version"] > loaded["version"] and stats["segments"] == 2
    paths = {p for q in [*QUERIES, "brand new", "changed three"] for p, _ in semantic(held, q)}
    assert "pkg/mod7.py" not in paths and "pkg/extra.py" in paths

    # A run that adds a single chunk: its one-row block is read into a segment of its own (a
    # one-row array is in both memory orders at once: it must still be copied, not Arrow's buffer).
    (repo / "pkg/single.py").write_text("def lone_function():\n    return 1\n")
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert_same_as_lancedb(held, settings)
    assert held.flat.stats()["segments"] == 3

    # Compaction rewrites every row under a new id: the refresh reads the whole table again.
    optimize(open_for_write(settings.lake_dir, held.chunks.schema.field("vector").type.list_size), ann=False)
    assert_same_as_lancedb(held, settings)
    assert held.flat.stats()["segments"] == 1

    # A Lake that replaces this one (the service reopens after each index run) takes the vectors over.
    again = code_lake.Lake(settings)
    again.keep_vectors(like=held)
    assert again.flat is not None and again.flat.stats() == held.flat.stats()
    assert_same_as_lancedb(again, settings)


def test_rows_without_vectors_are_answered_by_lancedb_until_embedded(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    repo = make_repo(files(6))
    assert cli("run", "index", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    held = code_lake.Lake(settings)
    held.keep_vectors()
    assert held.flat is not None and held.flat.complete()

    for name, text in files(30, tag="more").items():
        (repo / name.replace("mod", "more")).write_text(text)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    # New rows without vectors: the matrix steps aside and the lake answers with what it has.
    assert not held.flat.complete()
    result = code_search.search(held, "pipeline step", mode="semantic", limit=50, check_stale=False)
    assert {h.path for h in result.hits} <= {f"pkg/mod{i}.py" for i in range(6)}
    assert any("embedded" in w for w in result.warnings)
    # A reader opened now does not load: the run recorded rows waiting for vectors.
    fresh = code_lake.Lake(settings)
    fresh.keep_vectors()
    assert fresh.flat is not None and not fresh.flat.complete()

    assert cli("run", "index", cwd=repo).exit_code == 0  # embeds the rest
    assert_same_as_lancedb(held, settings)
    assert fresh.flat.complete()
    assert_same_as_lancedb(fresh, settings)
    assert any(p.startswith("pkg/more") for q in QUERIES for p, _ in semantic(held, q))

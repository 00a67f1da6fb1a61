"""Indexes of the memory tables at scale, and the read side's queries over them.

A memory table gets an IVF_SQ index on its vectors once it holds enough of them; these tests use
a low threshold on small real LanceDB tables, and check what the read side (serve/api/context_search.py)
promises over an indexed table: the same answers as a flat scan within recall, every hit a narrow
filter allows, never a row without a vector, and BM25 over two columns ranked as one query would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from ctxlake.serve.api import context_search
from ctxlake.serve.api.context_search import _fts, _fts_columns, _vector
from ctxlake.serve.api.ranked_lists import sum_scores
from ctxlake.tasks import upkeep
from ctxlake.tasks.memory_store import ensure_vector_index, reset_vectors

DIMS = 32
ROWS = 3_000
WORDS = ["cache", "index", "retry", "timeout", "parser", "schema", "deploy", "lock", "token", "stream"]


def _table(tmp_path: Path, with_nulls: int = 0) -> lancedb.table.Table:
    """ROWS rows in 30 clusters over three projects; the last `with_nulls` rows have no vector."""
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((30, DIMS)).astype(np.float32)
    vectors = centres[rng.integers(0, 30, ROWS)] + 0.3 * rng.standard_normal((ROWS, DIMS)).astype(np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIMS)
    if with_nulls:
        mask = np.zeros(ROWS, dtype=bool)
        mask[-with_nulls:] = True
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIMS, mask=pa.array(mask))
    words = rng.integers(0, len(WORDS), (ROWS, 6))
    data = pa.table({
        "id": [f"m{i}" for i in range(ROWS)],
        "project_path": [f"/p{i % 3}" for i in range(ROWS)],
        "session_id": [f"s{i // 20}" for i in range(ROWS)],
        "text": [" ".join(WORDS[w] for w in row) for row in words],
        "terms": [f"Bash src/mod{i % 40}.py" if i % 4 == 0 else "" for i in range(ROWS)],
        "vector": column,
    })
    table = lancedb.connect(tmp_path / "lake").create_table("messages", schema=data.schema)
    table.add(data)  # as the store adds rows: null vectors are rows waiting for (or never given) one
    return table


def _flat(table: lancedb.table.Table, query: list[float], where: str | None, limit: int) -> list[str]:
    builder = table.search(query, vector_column_name="vector").distance_type("cosine").bypass_vector_index()
    if where:
        builder = builder.where(where, prefilter=True)
    return [r["id"] for r in builder.select(["id"]).limit(limit).to_list()]


def _has_vector_index(table: lancedb.table.Table) -> bool:
    return any(idx.columns == ["vector"] for idx in table.list_indices())


def test_vector_index_is_built_at_the_threshold_once(tmp_path: Path) -> None:
    table = _table(tmp_path)
    assert not ensure_vector_index(table, min_rows=ROWS + 1)
    assert not _has_vector_index(table)
    assert ensure_vector_index(table, min_rows=ROWS)
    assert _has_vector_index(table)
    assert not ensure_vector_index(table, min_rows=ROWS)  # already there: nothing rebuilt


def test_threshold_counts_vectors_not_rows(tmp_path: Path) -> None:
    table = _table(tmp_path, with_nulls=ROWS // 2)  # tool output rows have no vector
    assert not ensure_vector_index(table, min_rows=ROWS)
    assert ensure_vector_index(table, min_rows=ROWS // 2)


def test_indexed_search_matches_the_flat_scan(tmp_path: Path) -> None:
    table = _table(tmp_path)
    rng = np.random.default_rng(9)
    queries = [rng.standard_normal(DIMS).astype(np.float32).tolist() for _ in range(20)]
    truth = [_flat(table, q, "project_path IN ('/p1')", 10) for q in queries]
    assert ensure_vector_index(table, min_rows=1_000)
    found = [[r["id"] for r in _vector(table, q, "project_path IN ('/p1')", ["id"], 30)][:10] for q in queries]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth, strict=True)])
    assert recall >= 0.9, recall
    hits = _vector(table, queries[0], "project_path IN ('/p1')", ["id", "project_path"], 30)
    assert len(hits) == 30 and {h["project_path"] for h in hits} == {"/p1"}


def test_a_narrow_filter_still_gets_every_row_it_allows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _table(tmp_path)
    assert ensure_vector_index(table, min_rows=1_000)
    query = np.random.default_rng(2).standard_normal(DIMS).astype(np.float32).tolist()
    # One session's 20 rows, spread over the clusters: at most 4 of the 54 partitions hold only
    # some of them (the scale of 200 of 1,246 at 1.55M messages).
    monkeypatch.setattr(context_search, "ANN_PROBES", (2, 4))
    hits = _vector(table, query, "session_id = 's7'", ["id"], 30)
    assert sorted(h["id"] for h in hits) == sorted(_flat(table, query, "session_id = 's7'", 30))
    assert len(hits) == 20


def test_rows_without_a_vector_are_never_hits(tmp_path: Path) -> None:
    table = _table(tmp_path, with_nulls=500)
    nulls = {f"m{i}" for i in range(ROWS - 500, ROWS)}
    query = np.zeros(DIMS, dtype=np.float32).tolist()
    query[0] = 1.0
    flat = _vector(table, query, None, ["id"], 200)  # no index: a flat scan
    assert len(flat) == 200 and not {h["id"] for h in flat} & nulls
    assert ensure_vector_index(table, min_rows=1_000)
    # Rows added after the index, some without a vector, are scanned flat beside it.
    table.add(pa.table({"id": ["late-null", "late"], "project_path": ["/p0", "/p0"], "session_id": ["s-late"] * 2,
                        "text": ["cache", "cache"], "terms": ["", ""],
                        "vector": pa.array([None, query], pa.list_(pa.float32(), DIMS))}))
    indexed = [h["id"] for h in _vector(table, query, "project_path IN ('/p0')", ["id"], 200)]
    assert "late" in indexed[:3] and "late-null" not in indexed and not set(indexed) & nulls
    assert len(_vector(table, query, "session_id = 's-late'", ["id"], 30)) == 1


def test_reset_vectors_drops_the_index_trained_on_the_old_model(tmp_path: Path) -> None:
    table = _table(tmp_path)
    assert ensure_vector_index(table, min_rows=1_000)
    reset_vectors(table, 16)
    assert not _has_vector_index(table)
    assert not ensure_vector_index(table, min_rows=1_000)  # no vectors yet under the new model


@pytest.mark.parametrize("query", ["cache retry", "Bash mod4.py", "parser mod12.py"])
def test_two_column_keyword_search_ranks_as_one_multi_column_query(tmp_path: Path, query: str) -> None:
    from lancedb.index import FTS
    from lancedb.query import MultiMatchQuery

    table = _table(tmp_path)
    for column in ("text", "terms"):
        table.create_index(column, config=FTS(stem=False, remove_stop_words=False, with_position=False))
    assert _fts_columns(table) == {"text", "terms"}
    where = "project_path IN ('/p0')"
    merged = sum_scores([_fts(table, query, where, ["id"], ROWS, c) for c in ("text", "terms")], 25)
    one = (table.search(MultiMatchQuery(query, ["text", "terms"]), query_type="fts")  # type: ignore[call-arg]
           .where(where, prefilter=True).select(["id"]).limit(ROWS).to_list())
    scores = {r["id"]: r["_score"] for r in one}
    assert len(merged) == 25 and all(r["id"] in scores for r in merged)
    # The same top scores (row order among equal scores is the engine's).
    assert [round(scores[r["id"]], 4) for r in merged] == [round(r["_score"], 4) for r in one[:25]]


def test_compaction_merges_fragments_and_keeps_the_vector_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.tasks import memory_store

    monkeypatch.setattr(memory_store, "MEMORY_ANN_ROWS", 1_000)
    table = _table(tmp_path)
    assert ensure_vector_index(table, min_rows=1_000)
    for k in range(30):  # small ingests, each a fragment
        table.add(pa.table({"id": [f"late{k}"], "project_path": ["/p0"], "session_id": ["s-late"], "text": ["cache"],
                            "terms": [""], "vector": pa.array([[0.1] * DIMS], pa.list_(pa.float32(), DIMS))}))
    assert table.stats()["fragment_stats"]["num_fragments"] > 24
    memory_store.index_and_optimize.fn([table])
    assert table.stats()["fragment_stats"]["num_fragments"] <= 2
    assert _has_vector_index(table)
    assert "late7" in {h["id"] for h in _vector(table, [0.1] * DIMS, "session_id = 's-late'", ["id"], 30)}


def _data_files(table: lancedb.table.Table) -> dict[int, list[str]]:
    return {f.fragment_id: [d.path for d in f.data_files()] for f in table.to_lance().get_fragments()}


def test_compaction_rewrites_the_new_fragments_only_and_folds_index_deltas(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small ingests compacted again and again: the first rows' file is never rewritten (LanceDB's
    optimize rewrote it every time), and every index still finds every row, before and after the
    deltas are folded."""
    from ctxlake.tasks import memory_store

    monkeypatch.setattr(memory_store, "MEMORY_ANN_ROWS", 1_000)
    monkeypatch.setattr(upkeep, "SMALL_FRAGMENT_ROWS", 1_000)  # the first 3,000 rows are a big fragment
    table = _table(tmp_path)
    memory_store.index_and_optimize.fn([table], force=True)  # BM25, scalar and vector indexes, as after a cold ingest
    assert _has_vector_index(table)
    first = _data_files(table)
    assert len(first) == 1
    rng = np.random.default_rng(9)
    late: dict[str, list[float]] = {}
    deltas = []
    for k in range(upkeep.INDEX_DELTAS * 2):
        for j in range(memory_store.OPTIMIZE_FRAGMENTS["messages"]):  # one small ingest each
            key = f"late{k}-{j}"
            late[key] = rng.standard_normal(DIMS).astype(np.float32).tolist()
            table.add(pa.table({"id": [key], "project_path": ["/p9"], "session_id": [f"s-late{k}"],
                                "text": [f"zebra{k}x{j} rollout"], "terms": [""],
                                "vector": pa.array([late[key]], pa.list_(pa.float32(), DIMS))}))
        assert memory_store.optimize_due(table)
        assert memory_store.index_and_optimize.fn([table]) == ["messages"]
        assert memory_store.new_fragments(table) == 0 and not memory_store.optimize_due(table)
        files = _data_files(table)
        assert files.get(0) == first[0], "the first fragment was rewritten"
        assert len(files) <= 1 + upkeep.INDEX_DELTAS + 1
        deltas.append(max(s.num_indices for s in (table.index_stats(i.name) for i in table.list_indices()) if s))
    # Deltas pile up to INDEX_DELTAS and are folded back into one index each.
    assert max(deltas) == upkeep.INDEX_DELTAS and 1 in deltas[upkeep.INDEX_DELTAS - 1:], deltas
    # Every row is still found by each kind of index.
    assert table.count_rows() == ROWS + len(late)
    for key in ("late0-0", f"late{upkeep.INDEX_DELTAS}-5", f"late{upkeep.INDEX_DELTAS * 2 - 1}-3"):
        assert table.search().where(f"id = '{key}'").select(["id"]).to_list()[0]["id"] == key
        k, j = key[4:].split("-")
        assert [h["id"] for h in _fts(table, f"zebra{k}x{j}", None, ["id"], 5, "text")] == [key]
        assert _vector(table, late[key], "project_path IN ('/p9')", ["id"], 1)[0]["id"] == key
    assert _fts(table, "cache", "project_path IN ('/p0')", ["id"], 5000, "text")


def test_compaction_drops_deleted_rows_from_big_fragments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions are updated in place (a delete and an add): an old fragment that has lost a share of
    its rows is rewritten without them at the next compaction, and nothing else is lost."""
    from ctxlake.tasks import memory_store

    monkeypatch.setattr(upkeep, "SMALL_FRAGMENT_ROWS", 1_000)
    table = _table(tmp_path)
    memory_store.index_and_optimize.fn([table], force=True)
    table.delete("id IN (" + ", ".join(f"'m{i}'" for i in range(0, ROWS, 40)) + ")")  # under DELETED_SHARE
    upkeep.compact(table)
    assert [f.metadata.num_deletions for f in table.to_lance().get_fragments()] == [ROWS // 40]
    table.delete("id IN (" + ", ".join(f"'m{i}'" for i in range(0, ROWS, 4)) + ")")  # a quarter
    assert upkeep.compact(table)["fragments_merged"] == 1
    assert [f.metadata.num_deletions for f in table.to_lance().get_fragments()] == [0]
    assert table.count_rows() == ROWS - ROWS // 4
    assert table.search().where("id = 'm5'").select(["id"]).to_list()[0]["id"] == "m5"
    assert not table.search().where("id = 'm4'").select(["id"]).to_list()
    row = table.search().where("id = 'm5'").select(["text", "vector"]).to_list()[0]
    assert [h["id"] for h in _fts(table, row["text"], "id = 'm5'", ["id"], 5, "text")] == ["m5"]
    assert _vector(table, list(row["vector"]), None, ["id"], 1)[0]["id"] == "m5"


def test_a_table_without_a_vector_index_stays_at_a_few_fragments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions table has no vector index until it is large, so no deltas ever call for a full
    compaction: each one must still merge what the last ones left, not add a fragment each time."""
    from ctxlake.tasks import memory_store

    monkeypatch.setattr(memory_store, "MEMORY_ANN_ROWS", 10**9)
    monkeypatch.setattr(upkeep, "SMALL_FRAGMENT_ROWS", 1_000)
    table = _table(tmp_path)
    memory_store.index_and_optimize.fn([table], force=True)
    assert not _has_vector_index(table)
    first = _data_files(table)[0]
    for k in range(30):
        for j in range(memory_store.OPTIMIZE_FRAGMENTS["messages"]):
            table.add(pa.table({"id": [f"late{k}-{j}"], "project_path": ["/p9"], "session_id": [f"s-late{k}"],
                                "text": [f"zebra{k}x{j}"], "terms": [""], "vector": pa.array([None], pa.list_(pa.float32(), DIMS))}))
        assert memory_store.index_and_optimize.fn([table]) == ["messages"]
        files = _data_files(table)
        assert files[0] == first and len(files) <= 3, (k, len(files))
    assert [h["id"] for h in _fts(table, "zebra29x3", None, ["id"], 5, "text")] == ["late29-3"]


@pytest.mark.parametrize("copy_from", [None, 1_000], ids=["re-encoded", "pages copied"])
def test_a_cold_ingests_equal_batches_are_merged_when_the_indexes_are_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copy_from: int | None) -> None:
    """A cold ingest writes the history in equal batches, each a fragment; no later small ingest
    would merge fragments that size, so the run that builds the indexes merges them, once. Batches
    of BINARY_COPY_ROWS rows or more are merged by copying their pages, the short last one with them;
    the rows read the same."""
    import sys

    import lance  # noqa: F401  (loads lance.dataset)

    from ctxlake.tasks import memory_store

    optimizer = sys.modules["lance.dataset"].DatasetOptimizer
    original, modes = optimizer.compact_files, []

    def recorded(self: Any, **options: Any) -> Any:
        modes.append(options.get("compaction_mode"))
        return original(self, **options)

    monkeypatch.setattr(optimizer, "compact_files", recorded)
    if copy_from is not None:
        monkeypatch.setattr(upkeep, "BINARY_COPY_ROWS", copy_from)
    table = _table(tmp_path)
    rows = table.search().limit(ROWS).to_arrow()
    for k in range(5):  # five more batches the size of the first
        table.add(rows.set_column(0, "id", pa.array([f"b{k}-{i}" for i in range(ROWS)])))
    table.add(rows.slice(0, 100).set_column(0, "id", pa.array([f"last{i}" for i in range(100)])))  # the remainder
    assert len(_data_files(table)) == 7
    assert memory_store.index_and_optimize.fn([table]) == ["messages"]
    assert len(_data_files(table)) == 1 and table.count_rows() == 6 * ROWS + 100
    assert modes == ["reencode" if copy_from is None else "try_binary_copy"]
    assert memory_store.index_and_optimize.fn([table]) == []  # and not again
    row = table.search().where("id = 'b4-7'").select(["id", "text"]).to_list()[0]
    assert [h["id"] for h in _fts(table, row["text"], "id = 'b4-7'", ["id"], 5, "text")] == ["b4-7"]
    assert table.search().where("id = 'last99'").select(["id"]).to_list() == [{"id": "last99"}]


def test_one_big_ingest_is_due_by_its_rows_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single append of many rows is one new fragment, far below the fragment rule: compaction is
    still due once the rows outside the indexes reach OPTIMIZE_UNINDEXED_ROWS, and not before."""
    from ctxlake.tasks import memory_store

    table = _table(tmp_path)
    memory_store.index_and_optimize.fn([table], force=True)
    assert not memory_store.optimize_due(table)
    monkeypatch.setattr(memory_store, "OPTIMIZE_UNINDEXED_ROWS", 600)
    batch = table.search().limit(ROWS).to_arrow().slice(0, 599)
    table.add(batch.set_column(0, "id", pa.array([f"big{i}" for i in range(599)])))
    assert memory_store.new_fragments(table) == 1 and not memory_store.optimize_due(table)
    table.add(batch.slice(0, 1).set_column(0, "id", pa.array(["big599"])))
    assert memory_store.optimize_due(table)
    memory_store.index_and_optimize.fn([table])
    assert not memory_store.optimize_due(table)


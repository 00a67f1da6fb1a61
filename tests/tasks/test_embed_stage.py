"""The embed stage over a real lake: how many texts it hands the model per call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ctxlake.schemas.tables import chunks_schema
from ctxlake.tasks.embed import ENCODE_GROUP, embed_pending
from ctxlake.tasks.embed_cache import EmbeddingCache
from ctxlake.tasks.embedders import FakeEmbedder
from ctxlake.tasks.store import open_for_write


class _Recording(FakeEmbedder):
    def __init__(self, encode_group: int | None) -> None:
        super().__init__()
        self.encode_group = encode_group
        self.sizes: list[int] = []

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        self.sizes.append(len(texts))
        return super().embed_documents(texts)


def _lake_with_pending(tmp_path: Path, n: int, dims: int):  # type: ignore[no-untyped-def]
    tables = open_for_write(tmp_path / "lake", dims)
    texts = [f"def f{i}(x):\n    return x + {i}\n" for i in range(n)]
    tables.chunks.add(pa.table({
        "id": [f"c{i}" for i in range(n)], "source": ["project"] * n, "path": [f"m{i}.py" for i in range(n)],
        "lang": ["python"] * n, "kind": ["function"] * n, "symbol": [f"f{i}" for i in range(n)],
        "start_line": pa.array([1] * n, pa.int32()), "end_line": pa.array([2] * n, pa.int32()),
        "text": texts, "terms": [""] * n, "content_hash": [f"h{i}" for i in range(n)],
        "vector": pa.nulls(n, pa.list_(pa.float32(), dims)),
    }, schema=chunks_schema(dims)))
    return tables


def test_a_gpu_embedder_gets_its_own_group_size(tmp_path: Path) -> None:
    embedder = _Recording(encode_group=40)
    tables = _lake_with_pending(tmp_path, 100, embedder.dims)
    result = embed_pending.fn(tables, EmbeddingCache(tmp_path / "cache", embedder.model_id, embedder.dims), embedder)
    assert embedder.sizes == [40, 40, 20]
    assert result.embedded == 100 and tables.chunks.count_rows("vector IS NULL") == 0


def test_a_cpu_embedder_keeps_the_stage_default(tmp_path: Path) -> None:
    embedder = _Recording(encode_group=None)
    n = ENCODE_GROUP + 10
    tables = _lake_with_pending(tmp_path, n, embedder.dims)
    embed_pending.fn(tables, EmbeddingCache(tmp_path / "cache", embedder.model_id, embedder.dims), embedder)
    assert embedder.sizes == [ENCODE_GROUP, 10]


def test_the_cache_indexes_and_compacts_itself_as_it_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.tasks import embed_cache
    from ctxlake.tasks.store import fragment_count

    # The thresholds scaled down, the behaviour the same; appends of 200 count as big ones.
    for name, value in (("CACHE_INDEX_ROWS", 1000), ("CACHE_REINDEX_ROWS", 2000), ("CACHE_OPTIMIZE_FRAGMENTS", 40),
                        ("CACHE_CHECK_APPENDS", 4), ("FOLD_ROWS", 100)):
        monkeypatch.setattr(embed_cache, name, value)
    cache = EmbeddingCache(tmp_path / "cache", "fake:hash:8", 8)
    rng = np.random.default_rng(7)
    stored: dict[str, np.ndarray] = {}

    def append(i: int) -> None:
        hashes = [f"h{i}-{j}" for j in range(200)]
        vectors = rng.standard_normal((200, 8)).astype(np.float32)
        cache.put_many(hashes, vectors)
        stored.update(zip(hashes, vectors, strict=True))

    def index() -> Any:
        return next((idx for idx in cache.table.list_indices() if idx.columns == ["content_hash"]), None)

    for i in range(4):
        append(i)
    assert index() is None  # 800 rows: below CACHE_INDEX_ROWS
    for i in range(4, 20):
        append(i)
    # Indexed at 8 appends; rebuilt at 20, when 2,400 rows were outside it: no compaction yet.
    assert index() is not None and index().num_unindexed_rows == 0 and fragment_count(cache.table) == 20
    for i in range(20, 43):
        append(i)
    # Compacted at 40 fragments (into two: Lance keeps the rows indexed before apart from those
    # after), so only the three appends after that remain apart.
    assert fragment_count(cache.table) <= 2 + 3
    keys = list(stored)
    sample = [*keys[::97], *keys[-5:]]  # old rows and rows the index has not seen
    found = cache.get_many([*sample, "never-stored"])
    assert set(found) == set(sample)
    for h in sample:
        np.testing.assert_array_equal(found[h], stored[h])


def test_small_appends_wait_in_a_side_table_and_move_to_the_cache_in_bulk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduled ingest stores a few vectors per run; 800 such runs once left 1,807 fragments in
    the cache and made each lookup take up to a second. Small appends go to a side table now."""
    from ctxlake.tasks import embed_cache
    from ctxlake.tasks.store import fragment_count

    monkeypatch.setattr(embed_cache, "FOLD_ROWS", 500)
    monkeypatch.setattr(embed_cache, "RECENT_OPTIMIZE_FRAGMENTS", 4)
    cache = EmbeddingCache(tmp_path / "cache", "fake:hash:8", 8)
    rng = np.random.default_rng(3)
    stored: dict[str, np.ndarray] = {}
    for run in range(60):  # 60 runs of 30 vectors, each ending with the run's maintain()
        hashes = [f"r{run}-{j}" for j in range(30)]
        vectors = rng.standard_normal((30, 8)).astype(np.float32)
        cache.put_many(hashes, vectors)
        stored.update(zip(hashes, vectors, strict=True))
        cache.maintain()
        assert fragment_count(cache.recent) < 4 + 1 and cache.recent.count_rows() < 500 + 30
    assert cache.table.count_rows() + cache.recent.count_rows() == 1800
    assert cache.table.count_rows() >= 1500  # three folds of 510 rows
    assert fragment_count(cache.table) <= 3  # one fragment per fold, not one per run
    big = [f"big-{j}" for j in range(600)]  # a cold run's batch skips the side table
    cache.put_many(big, rng.standard_normal((600, 8)).astype(np.float32))
    assert cache.recent.count_rows() < 500 and cache.table.count_rows() >= 2100
    sample = [*list(stored)[::37], *list(stored)[-3:]]  # folded rows and rows still waiting
    found = cache.get_many([*sample, "never-stored", big[5]])
    assert set(found) == {*sample, big[5]}
    for h in sample:
        np.testing.assert_array_equal(found[h], stored[h])


class _Cheap(FakeEmbedder):
    cheap = True


def test_a_cheap_embedder_embeds_big_writes_before_they_are_stored(tmp_path: Path) -> None:
    """Any size of write, with the right vector on each row: new texts from the model (each content
    once), cached ones from the cache, nothing on rows that are not embedded (tool output)."""
    from ctxlake.schemas.tables import MESSAGES, with_vector_width
    from ctxlake.tasks.memory_store import (
        INLINE_EMBED_ROWS,
        MESSAGES_TABLE,
        embed_rows,
        embeds_inline,
    )

    embedder = _Cheap()
    dims = embedder.dims
    n = INLINE_EMBED_ROWS + 50
    texts = [f"message {i % (n - 10)} about retries" for i in range(n)]  # the last ten repeat earlier texts
    roles = ["tool" if i % 7 == 0 else "user" for i in range(n)]
    schema = with_vector_width(MESSAGES, dims)
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns.update({
        "id": pa.array([f"m{i}" for i in range(n)]), "tool": pa.array(["claude"] * n),
        "session_id": pa.array(["s"] * n), "project_path": pa.array([""] * n),
        "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")), "seq": pa.array(range(n), pa.int64()),
        "role": pa.array(roles), "kind": pa.array(["text"] * n), "text": pa.array(texts), "terms": pa.array([""] * n),
        "source_file": pa.array(["f"] * n), "content_hash": pa.array([f"h{t}" for t in texts]),
    })
    rows = pa.table(columns, schema=schema)
    assert embeds_inline(rows, embedder) and not embeds_inline(rows, FakeEmbedder())
    cache = EmbeddingCache(tmp_path / "cache", embedder.model_id, dims)
    cached_vector = np.full(dims, 1 / np.sqrt(dims), dtype=np.float32)
    cache.put_many([f"h{texts[1]}"], cached_vector[None, :])
    FakeEmbedder.reset_counters()
    out, encoded = embed_rows(rows, MESSAGES_TABLE, cache, embedder)
    wanted = [r != "tool" for r in roles]
    assert encoded == len({t for t, w in zip(texts, wanted, strict=True) if w} - {texts[1]})
    assert FakeEmbedder.texts_embedded == encoded
    vectors = out.column("vector").to_pylist()
    expected = FakeEmbedder().embed_documents(texts)
    for i, vec in enumerate(vectors):
        if texts[i] == texts[1]:  # row 1 and its repeat near the end
            np.testing.assert_allclose(vec, cached_vector, rtol=1e-6)
        elif wanted[i]:
            np.testing.assert_allclose(vec, expected[i], rtol=1e-5)
        else:
            assert vec is None, i
    assert out.schema == rows.schema


def _cache_rows(cache: EmbeddingCache) -> list[str]:
    return sorted(cache.table.to_arrow().column("content_hash").to_pylist()
                  + cache.recent.to_arrow().column("content_hash").to_pylist())


def test_forced_re_embeds_leave_one_cached_vector_per_content(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    tables = _lake_with_pending(tmp_path, 30, embedder.dims)
    cache = EmbeddingCache(tmp_path / "cache", embedder.model_id, embedder.dims)
    embed_pending.fn(tables, cache, embedder)
    before = _cache_rows(cache)
    assert before == sorted(f"h{i}" for i in range(30))
    for _ in range(2):  # `ctx run index --force` twice
        result = embed_pending.fn(tables, cache, embedder, use_cache=False, reembed_source="project")
        assert result.embedded == 30
    assert _cache_rows(cache) == before


def test_a_forced_re_embed_replaces_a_vector_that_changed(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    tables = _lake_with_pending(tmp_path, 5, embedder.dims)
    cache = EmbeddingCache(tmp_path / "cache", embedder.model_id, embedder.dims)
    stale = np.ones((1, embedder.dims), dtype=np.float32)
    cache.put_many(["h2"], stale)  # as if stored by other weights under the same model id
    embed_pending.fn(tables, cache, embedder, use_cache=False, reembed_source="project")
    expected = embedder.embed_documents(["def f2(x):\n    return x + 2\n"])[0]
    assert _cache_rows(cache) == sorted(f"h{i}" for i in range(5))
    np.testing.assert_allclose(cache.get_many(["h2"])["h2"], expected, atol=1e-6)


def _row_ids(tables) -> dict[str, int]:  # type: ignore[no-untyped-def]
    rows = tables.chunks.search().select(["id"]).with_row_id(True).limit(None).to_arrow()
    return dict(zip(rows.column("id").to_pylist(), rows.column("_rowid").to_pylist(), strict=True))


def test_a_forced_re_embed_rewrites_only_the_rows_whose_vector_changed(tmp_path: Path) -> None:
    """A rewritten row leaves the BM25 index until the next optimize (keyword queries scan it):
    a forced run must not rewrite the rows its model gives the same vector again."""
    from ctxlake.tasks.embed import write_vectors

    embedder = FakeEmbedder()
    tables = _lake_with_pending(tmp_path, 40, embedder.dims)
    cache = EmbeddingCache(tmp_path / "cache", embedder.model_id, embedder.dims)
    embed_pending.fn(tables, cache, embedder)
    write_vectors(tables.chunks, ["c7"], np.ones((1, embedder.dims), dtype=np.float32), embedder.dims)  # as if other weights
    tables.chunks.update(where="id = 'c9'", values={"vector": None})  # a row that lost its vector
    before = _row_ids(tables)
    result = embed_pending.fn(tables, cache, embedder, use_cache=False, reembed_source="project")
    after = _row_ids(tables)
    assert result.embedded == 40 and result.unchanged == 38
    assert {cid for cid in before if before[cid] != after[cid]} == {"c7", "c9"}
    stored = tables.chunks.search().where("id IN ('c7', 'c9')").select(["id", "text", "vector"]).to_list()
    for row in stored:
        np.testing.assert_allclose(row["vector"], embedder.embed_documents([row["text"]])[0], atol=1e-6)


def test_vectors_are_written_into_their_rows_through_the_id_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the index each write-back joined against the whole table (every column of every row
    in memory: the big repository's peak) and rewrote its rows, which left the BM25 index."""
    from lancedb.index import FTS

    embedder = FakeEmbedder()
    tables = _lake_with_pending(tmp_path, 40, embedder.dims)
    more = _lake_with_pending(tmp_path / "more", 40, embedder.dims).chunks.to_arrow()
    n = more.num_rows
    more = more.set_column(0, "id", pa.array([f"d{i}" for i in range(n)]))
    more = more.set_column(more.schema.get_field_index("text"), "text",
                           pa.array([f"def g{i}(y):\n    return y * {i}\n" for i in range(n)]))
    more = more.set_column(more.schema.get_field_index("content_hash"), "content_hash",
                           pa.array([f"g{i}" for i in range(n)]))
    tables.chunks.add(more)  # a second fragment
    tables.chunks.create_index("text", config=FTS())
    cache = EmbeddingCache(tmp_path / "cache", embedder.model_id, embedder.dims)
    before = _row_ids(tables)
    cache.put_many(["h3", "g5"], embedder.embed_documents(["def f3(x):\n    return x + 3\n",
                                                          "def g5(y):\n    return y * 5\n"]))
    # One window per fragment. (A window that begins in a fragment the previous write touched has
    # those rows rewritten: that write took the fragment out of the index, and Lance joins over
    # the fragments outside it.)
    monkeypatch.setattr("ctxlake.tasks.embed.WINDOW_ROWS", 40)
    result = embed_pending.fn(tables, cache, embedder)
    assert result.pending == 80 and result.from_cache == 2 and result.embedded == 78
    assert _row_ids(tables) == before  # each vector went into its row: no row was rewritten
    assert tables.chunks.count_rows("vector IS NULL") == 0
    indexes = {idx.columns[0]: idx for idx in tables.chunks.list_indices()}
    assert indexes["text"].num_unindexed_rows == 0  # still inside the BM25 index, before any optimize
    assert indexes["id"].index_type == "BTree"
    stored = tables.chunks.search().where("id IN ('c3', 'd17')").select(["text", "vector"]).to_list()
    assert len(stored) == 2
    for row in stored:
        np.testing.assert_allclose(row["vector"], embedder.embed_documents([row["text"]])[0], atol=1e-6)


def test_dedupe_keeps_one_row_per_hash_and_every_lookup(tmp_path: Path) -> None:
    dims = 8
    cache = EmbeddingCache(tmp_path / "cache", "m", dims)
    rng = np.random.default_rng(1)
    first = rng.standard_normal((50, dims)).astype(np.float32)
    hashes = [f"h{i}" for i in range(50)]
    cache.table.add(pa.Table.from_arrays([pa.array(["m"] * 50), pa.array(hashes),
                                          pa.FixedSizeListArray.from_arrays(pa.array(first.reshape(-1)), dims)],
                                         schema=cache.table.schema))
    for _ in range(2):  # what forced runs of older versions appended: the same hashes again
        again = first[:20] + 0.0
        cache.table.add(pa.Table.from_arrays([pa.array(["m"] * 20), pa.array(hashes[:20]),
                                              pa.FixedSizeListArray.from_arrays(pa.array(again.reshape(-1)), dims)],
                                             schema=cache.table.schema))
    assert cache.table.count_rows() == 90
    assert cache.dedupe() == 40
    assert sorted(cache.table.to_arrow().column("content_hash").to_pylist()) == sorted(hashes)
    found = cache.get_many(hashes)
    np.testing.assert_allclose(np.stack([found[h] for h in hashes]), first)
    assert cache.dedupe() == 0


def _damage(cache_dir: Path, how: str) -> None:
    """Break every table of the cache as a crash or a bad disk does."""
    for table in cache_dir.glob("*.lance"):
        if how == "truncate":
            for f in (table / "data").glob("*.lance"):
                with open(f, "r+b") as fh:
                    fh.truncate(500)
        else:
            for f in (table / "_versions").glob("*.manifest"):
                f.unlink()


@pytest.mark.parametrize("how", ["truncate", "no_manifest"])
def test_a_damaged_cache_is_moved_aside_and_a_fresh_one_used(tmp_path: Path, how: str) -> None:
    # A truncated data file made every lookup raise, in every project of the user: `ctx run index`
    # failed with a traceback and `--force` with "writing vectors failed".
    cache_dir = tmp_path / "embeddings"
    vectors = np.ones((3, 8), dtype=np.float32)
    EmbeddingCache(cache_dir, "fake:hash:8", 8).put_many(["a", "b", "c"], vectors)
    _damage(cache_dir, how)
    cache = EmbeddingCache(cache_dir, "fake:hash:8", 8)
    assert cache.get_many(["a", "b"]) == {}  # a miss, not an error
    moved = sorted(p.name for p in cache_dir.iterdir() if ".damaged-" in p.name)
    assert len(moved) == 2 and all(name.startswith("emb_") for name in moved)
    assert len(cache.warnings) == 1 and moved[0] in cache.warnings[0]
    assert ".rs:" not in cache.warnings[0]
    cache.put_many(["a"], vectors[:1])
    assert set(EmbeddingCache(cache_dir, "fake:hash:8", 8).get_many(["a", "b"])) == {"a"}


def test_a_cache_repaired_by_another_process_is_reopened_not_moved_again(tmp_path: Path) -> None:
    cache_dir = tmp_path / "embeddings"
    vectors = np.ones((2, 8), dtype=np.float32)
    EmbeddingCache(cache_dir, "fake:hash:8", 8).put_many(["a", "b"], vectors)
    _damage(cache_dir, "truncate")
    first = EmbeddingCache(cache_dir, "fake:hash:8", 8)
    second = EmbeddingCache(cache_dir, "fake:hash:8", 8)  # opened on the damaged tables too
    assert first.get_many(["a"]) == {}  # moves them aside
    second.put_many(["b"], vectors[:1])  # through its old handles: must land in the fresh table
    assert second.warnings == []
    assert len([p for p in cache_dir.iterdir() if ".damaged-" in p.name]) == 2
    assert set(EmbeddingCache(cache_dir, "fake:hash:8", 8).get_many(["a", "b"])) == {"b"}


def test_a_full_disk_is_not_taken_for_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.errors import LakeError

    cache_dir = tmp_path / "embeddings"
    cache = EmbeddingCache(cache_dir, "fake:hash:8", 8)

    def full(*_: Any, **__: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(cache.recent), "add", full)
    with pytest.raises(LakeError, match="No space"):
        cache.put_many(["a"], np.ones((1, 8), dtype=np.float32))
    assert not [p for p in cache_dir.iterdir() if ".damaged-" in p.name]

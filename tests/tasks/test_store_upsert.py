"""The chunk upsert over a real lake: new ids inserted, rows the batch no longer has deleted, kept
rows untouched, and the same batch written twice (a retry, or a run redoing a journaled batch)
changing nothing the second time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from ctxlake.schemas.tables import FILES, chunks_schema
from ctxlake.tasks.store import append_chunks, ensure_key_index, open_for_write, upsert

DIMS = 8


def _chunks(rows: list[tuple[str, str, str]]) -> pa.Table:
    """(id, path, text) -> CHUNKS rows without vectors."""
    n = len(rows)
    return pa.table({
        "id": [r[0] for r in rows], "source": ["project"] * n, "path": [r[1] for r in rows],
        "lang": ["python"] * n, "kind": ["function"] * n, "symbol": [r[0] for r in rows],
        "start_line": pa.array([1] * n, pa.int32()), "end_line": pa.array([2] * n, pa.int32()),
        "text": [r[2] for r in rows], "terms": [""] * n, "content_hash": [f"h-{r[0]}" for r in rows],
        "vector": pa.nulls(n, pa.list_(pa.float32(), DIMS)),
    }, schema=chunks_schema(DIMS))


def _files(paths: list[str]) -> pa.Table:
    n = len(paths)
    now = datetime.now(UTC)
    return pa.table({"source": ["project"] * n, "path": paths, "size": [1] * n, "mtime_ns": [1] * n,
                     "hash": [f"f-{p}" for p in paths], "lang": ["python"] * n,
                     "n_chunks": pa.array([1] * n, pa.int32()), "indexed_at": [now] * n}, schema=FILES)


def _rows(tables) -> dict[str, tuple[str, int]]:  # type: ignore[no-untyped-def]
    got = tables.chunks.search().select(["id", "path"]).with_row_id(True).limit(None).to_arrow()
    return {i: (p, r) for i, p, r in zip(got.column("id").to_pylist(), got.column("path").to_pylist(),
                                         got.column("_rowid").to_pylist(), strict=True)}


def test_an_upsert_inserts_new_ids_deletes_gone_ones_and_is_idempotent(tmp_path: Path) -> None:
    tables = open_for_write(tmp_path / "lake", DIMS)
    append_chunks(tables, _chunks([("a1", "a.py", "def a1"), ("a2", "a.py", "def a2"), ("b1", "b.py", "def b1"),
                                   ("c1", "c.py", "def c1")]), _files(["a.py", "b.py", "c.py"]))
    ensure_key_index(tables.chunks)
    before = _rows(tables)

    # a.py: a2 changed into a3; b.py removed; c.py untouched (not in the batch).
    batch = (_chunks([("a1", "a.py", "def a1"), ("a3", "a.py", "def a3 changed")]), _files(["a.py"]), ["a.py", "b.py"])
    assert upsert.fn(tables, "project", *batch) == (1, 2)
    after = _rows(tables)
    assert set(after) == {"a1", "a3", "c1"}
    assert after["a1"] == before["a1"] and after["c1"] == before["c1"]  # kept rows are not rewritten
    files = tables.files.search().select(["path"]).limit(None).to_arrow().column("path").to_pylist()
    assert sorted(files) == ["a.py", "c.py"]

    assert upsert.fn(tables, "project", *batch) == (0, 0)  # again: nothing to do
    assert _rows(tables) == after

    # Every chunk of a file gone: its rows go, other files' stay.
    assert upsert.fn(tables, "project", _chunks([]), _files([]), ["a.py"]) == (0, 2)
    assert set(_rows(tables)) == {"c1"}


def test_an_upsert_replaces_its_paths_file_rows_without_a_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FILES rows of the batch's paths are replaced (changed ones rewritten, removed ones gone) and
    the others kept, without a merge by (source, path), which joins the whole table."""
    tables = open_for_write(tmp_path / "lake", DIMS)
    append_chunks(tables, _chunks([("a1", "a.py", "def a1"), ("b1", "b.py", "def b1"), ("c1", "c.py", "def c1")]),
                  _files(["a.py", "b.py", "c.py"]))

    def no_merge(*args: object, **kwargs: object) -> None:
        raise AssertionError("the files table was merged")

    monkeypatch.setattr(tables.files, "merge_insert", no_merge)
    changed = _files(["a.py"]).set_column(4, "hash", pa.array(["f-a.py-v2"]))
    upsert.fn(tables, "project", _chunks([("a2", "a.py", "def a2")]), changed, ["a.py", "b.py"])
    got = tables.files.search().select(["path", "hash"]).limit(None).to_arrow().to_pylist()
    assert sorted((r["path"], r["hash"]) for r in got) == [("a.py", "f-a.py-v2"), ("c.py", "f-c.py")]

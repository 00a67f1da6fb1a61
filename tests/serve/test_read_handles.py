"""Long-lived read handles read a table's schema once per SCHEMA_MEMO_S, and see a changed one after."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest
from lancedb.table import LanceTable

from ctxlake.serve.api import handles


@pytest.fixture
def schema_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts LanceDB's own schema reads (each a round trip through its event loop)."""
    reads: list[int] = []
    real = LanceTable.schema.fget  # type: ignore[attr-defined]

    def counted(self: LanceTable) -> pa.Schema:
        reads.append(1)
        return real(self)

    monkeypatch.setattr(LanceTable, "schema", property(counted))
    return reads


def make_table(tmp_path: Path) -> LanceTable:
    db = lancedb.connect(str(tmp_path), read_consistency_interval=timedelta(0))
    rows = pa.table({"id": [f"c{i}" for i in range(50)], "text": [f"alpha beta {i}" for i in range(50)]})
    table = db.create_table("chunks", rows)
    table.create_fts_index("text")
    return db.open_table("chunks")  # type: ignore[return-value]


def test_queries_read_the_schema_once_per_interval(tmp_path: Path, schema_reads: list[int],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    plain = make_table(tmp_path)
    for _ in range(5):
        assert plain.search("alpha", query_type="fts").select(["id"]).limit(3).to_list()
    unmemoised = len(schema_reads)
    assert unmemoised >= 10  # what the memo saves: 2-4 reads per full-text query in lancedb 0.40

    schema_reads.clear()
    monkeypatch.setattr(handles, "SCHEMA_MEMO_S", 3600.0)
    table = handles.memo_schema(make_table(tmp_path / "other"))
    for _ in range(5):
        assert table.search("alpha", query_type="fts").select(["id"]).limit(3).to_list()
    assert len(schema_reads) == 1
    assert handles.memo_schema(None) is None


def test_a_changed_schema_is_seen_once_the_interval_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles, "SCHEMA_MEMO_S", 3600.0)
    reader = handles.memo_schema(make_table(tmp_path))
    assert reader.schema.names == ["id", "text"]
    writer = lancedb.connect(str(tmp_path)).open_table("chunks")
    writer.add_columns({"lang": "'python'"})
    assert reader.schema.names == ["id", "text"]  # within the interval: the memo
    monkeypatch.setattr(handles, "SCHEMA_MEMO_S", 0.0)
    assert reader.schema.names == ["id", "text", "lang"]
    assert reader.search("alpha", query_type="fts").select(["id", "lang"]).limit(1).to_list()[0]["lang"] == "python"


def test_the_legacy_index_check_runs_once_per_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    looks: list[int] = []
    real = LanceTable._get_fts_index_path

    def counted(self: LanceTable) -> Any:
        looks.append(1)
        return real(self)

    monkeypatch.setattr(LanceTable, "_get_fts_index_path", counted)
    monkeypatch.setattr(handles, "SCHEMA_MEMO_S", 3600.0)
    table = handles.memo_schema(make_table(tmp_path))
    looks.clear()  # creating the index looked too
    for _ in range(5):
        assert table.search("alpha", query_type="fts").select(["id"]).limit(3).to_list()
    assert len(looks) == 1
    # Once the interval has passed it looks again, and a legacy folder is still refused.
    (tmp_path / "chunks.lance" / "_indices" / "fts").mkdir(parents=True)
    monkeypatch.setattr(handles, "SCHEMA_MEMO_S", 0.0)
    with pytest.raises(ValueError, match="Legacy Tantivy"):
        table.search("alpha", query_type="fts").select(["id"]).limit(3).to_list()

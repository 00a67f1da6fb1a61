"""The index-run log: one INDEX_RUNS row per run, in a table that does not fragment without end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa

from ctxlake.schemas.tables import INDEX_RUNS_TABLE, chunks_schema
from ctxlake.tasks import run_log
from ctxlake.tasks.lake import connect
from ctxlake.tasks.store import fragment_count, open_for_write


def test_runs_are_recorded_and_their_table_compacted(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(run_log, "RUNS_COMPACT_FRAGMENTS", 8)
    lake = tmp_path / "lake"
    tables = open_for_write(lake, 4)
    tables.chunks.add(pa.table({
        "id": ["a", "b"], "source": ["project"] * 2, "path": ["m.py"] * 2, "lang": ["python"] * 2,
        "kind": ["function"] * 2, "symbol": ["f", "g"], "start_line": pa.array([1, 3], pa.int32()),
        "end_line": pa.array([2, 4], pa.int32()), "text": ["x", "y"], "terms": ["", ""],
        "content_hash": ["h1", "h2"], "vector": pa.array([[0.1] * 4, None], pa.list_(pa.float32(), 4)),
    }, schema=chunks_schema(4)))
    report = SimpleNamespace(added=1, modified=0, removed=0, seconds=0.1)
    for i in range(20):
        row = run_log.record_run(lake, tables, "project", report, pending_vectors=1 if i % 2 else None)
        assert row.column("embedded").to_pylist() == [1]  # counted, or the writer's pending count
    runs = connect(lake).open_table(INDEX_RUNS_TABLE)
    assert runs.count_rows() == 20
    assert fragment_count(runs) < 8

"""search_context reads the shown columns after fusion, for the rows shown (fill_hits): by row id,
and by id when a compaction moved a row meanwhile; a row deleted meanwhile is left out."""

from __future__ import annotations

from pathlib import Path

import lancedb
import pyarrow as pa

from ctxlake.serve.api.context_search import fill_hits


def _table(tmp_path: Path) -> lancedb.table.Table:
    db = lancedb.connect(str(tmp_path / "lake"))
    table = db.create_table("messages", pa.table({"id": [f"m{i}" for i in range(6)],
                                                  "text": [f"text {i}" for i in range(6)]}))
    table.add(pa.table({"id": ["m6", "m7"], "text": ["text 6", "text 7"]}))  # a second fragment
    return table


def _narrow(table: lancedb.table.Table, ids: list[str]) -> list[dict]:  # type: ignore[type-arg]
    rows = table.search().select(["id"]).with_row_id(True).to_list()
    by_id = {r["id"]: r for r in rows}
    return [{"id": f"message:{i}", "_rowid": by_id[i]["_rowid"], "_table": "message", "_type": "message"} for i in ids]


def test_rows_are_filled_by_row_id(tmp_path: Path) -> None:
    table = _table(tmp_path)
    rows = _narrow(table, ["m7", "m2", "m4"])
    fill_hits(rows, {"message": (table, ["id", "text"])})
    assert [(r["id"], r["text"]) for r in rows] == [("message:m7", "text 7"), ("message:m2", "text 2"),
                                                     ("message:m4", "text 4")]


def test_rows_moved_or_deleted_meanwhile(tmp_path: Path) -> None:
    table = _table(tmp_path)
    rows = _narrow(table, ["m7", "m2", "m4"])
    table.delete("id = 'm2'")
    table.optimize()  # compaction: the fragments are rewritten, the row ids change
    moved = {r["id"]: r["_rowid"] for r in table.search().select(["id"]).with_row_id(True).to_list()}
    assert moved["m7"] != rows[0]["_rowid"]
    fill_hits(rows, {"message": (table, ["id", "text"])})
    assert [(r["id"], r["text"]) for r in rows] == [("message:m7", "text 7"), ("message:m4", "text 4")]

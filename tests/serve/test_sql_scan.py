"""`ctx sql` over Lance tables read as the statement runs: the columns and tables it names, no others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from ctxlake.errors import LakeError
from ctxlake.schemas.tables import KNOWLEDGE
from ctxlake.serve.api.analytics import duck, run_sql
from ctxlake.tasks.lake import connect
from ctxlake.tasks.memory_store import KNOWLEDGE_TABLE


def _knowledge_with_its_body_apart(lake: Path) -> Path:
    """A knowledge table whose `body` column has a data file of its own (Lance's add_columns writes
    one beside the rows'); returns that file."""
    rows = [{"id": f"k{i}", "type": "decision", "title": f"decision {i}", "created_at": datetime(2026, 1, 1, tzinfo=UTC),
             "path": f".ctx/knowledge/decisions/k{i}.md", "text": f"decision {i}", "content_hash": f"{i:032x}",
             "vector": [0.5] * 4} for i in range(50)]
    without_body = KNOWLEDGE.remove(KNOWLEDGE.get_field_index("body"))
    table = connect(lake, create=True).create_table(KNOWLEDGE_TABLE, pa.Table.from_pylist(rows, schema=without_body))
    data = lake / f"{KNOWLEDGE_TABLE}.lance" / "data"
    before = set(data.glob("*.lance"))
    table.add_columns({"body": "repeat(title, 200)"})
    (body,) = set(data.glob("*.lance")) - before
    return body


def test_a_statement_reads_only_the_columns_it_names(tmp_path: Path) -> None:
    # Every table was read whole into memory before the statement ran: `SELECT count(*) FROM
    # messages` loaded every message's text. With the body's file cut short, only a statement that
    # reads the body can notice.
    lake = tmp_path / "lake"
    body = _knowledge_with_its_body_apart(lake)
    assert run_sql(lake, "SELECT max(length(body)) FROM knowledge")["rows"] == [[len("decision 10") * 200]]
    body.write_bytes(body.read_bytes()[:500])
    answer = run_sql(lake, "SELECT count(*), min(title) FROM knowledge WHERE type = 'decision'")
    assert answer["rows"] == [[50, "decision 0"]]
    with pytest.raises(LakeError, match="cannot be read") as damaged:
        run_sql(lake, "SELECT max(length(body)) FROM knowledge")
    assert damaged.value.hint == "`ctx run index --force` rebuilds it"


def test_the_views_are_the_lake_tables_with_vectors_only_when_asked(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _knowledge_with_its_body_apart(lake)
    con = duck(lake)
    assert con.sql("SHOW TABLES").fetchall() == [(KNOWLEDGE_TABLE,)]  # nothing else a statement could name
    assert "vector" not in [row[0] for row in con.sql("DESCRIBE knowledge").fetchall()]
    assert con.sql("SELECT count(*) FROM knowledge WHERE id = 'k7'").fetchall() == [(1,)]
    vectors = duck(lake, with_vectors=True).sql("SELECT vector FROM knowledge WHERE id = 'k7'").fetchall()
    assert vectors == [((0.5,) * 4,)]  # LanceDB stores it as a fixed-size list: a DuckDB ARRAY


def test_a_held_connection_follows_the_lake_and_outlives_the_versions_it_read(tmp_path: Path) -> None:
    """A notebook keeps its connection for hours while the service writes the lake: its views are
    bound again to the newest version, and the version they were made over may be gone by then."""
    lake = tmp_path / "lake"
    _knowledge_with_its_body_apart(lake)
    con = duck(lake)
    assert con.sql("SELECT count(*) FROM knowledge").fetchall() == [(50,)]
    table = connect(lake).open_table(KNOWLEDGE_TABLE)
    table.delete("id IN (" + ", ".join(f"'k{i}'" for i in range(0, 50, 2)) + ")")  # enough to rewrite the rest
    with pytest.warns(UserWarning):  # LanceDB's warning that older readers will fail: the point here
        table.optimize(cleanup_older_than=timedelta(0))  # the files of the versions before are deleted
    with pytest.raises(duckdb.Error, match=r"(?i)not found|no such file"):
        con.con.sql("SELECT count(*) FROM knowledge").fetchall()  # the view as it was bound
    assert con.sql("SELECT count(*) FROM knowledge").fetchall() == [(25,)]
    assert con.execute("SELECT count(*) FROM knowledge WHERE id IN ('k6', 'k7')").fetchall() == [(1,)]
    assert con.sql("SHOW TABLES").fetchall() == [(KNOWLEDGE_TABLE,)]
    assert "vector" not in [row[0] for row in con.sql("DESCRIBE knowledge").fetchall()]
    assert con.refresh() == []  # nothing written since
    with pytest.raises(duckdb.Error):
        con.sql("COPY knowledge TO 'out.csv'")  # still locked down

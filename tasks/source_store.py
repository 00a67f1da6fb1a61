"""Lake side of sources: SOURCES rows (last sync of each source) and removing a source's rows (CHUNKS, FILES,
the graph, COCHANGE) and snapshot."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctxlake.errors import CtxError, LakeError
from ctxlake.schemas.sources import SourceSpec
from ctxlake.schemas.tables import COCHANGE_TABLE, SOURCES
from ctxlake.tasks import freshness
from ctxlake.tasks.cochange import forget_history
from ctxlake.tasks.graph_store import DEFINITIONS_TABLE, IMPORTS_TABLE, REFERENCES_TABLE
from ctxlake.tasks.lake import CHUNKS_TABLE, FILES_TABLE, IndexState, connect, open_table
from ctxlake.tasks.merkle import snapshot_path
from ctxlake.tasks.stage import stage
from ctxlake.tasks.store import sql_str

SOURCES_TABLE = "sources"
# Every table keyed by source: removing a source empties each of them of its rows, or its symbols
# stay findable (`ctx def`, `ctx outline`) after `ctx remove`. INDEX_RUNS is history and keeps its rows.
PER_SOURCE_TABLES = (CHUNKS_TABLE, FILES_TABLE, DEFINITIONS_TABLE, REFERENCES_TABLE, IMPORTS_TABLE,
                     COCHANGE_TABLE)


@dataclass
class SyncReport:
    """What syncing one source did; printed by `ctx add` / `ctx update`."""

    name: str
    type: str
    origin: str
    status: str  # ok | partial | failed
    changed: bool = False  # something was re-indexed
    resolved: str | None = None
    ref_kind: str | None = None
    root: str | None = None
    message: str | None = None
    hint: str | None = None
    exit_code: int | None = None  # of the error that failed it (InputError 2, SourceError 9, ...)
    index: dict[str, Any] | None = None  # the index_code report, when it ran
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_sources(lake_dir: Path) -> dict[str, dict[str, Any]]:
    """SOURCES rows by name; empty when the lake or the table does not exist yet."""
    if not lake_dir.is_dir():
        return {}
    table = open_table(connect(lake_dir), SOURCES_TABLE)
    if table is None:
        return {}
    return {row["name"]: row for row in table.to_arrow().to_pylist()}


def source_roots(lake_dir: Path) -> dict[str, Path]:
    """Source name -> the folder its files were indexed from (a local folder, a clone, saved pages)."""
    return {name: Path(row["root"]) for name, row in read_sources(lake_dir).items() if row.get("root")}


def source_row(
    name: str, previous: dict[str, Any] | None, **values: Any
) -> dict[str, Any]:
    """A SOURCES row: the previous row of this source updated with `values` (times in UTC)."""
    now = datetime.now(UTC)
    row: dict[str, Any] = {f.name: None for f in SOURCES}
    row.update(previous or {})
    row.update(values)
    row["name"] = name
    row["added_at"] = row.get("added_at") or now
    row["paths"] = list(row.get("paths") or [])
    row["excludes"] = list(row.get("excludes") or [])
    return row


@stage("record-source")
def record_source(lake_dir: Path, row: dict[str, Any]) -> None:
    """One SOURCES row -> the lake's sources table (replacing that source's row)."""
    try:
        db = connect(lake_dir, create=True)
        # `is None`, not `or`: a LanceTable with no rows is falsy (it has __len__).
        table = open_table(db, SOURCES_TABLE)
        if table is None:
            table = db.create_table(SOURCES_TABLE, schema=SOURCES)
        data = pa.Table.from_pylist([row], schema=SOURCES)
        table.merge_insert("name").when_matched_update_all().when_not_matched_insert_all().execute(data)
    except OSError as exc:
        raise LakeError(f"cannot record source {row['name']!r} in {lake_dir}: {exc}") from exc


def record_failure(lake_dir: Path, spec: SourceSpec, previous: dict[str, Any] | None, exc: CtxError,
                   report: SyncReport | None = None) -> SyncReport:
    """A source that could not be synced: its SOURCES row says failed with the error's message (the
    root it had is kept), and `report` (default: a new one) carries the message, hint and exit code.
    The caller holds the lake's writer lock."""
    report = report or SyncReport(spec.name, spec.type, spec.origin, "failed")
    report.status, report.message, report.hint, report.exit_code = "failed", exc.message, exc.hint, exc.exit_code
    record_source(lake_dir, source_row(
        spec.name, previous, type=spec.type, origin=spec.origin, ref=spec.ref, paths=spec.paths,
        excludes=spec.exclude, root=(previous or {}).get("root") or "", status="failed", message=exc.message))
    return report


def forget_source(lake_dir: Path, name: str) -> tuple[int, int]:
    """Delete a source's rows in every PER_SOURCE_TABLES table, its SOURCES row, Merkle snapshot,
    journal entry, co-change state and last run.

    Returns (chunks, files) deleted. The caller holds the lake's writer lock.
    """
    if not lake_dir.is_dir():
        return 0, 0
    db = connect(lake_dir)
    where = f"source = {sql_str(name)}"
    counts = []
    for table_name in PER_SOURCE_TABLES:
        table = open_table(db, table_name)
        n = table.count_rows(where) if table is not None else 0
        if table is not None and n:
            table.delete(where)
        counts.append(n)
    sources = open_table(db, SOURCES_TABLE)
    if sources is not None:
        sources.delete(f"name = {sql_str(name)}")
    with contextlib.suppress(FileNotFoundError):
        snapshot_path(lake_dir, name).unlink()
    freshness.clear_journal(lake_dir, name)
    forget_history(lake_dir, name)
    state = IndexState.read(lake_dir)
    if state is not None and name in {*(state.roots or {}), *(state.source_runs or {})}:
        (state.roots or {}).pop(name, None)
        (state.source_runs or {}).pop(name, None)
        state.write(lake_dir)
    return counts[0], counts[1]


def source_counts(lake_dir: Path) -> dict[str, tuple[int, int]]:
    """source -> (files, chunks) now in the lake."""
    if not lake_dir.is_dir():
        return {}
    import pyarrow.compute as pc

    db = connect(lake_dir)
    out: dict[str, list[int]] = {}
    for i, table_name in enumerate((FILES_TABLE, CHUNKS_TABLE)):
        table = open_table(db, table_name)
        if table is None:
            continue
        column = table.search().select(["source"]).to_arrow().column("source")
        for item in pc.value_counts(column).to_pylist():
            out.setdefault(item["values"], [0, 0])[i] = item["counts"]
    return {k: (v[0], v[1]) for k, v in out.items()}

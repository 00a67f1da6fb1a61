"""Stage run-log: after an index run, one INDEX_RUNS row with what the lake holds (the index's size over time)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctxlake.schemas.tables import INDEX_RUNS, INDEX_RUNS_TABLE
from ctxlake.tasks.lake import connect, open_table


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under folder (links not followed; files vanishing meanwhile skipped)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def record_run(lake_dir: Path, tables: Any, source: str, report: Any) -> pa.Table:
    """(lake, the run's IndexReport) -> the INDEX_RUNS row appended for it."""
    row = {
        "finished_at": datetime.now(UTC),
        "source": source,
        "files": tables.files.count_rows(),
        "chunks": tables.chunks.count_rows(),
        "embedded": tables.chunks.count_rows("vector IS NOT NULL"),
        "lake_bytes": folder_bytes(lake_dir),
        "added": int(report.added),
        "modified": int(report.modified),
        "removed": int(report.removed),
        "seconds": float(report.seconds),
    }
    batch = pa.Table.from_pylist([row], schema=INDEX_RUNS)
    db = connect(lake_dir)
    table = open_table(db, INDEX_RUNS_TABLE)
    if table is None:
        db.create_table(INDEX_RUNS_TABLE, data=batch, schema=INDEX_RUNS)
    else:
        table.add(batch)
    return batch

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
    return folder_stamp(folder)[0]


def folder_stamp(folder: Path) -> tuple[int, int]:
    """(bytes under folder, as folder_bytes counts them; a digest of every file's path, size and
    mtime). A Lance write adds files and a cleanup removes them, so the digest changes with any
    commit to any table under the folder: a change token for caches of what was read from it."""
    total = 0
    seen: list[tuple[str, int, int]] = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            total += st.st_size
            seen.append((path, st.st_size, st.st_mtime_ns))
    return total, hash(tuple(seen))


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

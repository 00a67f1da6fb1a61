"""Stage run-log: after an index run, one INDEX_RUNS row with what the lake holds (the index's size over time)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctxlake.schemas.tables import INDEX_RUNS, INDEX_RUNS_TABLE
from ctxlake.tasks.lake import connect, open_table
from ctxlake.tasks.store import fragment_count
from ctxlake.tasks.upkeep import KEEP_VERSIONS

RUNS_COMPACT_FRAGMENTS = 64


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under folder (links not followed; files vanishing meanwhile skipped)."""
    return folder_stamp(folder)[0]


def folder_stamp(folder: Path) -> tuple[int, int]:
    """(bytes under folder, as folder_bytes counts them; a digest of every file's path, size and
    mtime). A Lance write adds files and a cleanup removes them, so the digest changes with any
    commit to any table under the folder: a change token for caches of what was read from it."""
    total, digests = folder_stamps(folder, lambda top: "")
    return total, digests.get("", hash(()))


def folder_stamps(folder: Path, part: Callable[[str], str | None]) -> tuple[int, dict[str, int]]:
    """folder_stamp with one digest per part of the folder: `part` names the part of each entry
    at the folder's top level (a table's folder, a file), or None to leave it out of every digest
    (its bytes still count)."""
    total = 0
    seen: dict[str, list[tuple[str, int, int]]] = {}
    for dirpath, _, names in os.walk(folder):
        top = Path(dirpath).relative_to(folder).parts[:1]
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            total += st.st_size
            into = part(top[0] if top else name)
            if into is not None:
                seen.setdefault(into, []).append((path, st.st_size, st.st_mtime_ns))
    return total, {key: hash(tuple(entries)) for key, entries in seen.items()}


def record_run(lake_dir: Path, tables: Any, source: str, report: Any, pending_vectors: int | None = None) -> pa.Table:
    """(lake, the run's IndexReport) -> the INDEX_RUNS row appended for it. `pending_vectors`, the
    CHUNKS rows without a vector when the writer knows it, spares counting them (a scan of the vector
    column: 40 ms of a 0.4 s watcher batch on django)."""
    chunks = tables.chunks.count_rows()
    row = {
        "finished_at": datetime.now(UTC),
        "source": source,
        "files": tables.files.count_rows(),
        "chunks": chunks,
        "embedded": (chunks - pending_vectors if pending_vectors is not None
                     else tables.chunks.count_rows("vector IS NOT NULL")),
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
        # One row, one fragment: a watched project's edits left hundreds (a few KB each).
        if fragment_count(table) >= RUNS_COMPACT_FRAGMENTS:
            table.optimize(cleanup_older_than=KEEP_VERSIONS)
    return batch

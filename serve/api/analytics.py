"""DuckDB over the lake: every Lance table of a project as a read-only SQL view, read as queries run (`ctx sql`, notebooks)."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from ctxlake.errors import ConfigError, InputError, LakeError, NotIndexedError
from ctxlake.schemas.config import SqlSettings
from ctxlake.serve.api.cancel import abandoned
from ctxlake.tasks.lake import connect, lance_failure

if TYPE_CHECKING:
    import duckdb
    import lancedb
    from lancedb.table import Table

# How often the waiting thread wakes: Ctrl-C lands within this, and so does the deadline.
POLL_S = 0.1
INTERRUPT_WAIT_S = 5.0

# How DuckDB words an error raised by a table's Lance scan ("...failed: Invalid: External error: LanceError(IO): ...").
ARROW_SOURCE_FAILED = "reading the Arrow source failed: "

# Lance reads ahead of a scan into a buffer of up to 2 GiB by default, outside DuckDB's [sql]
# memory_limit: a `LIKE` over every message's text held ~350 MB more on a 600k-row table. A short
# read-ahead keeps that near 125 MB and was no slower there (ctx sql runs on few threads anyway).
SCAN_OPTIONS = {"io_buffer_size": 32 * 2**20, "batch_readahead": 2, "fragment_readahead": 1}

MEMORY_HINT = "narrow it (filter, aggregate, fewer columns), or raise [sql] memory_limit (CTX_SQL_MEMORY_LIMIT)"

# Statements that read; DuckDB would happily write files or attach databases otherwise.
_READ_TYPES = ("SELECT", "EXPLAIN", "PRAGMA")
_READ_ONLY = re.compile(r"^\s*(WITH|SELECT|FROM|DESCRIBE|SHOW|SUMMARIZE|EXPLAIN|PRAGMA\s+table_info)\b", re.I)


def _bulky(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema
            if (pa.types.is_list(f.type) or pa.types.is_fixed_size_list(f.type))
            and (f.name == "vector" or f.name.endswith("_vector"))]


def duck(lake_dir: Path, with_vectors: bool = False, memory_dir: Path | None = None,
         bounds: SqlSettings | None = None) -> LakeConnection:
    """An in-memory DuckDB connection with one view per lake table (files, chunks, knowledge, ...)
    and, given the user-wide memory lake, its messages and sessions; held to `bounds`' memory_limit
    and threads ([sql]'s defaults when None). The views follow the lake as it is written (see
    LakeConnection): what a notebook holds."""
    con, views = _open(lake_dir, with_vectors, memory_dir, bounds)
    return LakeConnection(con, views)


class _View(NamedTuple):
    name: str
    table: Table
    columns: list[str]


class LakeConnection:
    """A DuckDB connection over the lake whose views are bound again to a table's newest version
    before each `sql`, `query` or `execute` once that table has been written. A view reads the Lance
    version it was made over: a notebook left open would keep answering from the lake as it was
    when it connected, and fail once that version's files are cleaned up (tasks/upkeep.py
    KEEP_VERSIONS after a newer one). Everything else is the DuckDB connection's own."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views: list[_View]) -> None:
        self.con = con
        self._views = views
        self._versions = {view.name: view.table.version for view in views}

    def refresh(self) -> list[str]:
        """Bind each view whose table has a newer version to it; the names of those views."""
        moved = []
        for view in self._views:
            view.table.checkout_latest()
            if view.table.version != self._versions[view.name]:
                _bind(self.con, view, replace=True)
                self._versions[view.name] = view.table.version
                moved.append(view.name)
        return moved

    def sql(self, query: str, *args: Any, **kwargs: Any) -> duckdb.DuckDBPyRelation:
        self.refresh()
        return self.con.sql(query, *args, **kwargs)

    query = sql

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        self.refresh()
        return self.con.execute(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


def _open(lake_dir: Path, with_vectors: bool, memory_dir: Path | None,
          bounds: SqlSettings | None) -> tuple[duckdb.DuckDBPyConnection, list[_View]]:
    con = _connect(bounds or SqlSettings())
    views: list[_View] = []
    if (lake_dir / "state.json").exists() or any(lake_dir.glob("*.lance")):
        views += _add_views(con, connect(lake_dir), with_vectors)
    if memory_dir is not None and any(memory_dir.glob("*.lance")):
        views += _add_views(con, connect(memory_dir), with_vectors)
    if not views:
        raise NotIndexedError(f"the lake at {lake_dir} has no tables", hint="run `ctx run index` first")
    _lock_down(con)
    return con, views


def _add_views(con: duckdb.DuckDBPyConnection, db: lancedb.DBConnection, with_vectors: bool) -> list[_View]:
    """A view per table of `db` whose name is not taken yet, scanning its Lance dataset as a query
    runs: DuckDB asks it for the columns and rows the query needs (projection and filter pushdown),
    so `SELECT count(*) FROM messages` reads one column of the memory lake, not all of it into
    memory, and none is read outside [sql] memory_limit's watch before the query starts."""
    taken = set(lake_tables_names(con))
    views = []
    for name in sorted(set(db.list_tables().tables) - taken):
        table = db.open_table(name)
        drop = set() if with_vectors else set(_bulky(table.schema))
        view = _View(name, table, [f.name for f in table.schema if f.name not in drop])
        _bind(con, view)
        views.append(view)
    return views


def _bind(con: duckdb.DuckDBPyConnection, view: _View, replace: bool = False) -> None:
    import duckdb

    # A relation's view, not con.register: a registered hidden name would show in SHOW TABLES.
    columns = [duckdb.ColumnExpression(name) for name in view.columns]
    dataset = view.table.to_lance(default_scan_options=SCAN_OPTIONS)
    con.from_arrow(dataset).select(*columns).create_view(view.name, replace=replace)


def _connect(bounds: SqlSettings) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB within [sql] memory_limit and threads, and with nowhere to spill: past its
    limit DuckDB writes to `.tmp` in the current folder (the user's project), so a statement that
    needs more stops instead."""
    import duckdb

    threads = bounds.threads if isinstance(bounds.threads, int) else max(1, _cores() // 2)
    try:
        return duckdb.connect(":memory:", config={"memory_limit": bounds.memory_limit, "threads": threads,
                                                  "temp_directory": ""})
    except duckdb.Error as exc:
        raise ConfigError(f"DuckDB cannot start within [sql] memory_limit = {bounds.memory_limit!r}: "
                          f"{str(exc).splitlines()[0]}", hint="raise [sql] memory_limit (CTX_SQL_MEMORY_LIMIT)") from exc


def _cores() -> int:
    """The CPU cores this process may run on (a container's or taskset's share, where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Only the registered lake tables stay reachable: no file reads or writes (COPY, read_text,
    ATTACH), no extension install or load (network), no Python variables as tables, and the
    configuration frozen so a query cannot turn any of it back on."""
    for setting in ("enable_external_access", "autoinstall_known_extensions", "autoload_known_extensions",
                    "allow_community_extensions", "python_enable_replacements"):
        con.execute(f"SET {setting} = false")
    con.execute("SET lock_configuration = true")


def run_sql(lake_dir: Path, sql: str, limit: int = 1000, memory_dir: Path | None = None,
            bounds: SqlSettings | None = None) -> dict[str, Any]:
    """One read-only statement over the lake -> {columns, rows, row_count, truncated, limit, capped},
    within `bounds` ([sql]; its defaults when None): stopped after timeout_s, at Ctrl-C (the
    client's, when the service runs it) or past memory_limit, and never more than min(limit, max_rows) rows kept."""
    import duckdb

    bounds = bounds or SqlSettings()
    timeout_s, max_rows = bounds.timeout_s, bounds.max_rows
    if limit < 1:
        raise InputError(f"--limit must be at least 1, not {limit}")
    con, _ = _open(lake_dir, False, memory_dir, bounds)
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0]
        if "max_expression_depth" in first:  # its advice (a SET) is a statement ctx sql refuses
            raise InputError("SQL error: the statement nests expressions more than 1,000 deep",
                             hint="write it flatter (e.g. IN (...) or a join instead of chained ORs)") from exc
        raise InputError(f"SQL error: {first}") from exc
    if len(statements) != 1:
        raise InputError(f"ctx sql runs exactly one statement, not {len(statements)}")
    if statements[0].type.name not in _READ_TYPES or not _READ_ONLY.match(sql):
        raise InputError("ctx sql runs read-only statements (SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN)")
    keep = min(limit, max_rows)
    try:
        columns, rows = _bounded(con, statements[0], keep + 1, timeout_s)
    except duckdb.OutOfMemoryException as exc:
        raise InputError(f"the query needed more memory than [sql] memory_limit ({bounds.memory_limit}) allows "
                         f"and was stopped: {str(exc).splitlines()[0]}", hint=MEMORY_HINT) from exc
    except duckdb.Error as exc:
        damaged = _damaged(exc)
        if damaged is not None:
            raise damaged from exc
        raise InputError(f"SQL error: {str(exc).splitlines()[0]}",
                         hint=f"tables: {', '.join(sorted(lake_tables_names(con)))}") from exc
    return {
        "columns": columns,
        "rows": [list(r) for r in rows[:keep]],
        "row_count": min(len(rows), keep),
        "truncated": len(rows) > keep,
        "limit": keep,
        "capped": len(rows) > keep and limit > max_rows,  # cut by [sql] max_rows, not by --limit
    }


def _damaged(exc: duckdb.Error) -> LakeError | None:
    """A Lance table whose files failed as the query scanned them -> lance_failure's LakeError, as
    when the table is opened; DuckDB hands on only the text, after its own words."""
    text = str(exc)
    if ARROW_SOURCE_FAILED not in text:
        return None
    return lance_failure(RuntimeError(text.split(ARROW_SOURCE_FAILED, 1)[1].removeprefix("Invalid: External error: ")))


def _bounded(con: duckdb.DuckDBPyConnection, statement: Any, fetch: int,
             timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(columns, up to `fetch` rows) of `statement`, run on a worker thread: DuckDB holds its
    thread inside C until the query ends, so the calling thread waits in short joins, where
    Ctrl-C lands and the deadline is checked, and either one interrupts the query."""
    box: dict[str, Any] = {}
    done = threading.Event()  # not Thread.is_alive(): a join cut by Ctrl-C can leave that False (CPython 3.11)

    def work() -> None:
        try:
            result = con.execute(statement)
            box["columns"] = [d[0] for d in result.description or []]
            box["rows"] = result.fetchmany(fetch)
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    deadline = time.monotonic() + timeout_s
    threading.Thread(target=work, name="ctx-sql", daemon=True).start()
    try:
        while not done.wait(POLL_S):
            if time.monotonic() >= deadline:
                _interrupt(con, done)
                raise InputError(f"the query ran past the {timeout_s:g} s limit and was stopped",
                                 hint="narrow it, pass --timeout SECONDS, or raise [sql] timeout_s")
            if abandoned():  # served for a client that quit (Ctrl-C): nobody will read the rows
                _interrupt(con, done)
                raise InputError("the query was stopped: the command that asked for it has ended")
    except KeyboardInterrupt:
        _interrupt(con, done)
        raise
    if "error" in box:
        raise box["error"]
    return box["columns"], box["rows"]


def _interrupt(con: duckdb.DuckDBPyConnection, done: threading.Event) -> None:
    # Repeated: an interrupt that arrives before DuckDB has started the query is not kept. The
    # worker must be out of DuckDB before the process exits, or the exit aborts.
    give_up = time.monotonic() + INTERRUPT_WAIT_S
    while not done.is_set() and time.monotonic() < give_up:
        con.interrupt()
        done.wait(POLL_S)


def lake_tables_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [row[0] for row in con.execute("SHOW TABLES").fetchall()]

"""Long-lived read handles that ask LanceDB for a table's schema (and look for a legacy full-text
index folder) at most once a second.

LanceDB 0.40's query builders read `LanceTable.schema` three or four times per query (to look for
blob columns and to build the builder). Each read is a round trip through LanceDB's one
background event loop thread and, at read consistency 0, a check of the table's latest version.
In the service, ten agents querying at once queued on that thread: a py-spy profile under load
put ~60% of the keyword half of a hybrid query under `schema`. The tables ctxlake reads change
their schema only when a writer rebuilds them (a new embedding width), which a reader sees
within SCHEMA_MEMO_S.
"""

from __future__ import annotations

import functools
import time
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA_MEMO_S = 1.0

@functools.cache
def _memo_schema_class() -> type:
    """The LanceTable subclass whose `schema` is memoised (built on first use: importing
    lancedb.table is for processes that read tables)."""
    from lancedb.table import LanceTable

    class MemoSchemaTable(LanceTable):
        @property
        def schema(self) -> Any:
            now = time.monotonic()
            memo = self.__dict__.get("_ctx_schema")
            if memo is None or now - memo[0] >= SCHEMA_MEMO_S:
                memo = (now, LanceTable.schema.fget(self))  # type: ignore[attr-defined]
                self.__dict__["_ctx_schema"] = memo
            return memo[1]

        def _ensure_no_legacy_fts_index(self) -> None:
            # Every full-text query looks for a Tantivy index folder on disk (~0.6 ms of a
            # query: a filesystem object and a stat); once per interval is enough here.
            now = time.monotonic()
            if now - self.__dict__.get("_ctx_fts_checked", -SCHEMA_MEMO_S) >= SCHEMA_MEMO_S:
                LanceTable._ensure_no_legacy_fts_index(self)
                self.__dict__["_ctx_fts_checked"] = now

    return MemoSchemaTable


def memo_schema(table: T) -> T:
    """`table`, its schema read at most once per SCHEMA_MEMO_S from now on (None, or a table of
    another kind than LanceDB's local one, is returned as it is)."""
    from lancedb.table import LanceTable

    if type(table) is LanceTable:
        table.__class__ = _memo_schema_class()
    return table

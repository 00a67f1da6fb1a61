"""The one fuzzy symbol index: every symbol name of the lake, normalised for typo-tolerant
matching, built once per table version and open Lake. fuzzy_find (explore.find_symbols) and the
fuzzy search mode (ranked_lists.fuzzy_rows) both read it, so a name one finds the other finds too."""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from lancedb.table import Table


class Lake(Protocol):
    """What the index needs of an open lake (code_lake.Lake is one; naming it here would be a cycle)."""

    chunks: Table

SYMBOL_COLUMNS = ["symbol", "kind", "source", "path", "start_line", "end_line", "lang"]


def normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass
class SymbolIndex:
    version: int
    rows: pa.Table  # SYMBOL_COLUMNS, one row per chunk with a symbol
    names: list[str]  # one entry per symbol name (merged chunks list several)
    row_of: list[int]  # names[i] belongs to rows[row_of[i]]
    short: list[str]  # normalised last part (the method name)
    full: list[str]  # normalised qualified name
    kinds: list[str]  # the kinds present, for symbol_type checks
    distinct: list[str]  # each name once, sorted (the fuzzy search mode ranks names, not chunks)
    distinct_keys: list[str]  # the short keys of `distinct`, then their full keys


# Per open Lake (weakly, so a closed server's index goes with it); rebuilt per table version.
_symbol_cache: weakref.WeakKeyDictionary[Lake, SymbolIndex] = weakref.WeakKeyDictionary()
_symbol_lock = threading.Lock()


def symbol_index(lake: Lake) -> SymbolIndex:
    """Every symbol of the lake, normalised for typo-tolerant matching; rebuilt per table version."""
    version = lake.chunks.version
    with _symbol_lock:
        cached = _symbol_cache.get(lake)
        if cached is not None and cached.version == version:
            return cached
    rows: pa.Table = lake.chunks.search().select(SYMBOL_COLUMNS).where("symbol IS NOT NULL").to_arrow()
    names: list[str] = []
    row_of: list[int] = []
    for i, value in enumerate(rows.column("symbol").to_pylist()):
        for name in value.split(","):
            if name.strip():
                names.append(name.strip())
                row_of.append(i)
    distinct = sorted(set(names))
    # Each name is matched by its last part (the method) and as a whole (Class.method).
    index = SymbolIndex(version, rows, names, row_of,
                        [normalise(n.rsplit(".", 1)[-1]) for n in names], [normalise(n) for n in names],
                        sorted(set(rows.column("kind").to_pylist())), distinct,
                        [normalise(n.rsplit(".", 1)[-1]) for n in distinct] + [normalise(n) for n in distinct])
    with _symbol_lock:
        _symbol_cache[lake] = index
    return index

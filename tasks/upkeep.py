"""Table upkeep: merge a table's index deltas and fragments in size tiers, drop old versions.

LanceDB's optimize() rewrites too much for a lake that grows by small writes. It merges every
fragment under a million rows, so each compaction writes the whole table again (bench history,
2,000 sessions, 1,000 small ingests: 46 compactions, the messages folder 0.23 -> 11.4 GB), and it
folds the new rows into each index's newest delta, which for an index built once is the whole
index: on the 100,000-file tree's chunks (577k rows) an optimize after a one-file edit rebuilt the
IVF_HNSW_SQ index in 215 s at 1.7 GB and the text column's BM25 index in 16 s (the two rows the
edit wrote, measured per index with pylance). pylance, the lance release LanceDB embeds, names the
deltas and fragments a call touches; `compact` uses that to merge only what is about as big as
what is new, so a row is rewritten about log2(table rows / SMALL_FRAGMENT_ROWS) times over the
table's life instead of at every optimize.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import lance
    from lance.dataset import IndexInformation
    from lancedb.table import Table

# Set by the resident service around a run it makes in its own process (`ctx run index`, `ctx run
# ingest`): such a run leaves a due compaction to a child process (the project's watcher, the
# service's own ingest runs). `compact` imports pylance, a second copy of lance, and even its check of
# what is due (`to_lance`) mapped ~45 MB of it into the process for good; a compaction ~75 MB.
OPTIMIZE_ELSEWHERE_ENV = "CTX_OPTIMIZE_ELSEWHERE"
# Old table versions are kept this long so a reader that opened one can finish with it.
KEEP_VERSIONS = timedelta(minutes=30)
# The memory tables' vector index gets a delta per compaction, and its deltas are folded into one
# after this many: fragments under different deltas are never merged, so at 20,000 sessions the
# messages table grew to 150 fragments when the index was only ever given deltas.
INDEX_DELTAS = 8
# Fragments (and index deltas) under this many rows are merged whatever their neighbours' sizes.
# Kept low: at 8,192 the whole sessions table (3,000 rows) was rewritten at each of its compactions
# (bench history, 1,000 small ingests: 1.1 GB written for a 6 MB table).
SMALL_FRAGMENT_ROWS = 1_024
# A fragment this share of whose rows are deleted is rewritten without them at the next compaction.
DELETED_SHARE = 0.1
# A merge of big fragments copies their pages as they are instead of decoding and encoding them
# again (lance falls back to re-encoding where it cannot). A whole merge of a 2.2 GB, 16-fragment
# copy of the messages table at 20,000 sessions: 1.1 s and 200 MB peak instead of 9.0 s and
# 1,019 MB. Small fragments' pages are as small as their appends, and copied they stay so (200k rows
# after 400 appends of 20 rows, copied: a flat vector scan 200 ms instead of 54, a take of 400 rows
# 5.7 ms instead of 0.5), so a merge is re-encoded when more than BINARY_COPY_SMALL_SHARE of its rows
# lie in fragments under BINARY_COPY_ROWS (a cold ingest's last, partial batch is let through).
BINARY_COPY_ROWS = 16_384
BINARY_COPY_SMALL_SHARE = 0.1


def compact(table: Table, full: bool = False, whole: bool = False, tiered: bool = False) -> dict[str, int]:
    """Fold `table`'s new rows into its indexes, merge its newest fragments, drop versions past KEEP_VERSIONS.

    Indexes, by default (the memory tables): the new rows go into the BM25 and scalar indexes,
    which are rewritten as one (at 2,000 sessions ~10 MB; a BM25 delta beside them cost a
    search_context ~5 ms), and into a new delta of the vector index, whose deltas are folded into
    one once there are INDEX_DELTAS of them. With `tiered` (the code lake, whose indexes are too
    big to rewrite for an edit), every index takes its new rows with its newest deltas while each
    covers no more rows than the newer ones taken (`_deltas_to_merge`), so an index is rewritten
    whole only once the table has about doubled since it was. `full` folds every index into one.

    Then the newest fragments are merged: lance merges only fragments that the same index deltas
    cover, so these are the ones just indexed, with any older ones in the same delta; from the
    newest back, while a fragment holds no more rows than the newer ones picked (or is small). By
    default the indexes are not remapped to the merged rows there and then (`defer_index_remap`):
    lance keeps a fragment-reuse map, applied at the next index update, so they are written once
    per compaction, not twice. `tiered` remaps at once: on the chunks' IVF_HNSW_SQ index, a vector
    search after a fragment was rewritten with the remap deferred failed ("HNSW graph has N nodes
    but its vector storage has M rows"). Fragments that have lost DELETED_SHARE of their rows are
    rewritten without them.
    `whole` merges every fragment (a cold run's batches, once). Returns what it did: fragments
    merged, vector deltas folded, index deltas rewritten with new rows or merged.
    """
    import lance

    ds = lance.dataset(table.to_lance().uri)  # the newest version: `table` may be behind another writer's
    indexes, folded, rewritten = index_deltas(ds), 0, 0
    if indexes:
        rows = {f.fragment_id: f.metadata.physical_rows for f in ds.get_fragments()}
        vector = {index["name"] for index in indexes if index["fields"] == ["vector"]}
        deltas = max((sum(1 for i in indexes if i["name"] == name) for name in vector), default=0)
        full = full or (not tiered and deltas >= INDEX_DELTAS)
        for name in sorted({index["name"] for index in indexes}):
            own = [index for index in indexes if index["name"] == name]
            count: int | None
            if full:
                count = len(own)
            elif tiered:
                count = _deltas_to_merge(own, rows)
            else:
                count = 0 if name in vector else len(own)
            if count is not None:
                ds.optimize.optimize_indices(index_names=[name], num_indices_to_merge=count)
                ds = lance.dataset(ds.uri)
                rewritten += count
        folded = deltas if full else 0
        indexes = index_deltas(ds)
    cover: dict[int, set[str]] = {}
    for index in indexes:
        for fid in index["fragment_ids"]:
            cover.setdefault(fid, set()).add(index["uuid"])
    fragments = [(f.fragment_id, f.metadata.physical_rows, f.metadata.num_deletions) for f in ds.get_fragments()]
    picked = {fid for fid, _, _ in fragments} if whole else _tail([(fid, n) for fid, n, _ in fragments], cover)
    if len(picked) < 2:
        picked = set()  # nothing to merge
    picked |= {fid for fid, n, gone in fragments if gone > DELETED_SHARE * n}
    merged = 0
    if picked:
        total = sum(n for fid, n, _ in fragments if fid in picked)
        metrics = ds.optimize.compact_files(
            target_rows_per_fragment=total + 1, materialize_deletions_threshold=DELETED_SHARE, defer_index_remap=not tiered,
            excluded_fragment_ids=[fid for fid, _, _ in fragments if fid not in picked],
            compaction_mode=_compaction_mode([n for fid, n, _ in fragments if fid in picked]))
        merged = metrics.fragments_removed
        ds = lance.dataset(ds.uri)
    ds.cleanup_old_versions(older_than=KEEP_VERSIONS)
    table.checkout_latest()
    return {"fragments_merged": merged, "deltas_folded": folded, "deltas_rewritten": rewritten}


def index_deltas(ds: lance.LanceDataset) -> list[IndexInformation]:
    """The dataset's indexes, one entry per delta (oldest first), without lance's own (the
    fragment-reuse index a compaction with deferred remapping leaves covers only what it wrote)."""
    return [index for index in ds.list_indices() if not index["name"].startswith("__")]


def _deltas_to_merge(deltas: Sequence[IndexInformation], rows: dict[int, int]) -> int | None:
    """How many of one index's newest deltas to rewrite with the rows it does not cover yet (lance's
    `num_indices_to_merge`), or None when there is nothing to do: from the newest back, while a
    delta covers no more rows than the new rows and the deltas taken so far, or is small."""
    covered = {fid for delta in deltas for fid in delta["fragment_ids"]}
    new = [n for fid, n in rows.items() if fid not in covered]
    taken, count = sum(new), 0
    for delta in reversed(deltas):
        size = sum(rows.get(fid, 0) for fid in delta["fragment_ids"])
        if size > taken and size >= SMALL_FRAGMENT_ROWS:
            break
        taken += size
        count += 1
    return count if new or count > 1 else None  # one delta rewritten alone would not change


def _compaction_mode(rows: Sequence[int]) -> Literal["try_binary_copy", "reencode"]:
    """How a merge of fragments of these row counts writes its pages (see BINARY_COPY_ROWS)."""
    small = sum(n for n in rows if n < BINARY_COPY_ROWS)
    return "try_binary_copy" if small <= BINARY_COPY_SMALL_SHARE * sum(rows) else "reencode"


def _tail(fragments: Sequence[tuple[int, int]], cover: dict[int, set[str]]) -> set[int]:
    """Ids of the newest fragments to merge: the newest, then those covered by the same indexes,
    taken back while each holds no more rows than the newer ones picked, or under SMALL_FRAGMENT_ROWS
    (so a cold run's equal batches all merge)."""
    picked: set[int] = set()
    if not fragments:
        return picked
    same, rows = cover.get(fragments[-1][0], set()), 0
    for fid, n in reversed(fragments):
        if cover.get(fid, set()) != same or (picked and n > SMALL_FRAGMENT_ROWS and n > rows):
            break
        picked.add(fid)
        rows += n
    return picked

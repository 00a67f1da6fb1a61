"""Freshness: does the lake still match the files on disk? Decided from the Merkle snapshot, without Prefect or lancedb."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks.lake import IndexState, write_atomic
from ctxlake.tasks.merkle import Diff, Tree, diff_trees, load_snapshot, save_snapshot
from ctxlake.tasks.scan import scan_tree

JOURNAL_FILE = "journal.json"
# The reason of a source with no finished run yet (the project, when only `ctx add` has written the lake).
NOT_INDEXED = "not indexed yet"


@dataclass
class Freshness:
    """The answer to "would `ctx run index` do anything?" and why."""

    up_to_date: bool
    reason: str
    diff: Diff = field(default_factory=lambda: Diff([], [], []))
    tree: Tree | None = None
    seconds: float = 0.0
    vectors_only: bool = False  # the files and keyword index are current; only embedding is left

    @property
    def stale_paths(self) -> list[str]:
        return sorted(self.diff.added + self.diff.modified + self.diff.removed)


def check(lake_dir: Path, source: str, root: Path, index: IndexSettings) -> Freshness:
    """Compare the source tree on disk with the snapshot of the last clean run."""
    started = time.perf_counter()
    state = IndexState.read(lake_dir)
    snapshot = load_snapshot(lake_dir, source)
    if state is None or snapshot is None:
        return Freshness(False, NOT_INDEXED, seconds=time.perf_counter() - started)
    tree, _ = scan_tree(root, index, snapshot)
    diff = diff_trees(snapshot, tree)
    elapsed = time.perf_counter() - started
    # Each source's run journals itself until it finishes, so a crashed run of another source
    # (`ctx update`) does not make this one look unfinished; `clean` alone still counts when no
    # journal says which source it was.
    journal = read_journal(lake_dir)
    if source in journal or (not state.clean and not journal):
        return Freshness(False, "the last run did not finish", diff, tree, elapsed)
    if diff:
        n = len(diff.added) + len(diff.modified) + len(diff.removed)
        return Freshness(False, f"{n} file(s) changed since the last run", diff, tree, elapsed)
    if state.pending_vectors:
        return Freshness(False, f"{state.pending_vectors} chunk(s) still to embed", diff, tree, elapsed,
                         vectors_only=True)
    return Freshness(True, "up to date", diff, tree, elapsed)


def follow_unindexed_changes(lake_dir: Path, source: str, tree: Tree, state: IndexState) -> bool:
    """Keep the snapshot when only files that are not indexed changed (a binary, a secret-named
    or an oversized file came or went): the lake already matches `tree`, which no run would save,
    so `ctx status --skipped` kept listing a deleted file and every check walked that folder
    again. `state` is the caller's (a watcher writes its own later); True when it was saved."""
    if (state.roots or {}).get(source) == tree.root_hash:
        return False
    save_snapshot(lake_dir, source, tree)
    state.roots = {**(state.roots or {}), source: tree.root_hash}
    state.write(lake_dir)
    return True


# --- the run journal: what a run may have touched, until it finishes ----------------------------


def read_journal(lake_dir: Path) -> dict[str, list[str]]:
    try:
        data = json.loads((lake_dir / JOURNAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): [str(p) for p in v] for k, v in data.items()} if isinstance(data, dict) else {}


def write_journal(lake_dir: Path, journal: dict[str, list[str]]) -> None:
    write_atomic(lake_dir / JOURNAL_FILE, json.dumps(journal))


def clear_journal(lake_dir: Path, source: str) -> None:
    journal = read_journal(lake_dir)
    if journal.pop(source, None) is not None:
        write_journal(lake_dir, journal)


def with_journal(diff: Diff, tree: Tree, journaled: list[str]) -> Diff:
    """A diff widened by the paths an unfinished run may have half-written: each is redone
    (modified if it is still an indexed file, removed otherwise), so the lake converges."""
    if not journaled:
        return diff
    known = set(diff.added) | set(diff.modified) | set(diff.removed)
    modified = list(diff.modified)
    removed = list(diff.removed)
    for path in journaled:
        if path in known:
            continue
        entry = tree.entries.get(path)
        if entry is not None and entry.status == "indexed":
            modified.append(path)
        else:
            removed.append(path)
    return Diff(diff.added, sorted(modified), sorted(removed))

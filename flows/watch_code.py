"""Pipeline: index_code -> (watch -> debounce -> hash changed paths -> Merkle update -> chunk -> upsert -> embed -> snapshot)*."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

from prefect import flow

from ctxlake.errors import InputError, LakeError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.tasks import freshness
from ctxlake.tasks.embedders import make_embedder
from ctxlake.tasks.graph_store import optimize_graph
from ctxlake.tasks.lake import IndexState
from ctxlake.tasks.merkle import Diff, Tree, diff_trees, load_snapshot
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.scan import rehash_paths, scan
from ctxlake.tasks.store import optimize
from ctxlake.tasks.walk import PathFilter
from ctxlake.tasks.watching import STOP, changed_paths, request_stop

from .index_code import IndexReport, Writer, index_code

# Optimize (fold new rows into the indexes, compact) after this long without changes.
IDLE_OPTIMIZE_S = 30.0
# Paths whose change can alter which files are indexed at all: rescan everything.
RULE_FILES = (".gitignore", ".git/info/exclude")

# One watcher per process (tasks/watching.py STOP); `request_stop` ends it from another thread.
__all__ = ["request_stop", "watch_code"]


@flow(name="watch-code", validate_parameters=False, log_prints=False)
def watch_code(settings: Settings, source: str = PROJECT_SOURCE, root: Path | None = None) -> IndexReport:
    """Index the source, then keep it fresh from file events until stopped (Ctrl-C or request_stop)."""
    # watchfiles' engine, used directly: it is armed when created, so edits made while the
    # initial index runs are queued instead of lost (its generator arms only when iterated).
    from watchfiles._rust_notify import RustNotify

    STOP.clear()
    started = time.perf_counter()
    root = (root or settings.root).resolve()
    progress = reporter()
    total = IndexReport(source=source, root=str(root))
    with RustNotify([str(root)], False, False, 300, True, False) as notify:
        first = index_code(settings, source=source, root=root)
        total.files_seen, total.chunks_inserted = first.files_seen, first.chunks_inserted
        tree = load_snapshot(settings.lake_dir, source) or Tree.build({})
        embedder = make_embedder(settings.embed, settings.models_dir)
        writer = Writer(settings, source, root, embedder, IndexState.read(settings.lake_dir))
        keep = PathFilter(root, settings.index)
        dirty = False
        progress.note(f"watching {root} (Ctrl-C to stop)")
        while True:
            raw = notify.watch(settings.watch.debounce_ms, 50, int(IDLE_OPTIMIZE_S * 1000), STOP)
            if raw in ("signal", "stop"):
                break
            if raw == "timeout":
                if dirty:
                    _optimize(writer)
                    dirty = False
                continue
            events = cast("set[tuple[int, str]]", raw)  # the other answers are the strings above
            paths = changed_paths(root, events)
            if not paths:
                continue
            if any(p.endswith(RULE_FILES) for p in paths):
                keep = PathFilter(root, settings.index)
                new_tree, diff, _ = scan(root, settings.index, tree)
            else:
                new_tree = tree.update(rehash_paths(root, paths, tree, keep, settings.index.max_file_bytes))
                diff = diff_trees(tree, new_tree)
            if new_tree.entries:  # the paths imports resolve against now (the service's watchers do the same)
                writer.known = set(new_tree.entries)
            try:
                tree = apply_batch(writer, tree, new_tree, diff, total)
            except LakeError as exc:
                if not root.is_dir():  # its .ctx/lake went with it: nothing left to write into
                    raise InputError(f"the project folder {root} is gone; the watcher stopped") from exc
                raise
            dirty = True
        if dirty:
            _optimize(writer)
    progress.note("watcher stopped")
    total.seconds = time.perf_counter() - started
    return total


def _optimize(writer: Writer) -> None:
    optimize(writer.tables)
    optimize_graph(writer.graph)
    writer.state.unoptimized_rows = 0
    writer.state.write(writer.lake)


def apply_batch(writer: Writer, old: Tree, new: Tree, diff: Diff, total: IndexReport) -> Tree:
    """One debounced batch of changes -> the lake; returns the tree the lake now matches."""
    if not diff:
        if new.root_hash == old.root_hash:
            return old
        freshness.follow_unindexed_changes(writer.lake, writer.source, new, writer.state)
        return new
    started = time.perf_counter()
    report = IndexReport(source=writer.source, root=str(writer.root))
    report.added, report.modified, report.removed = len(diff.added), len(diff.modified), len(diff.removed)
    writer.begin(diff)
    writer.apply(diff, report)
    writer.embed(report)
    report.seconds = time.perf_counter() - started
    report.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    # Counted like index_code's runs, so the next big enough run (or the service) optimizes.
    writer.state.unoptimized_rows += report.chunks_inserted + report.chunks_deleted + report.embedded
    # A batch scans only the changed paths: what the last whole scan skipped (secret-named files,
    # shown by `ctx status`) still stands.
    report.skipped = dict((writer.state.last_run or {}).get("skipped") or {})
    writer.finish(new, report)
    total.added += report.added
    total.modified += report.modified
    total.removed += report.removed
    total.chunks_inserted += report.chunks_inserted
    total.chunks_deleted += report.chunks_deleted
    total.embedded += report.embedded
    total.secrets_masked += report.secrets_masked
    total.warnings.extend(report.warnings)
    names = ", ".join((diff.added + diff.modified + diff.removed)[:3])
    more = len(diff.added) + len(diff.modified) + len(diff.removed) - 3
    reporter().note(f"updated {names}{f' and {more} more' if more > 0 else ''} in {report.seconds:.2f} s")
    return new

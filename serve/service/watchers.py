"""File watchers of the registered projects, one thread each, in the service.

Each applies debounced batches with the watch flow's own steps (flows/watch_code.py apply_batch:
rehash the changed paths, Merkle diff, upsert, embed, snapshot), holding the project's writer lock
per batch so a `ctx run index` elsewhere and the watcher never write at once.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ctxlake.serve.service.children import dying_with_this_process, on_lifetime_thread
from ctxlake.tasks.watching import changed_paths

if TYPE_CHECKING:
    from ctxlake.serve.service.engine import EngineCache

STEP_MS = 50  # quiet time that closes a batch
# Set while no other thread is importing the pipeline (the service clears it during its warm-up,
# serve/service/daemon.py): a batch waits for it rather than import Prefect alongside that thread.
imports_ready = threading.Event()
imports_ready.set()
IMPORTS_WAIT_S = 120.0
# Files changed while a project was not watched that its watcher applies when it starts; more
# than this is a job for `ctx run index` (a whole-tree run, in a child process of the service).
CATCH_UP_MAX = 500
# A batch appends a fragment to each table it writes; merges and keyword queries slow with their
# number (django, 120 small fragments: a one-file merge 95 ms and a keyword query 25 ms; optimized,
# 63 and 13). Optimizing takes seconds on a big lake (3.8 s on django), so the watcher does it once
# this many batches or OPTIMIZE_AFTER_ROWS rows are pending and the project has been quiet for
# OPTIMIZE_QUIET_S, not in the way of the edit that made it due.
OPTIMIZE_AFTER_BATCHES = 24
OPTIMIZE_QUIET_S = 3.0
# And whatever is pending once the project has been quiet this long (as `ctx run index --watch`
# does): one edit's deleted and appended rows made each keyword query on django cost 11.1 ms of
# CPU instead of 6.3 (5.3 once optimized, which took 2.2 s there), so waiting for 24 batches left
# a lightly edited lake twice as dear to query for as long as it stayed that way.
OPTIMIZE_IDLE_S = 30.0
# A watcher's optimize runs in a child process, so the service neither holds its memory afterwards
# nor runs it on its interpreter:
# - compaction is pylance's (tasks/upkeep.py), a second copy of lance beside LanceDB's: the first
#   optimize in the service's own process mapped ~75 MB more of library code, kept for good
#   (django: idle RSS 400 -> 478 MB after a 0.4 s optimize; the child costs ~2 s of CPU, niced, once
#   the project is quiet);
# - an optimize folds an edit's rows into small tiers of the indexes (0.1-0.5 s on the
#   100,000-file tree, where LanceDB's optimize took 62-256 s and 2.2-2.5 GB), but now and then a
#   tier grows to the size of the one below it and both are rewritten (there: 25 s and 0.9 GB for
#   84,000 rows; 82 s and 2.3 GB when a tenth of the big fragment's rows were gone).
# The service's child processes (whole-tree index runs, the watchers' optimizes) yield the CPU to queries.
CHILD_NICE = 10
# What the watchers' hold on a lake's writer lock says (the service tells them from other writers).
WATCHER_PURPOSE = "ctx service watcher"


class ProjectWatcher(threading.Thread):
    def __init__(self, root: Path, engine: EngineCache, log: Callable[[str], None]) -> None:
        super().__init__(name=f"watch {root.name}", daemon=True)
        self.root = root
        self.engine = engine
        self.log = log
        self.stop_event = threading.Event()
        self.batches = 0
        self.changes = 0  # event batches seen plus batches applied: any change under root moves it
        self.pending: frozenset[str] = frozenset()  # indexable paths of the batch being applied
        self.blocked = False  # the batch waits for another writer's lock (a forced re-index)
        self.applied = threading.Condition()  # notified when a batch ends
        self._tree: tuple[str, Any] | None = None  # (Merkle root hash, Tree) the lake matched last
        self.unoptimized_batches = 0
        self.optimize_due = False
        self.last_batch = 0.0  # time.monotonic() when the last batch ended
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # one project's failure is logged; the service and others go on
            self.error = repr(exc)
            self.log(f"watcher of {self.root} stopped: {exc!r}")

    def _watch(self) -> None:
        from watchfiles._rust_notify import RustNotify

        from ctxlake.schemas.config import load_settings
        from ctxlake.tasks.walk import PathFilter

        settings = load_settings(self.root)
        with RustNotify([str(self.root)], False, False, 300, True, False) as notify:
            # Watching from here on: what changed before (while the service was down, or while
            # this watch was being set up on a big tree) is found by one walk and applied.
            self._catch_up(settings)
            while not self.stop_event.is_set():
                raw = notify.watch(settings.watch.debounce_ms, STEP_MS, 1000, self.stop_event)
                if raw in ("signal", "stop"):
                    break
                if raw == "timeout":
                    quiet = time.monotonic() - self.last_batch
                    if (self.optimize_due and quiet >= OPTIMIZE_QUIET_S) or (
                            self.unoptimized_batches and quiet >= OPTIMIZE_IDLE_S):
                        self._optimize(settings)
                    continue
                events = cast("set[tuple[int, str]]", raw)
                paths = changed_paths(self.root, events)
                if not paths:
                    # The lake's own writes (.ctx/) and git's bookkeeping: not a change to the
                    # project. Counted, they made every reader walk the tree again per commit of
                    # a forced re-index (half the service's CPU under query load).
                    continue
                keep = PathFilter(self.root, settings.index)
                self._batch(settings, paths, frozenset(p for p in paths if keep.keeps(p)))

    def _batch(self, settings: Any, paths: set[str], indexable: frozenset[str]) -> None:
        """Apply one batch; before the lake moves, readers see its indexable paths as stale until
        the batch is in (and the count moves on both edges)."""
        self.pending = indexable
        self.changes += 1
        record: Callable[[], None] | None = None
        try:
            if self.root.is_dir():
                record = self._apply(settings, paths)
        finally:
            with self.applied:
                self.pending = frozenset()
                self.blocked = False
                self.changes += 1
                self.applied.notify_all()
        self.last_batch = time.monotonic()
        if record is not None:  # the run-log row, once readers no longer wait for the batch
            record()

    def settle(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the batch under way, unless it waits for another writer;
        whether none is under way now."""
        deadline = time.monotonic() + timeout_s
        with self.applied:
            while self.pending and not self.blocked:
                left = deadline - time.monotonic()
                if left <= 0 or not self.is_alive():
                    break
                self.applied.wait(left)
            return not self.pending

    def _catch_up(self, settings: Any) -> None:
        from ctxlake.schemas.tables import PROJECT_SOURCE
        from ctxlake.tasks import freshness

        fresh = freshness.check(settings.lake_dir, PROJECT_SOURCE, self.root, settings.index)
        if fresh.up_to_date or fresh.tree is None:  # not indexed yet: the first `ctx run index` builds it
            return
        stale = set(fresh.stale_paths)
        if len(stale) > CATCH_UP_MAX:
            self.log(f"{len(stale)} files of {self.root} changed while not watched: left to `ctx run index` "
                     "or the next scheduled run")
            return
        if stale:  # the walk applied the index rules already
            self._batch(settings, stale, frozenset(stale))

    def _apply(self, settings: Any, paths: set[str]) -> Callable[[], None] | None:
        """Apply a batch under the writer lock; what is left to call once readers may go on."""
        imports_ready.wait(IMPORTS_WAIT_S)
        from ctxlake.errors import LockBusyError
        from ctxlake.flows.index_code import OPTIMIZE_AFTER_ROWS, IndexReport, Writer
        from ctxlake.flows.watch_code import RULE_FILES, apply_batch
        from ctxlake.schemas.tables import PROJECT_SOURCE
        from ctxlake.tasks.lake import IndexState, WriterLock
        from ctxlake.tasks.merkle import Tree, diff_trees, load_snapshot
        from ctxlake.tasks.scan import rehash_paths, scan
        from ctxlake.tasks.walk import PathFilter

        # However long another writer (a forced re-index) holds the lake: giving up would end the
        # watcher, and the paths stay pending (stale to readers) meanwhile. `ctx down` cancels it.
        try:
            lock = WriterLock(settings.lake_dir, purpose=WATCHER_PURPOSE).acquire()
        except LockBusyError:
            self.blocked = True  # readers do not wait for this batch (see settle)
            try:
                lock = WriterLock(settings.lake_dir, purpose=WATCHER_PURPOSE).acquire(
                    wait_s=math.inf, cancel=self.stop_event)
            except LockBusyError:
                if self.stop_event.is_set():
                    return None
                raise
        try:
            # Re-read each time: a `ctx run index` may have moved the lake on since the last batch.
            state = IndexState.read(settings.lake_dir)
            if state is None:
                return None  # not indexed yet: the first `ctx run index` builds it
            # The snapshot of a big tree takes a while to load (0.3 s on django): keep the one the
            # last batch left while the lake still matches it (no `ctx run index` moved it since).
            current = (state.roots or {}).get(PROJECT_SOURCE)
            if self._tree is not None and current is not None and self._tree[0] == current:
                tree = self._tree[1]
            else:
                tree = load_snapshot(settings.lake_dir, PROJECT_SOURCE) or Tree.build({})
            if any(p.endswith(RULE_FILES) for p in paths):
                new_tree, diff, _ = scan(self.root, settings.index, tree)
            else:
                keep = PathFilter(self.root, settings.index)
                new_tree = tree.update(rehash_paths(self.root, paths, tree, keep, settings.index.max_file_bytes))
                diff = diff_trees(tree, new_tree)
            if not diff:
                return None
            writer = Writer(settings, PROJECT_SOURCE, self.root, self.engine.embedder(settings), state)
            if tree.entries:  # the paths imports resolve against, as a run's scan has them (no snapshot: FILES)
                writer.known = set(new_tree.entries)
            writer.defer_record = True
            started = time.perf_counter()
            matched = apply_batch(writer, tree, new_tree, diff, IndexReport(source=PROJECT_SOURCE, root=str(self.root)))
            self._tree = (matched.root_hash, matched)
            self.batches += 1
            self.unoptimized_batches += 1
            self.optimize_due = (writer.state.unoptimized_rows >= OPTIMIZE_AFTER_ROWS
                                 or self.unoptimized_batches >= OPTIMIZE_AFTER_BATCHES)
            self.log(f"updated {len(paths)} path(s) in {self.root} in {time.perf_counter() - started:.2f} s")
            return writer.record
        finally:
            lock.release()

    def _optimize(self, settings: Any) -> None:
        """Optimize the project's lake while nothing else writes it (see OPTIMIZE_AFTER_BATCHES), in a
        child process; a writer holding the lake just now makes this wait for the next quiet second."""
        dims = self.engine.embedder(settings).dims
        started = time.perf_counter()
        code = (f"import os, sys\nos.nice({CHILD_NICE})\n"
                "from ctxlake.serve.service.watchers import optimize_lake\n"
                "sys.exit(0 if optimize_lake(sys.argv[1], int(sys.argv[2])) else 3)")
        argv = dying_with_this_process([sys.executable, "-c", code, str(settings.lake_dir), str(dims)])
        try:
            child = on_lifetime_thread(lambda: subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        except OSError as exc:  # no process left to start: the next quiet second tries again
            self.log(f"could not start the optimize of {self.root}: {exc}")
            return
        _, err = child.communicate()
        if child.returncode not in (0, 3):
            # Counted as done: a child that fails would otherwise start again every quiet second.
            self.unoptimized_batches, self.optimize_due = 0, False
            self.log(f"the optimize of {self.root} failed ({child.returncode}): {err.strip()[-500:]}")
            return
        if child.returncode == 0:
            self.unoptimized_batches, self.optimize_due = 0, False
            self.log(f"optimized the lake of {self.root} in a child process in {time.perf_counter() - started:.1f} s")

def optimize_lake(lake_dir: Path | str, dims: int) -> bool:
    """Optimize a project's lake (chunks, files, graph) under its writer lock; False when another
    writer holds the lock or a run is half done (it optimizes as it ends)."""
    from ctxlake.errors import LockBusyError
    from ctxlake.tasks.graph_store import open_graph, optimize_graph
    from ctxlake.tasks.lake import IndexState, WriterLock
    from ctxlake.tasks.store import open_for_write, optimize

    lake = Path(lake_dir)
    try:
        lock = WriterLock(lake, purpose=f"{WATCHER_PURPOSE} (optimize)").acquire()
    except LockBusyError:
        return False
    try:
        state = IndexState.read(lake)
        if state is None or not state.clean:
            return False
        optimize(open_for_write(lake, dims))
        optimize_graph(open_graph(lake))
        state.unoptimized_rows = 0
        state.write(lake)
        return True
    finally:
        lock.release()


class Watchers:
    def __init__(self, engine: EngineCache, on_drop: Callable[[str], None]) -> None:
        self.engine = engine
        self.log = on_drop
        self._lock = threading.Lock()
        self._by_root: dict[str, ProjectWatcher] = {}

    def add(self, root: Path) -> bool:
        """Start watching `root`; False when it was already watched or is not a folder."""
        key = str(root)
        with self._lock:
            if key in self._by_root or not root.is_dir():
                return False
            watcher = ProjectWatcher(root, self.engine, self.log)
            self._by_root[key] = watcher
        watcher.start()
        return True

    def state(self, root: Path) -> tuple[int, frozenset[str]] | None:
        """(change count, paths seen but not applied yet) of root's live watcher; None when root is
        not watched (or its watcher stopped), so a caller must look at the files itself."""
        with self._lock:
            watcher = self._by_root.get(str(root))
        if watcher is None or not watcher.is_alive() or watcher.error is not None:
            return None
        while True:  # a consistent pair: the count did not move while pending was read
            count, pending = watcher.changes, watcher.pending
            if watcher.changes == count:
                return count, pending

    def settle(self, root: Path, timeout_s: float) -> None:
        """Wait up to timeout_s for the batch root's watcher is applying (see ProjectWatcher.settle)."""
        with self._lock:
            watcher = self._by_root.get(str(root))
        if watcher is not None:
            watcher.settle(timeout_s)

    def roots(self) -> list[str]:
        with self._lock:
            return sorted(self._by_root)

    def optimize_soon(self, root: Path) -> bool:
        """After a run the service made in its own process, which left a due optimize to the watcher
        (tasks/upkeep.py OPTIMIZE_ELSEWHERE_ENV): the watcher of `root` runs it in a child once
        the project is quiet. True when one was due."""
        from ctxlake.flows.index_code import OPTIMIZE_AFTER_ROWS
        from ctxlake.schemas.roots import CTX_DIR
        from ctxlake.tasks.lake import IndexState

        with self._lock:
            watcher = self._by_root.get(str(root))
        try:
            state = IndexState.read(root / CTX_DIR / "lake")
        except Exception:  # an unreadable state: the next run reports it
            return False
        if watcher is None or state is None or state.unoptimized_rows < OPTIMIZE_AFTER_ROWS:
            return False
        watcher.optimize_due = True
        return True

    def drop_missing(self) -> list[str]:
        """Stop watching folders that no longer exist; returns them."""
        with self._lock:
            gone = [k for k in self._by_root if not Path(k).is_dir()]
            for key in gone:
                self._by_root.pop(key).stop_event.set()
        for key in gone:
            self.log(f"dropped {key} from the watched projects: the folder no longer exists")
        return gone

    def stop_all(self) -> None:
        with self._lock:
            watchers = list(self._by_root.values())
            self._by_root.clear()
        for watcher in watchers:
            watcher.stop_event.set()
        for watcher in watchers:
            watcher.join(timeout=10.0)

"""Reading while the service's watcher applies an edit: a search waits (briefly) for that batch, so
an agent that saves a file and searches at once finds what it wrote; a batch stuck behind another
writer is not waited for. And the watcher optimizes a lake its batches fragmented once quiet."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import PROJECT
from test_watcher_noise import wait_for

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import code_lake, code_search, watched
from ctxlake.serve.service import watchers
from ctxlake.serve.service.engine import EngineCache
from ctxlake.serve.service.watchers import ProjectWatcher, imports_ready
from ctxlake.tasks import store
from ctxlake.tasks.lake import IndexState, WriterLock
from ctxlake.tasks.store import open_for_write


@pytest.fixture
def watching(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> Iterator[tuple[Path, ProjectWatcher]]:
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    watcher = ProjectWatcher(repo, EngineCache(), log=lambda line: None)
    watched.use_watch_state(lambda root: (watcher.changes, watcher.pending) if root == repo else None,
                            lambda root, timeout_s: watcher.settle(timeout_s) if root == repo else None)
    watcher.start()
    try:
        yield repo, watcher
    finally:
        imports_ready.set()
        watched.use_watch_state(lambda root: None)
        watcher.stop_event.set()
        watcher.join(15)


def _edit_seen(repo: Path, watcher: ProjectWatcher, name: str) -> None:
    """Write a new function, then wait until the watcher holds it as its pending batch."""
    target = repo / "src" / "billing" / "refund.py"
    wait_for(lambda: (target.write_text(f"def {name}():\n    return 1\n"), time.sleep(0.3),
                      bool(watcher.pending))[-1], 60, "the watcher to see the edit")


def _found(result: Any, name: str) -> bool:
    return any(name in (h.symbol or "") or name in h.snippet for h in result.hits)


def _unindexed(lake_dir: Path) -> int:
    chunks = open_for_write(lake_dir, 0).chunks
    return sum(chunks.index_stats(idx.name).num_unindexed_rows for idx in chunks.list_indices())


def test_a_search_during_a_batch_waits_for_it_and_finds_the_edit(watching: tuple[Path, ProjectWatcher]) -> None:
    repo, watcher = watching
    wait_for(lambda: watcher.is_alive(), 10, "the watcher")
    time.sleep(0.5)
    imports_ready.clear()  # holds the batch back (as the service's warm-up does) so it is under way
    _edit_seen(repo, watcher, "refund_settled_word")
    threading.Timer(0.4, imports_ready.set).start()
    lake = code_lake.Lake(load_settings(repo))
    started = time.monotonic()
    result = code_search.search(lake, "refund_settled_word", mode="keyword")
    waited = time.monotonic() - started
    assert _found(result, "refund_settled_word"), [h.path for h in result.hits]
    assert not result.stale
    assert 0.3 <= waited < watched.SETTLE_S + 5


def test_a_search_does_not_wait_for_a_batch_behind_another_writer(watching: tuple[Path, ProjectWatcher]) -> None:
    repo, watcher = watching
    wait_for(lambda: watcher.is_alive(), 10, "the watcher")
    time.sleep(0.5)
    settings = load_settings(repo)
    lock = WriterLock(settings.lake_dir, purpose="a forced re-index").acquire()
    try:
        _edit_seen(repo, watcher, "refund_blocked_word")
        wait_for(lambda: watcher.blocked, 10, "the batch to wait for the lock")
        started = time.monotonic()
        result = code_search.search(code_lake.Lake(settings), "refund_blocked_word", mode="keyword")
        assert time.monotonic() - started < watched.SETTLE_S / 2
        assert result.stale and "src/billing/refund.py" in result.stale_paths
        assert not _found(result, "refund_blocked_word")
    finally:
        lock.release()
    wait_for(lambda: watcher.batches >= 1 and not watcher.pending, 60, "the batch after the lock")


def test_the_watcher_optimizes_the_fragmented_lake_once_quiet(
        watching: tuple[Path, ProjectWatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, watcher = watching
    monkeypatch.setattr(watchers, "OPTIMIZE_AFTER_BATCHES", 3)
    monkeypatch.setattr(watchers, "OPTIMIZE_QUIET_S", 1.0)
    settings = load_settings(repo)
    for i in range(3):
        before = watcher.batches
        (repo / "src" / "billing" / "refund.py").write_text(f"def refund_{i}():\n    return {i}\n")
        wait_for(lambda: watcher.batches > before or watcher.optimize_due, 60, f"batch {i}")  # noqa: B023
        wait_for(lambda: not watcher.pending, 60, f"batch {i} to end")
    before = IndexState.read(settings.lake_dir)
    assert watcher.optimize_due and before is not None and before.unoptimized_rows > 0
    assert _unindexed(settings.lake_dir) > 0  # the batches' rows, outside the keyword index
    wait_for(lambda: not watcher.optimize_due, 30, "the quiet-time optimize")
    state = IndexState.read(settings.lake_dir)
    assert state is not None and state.unoptimized_rows == 0
    assert _unindexed(settings.lake_dir) == 0
    hits = code_search.search(code_lake.Lake(settings), "refund_2", mode="keyword").hits
    assert hits and hits[0].path == "src/billing/refund.py"


def test_one_batch_is_optimized_once_the_project_has_been_idle(
        watching: tuple[Path, ProjectWatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, watcher = watching
    monkeypatch.setattr(watchers, "OPTIMIZE_IDLE_S", 2.0)  # OPTIMIZE_AFTER_BATCHES stays at 24
    settings = load_settings(repo)
    (repo / "src" / "billing" / "refund.py").write_text("def refund_once():\n    return 1\n")
    wait_for(lambda: watcher.batches >= 1 and not watcher.pending, 60, "the batch")
    assert not watcher.optimize_due  # one batch is far from the busy-lake rule
    wait_for(lambda: watcher.unoptimized_batches == 0, 30, "the idle-time optimize")
    state = IndexState.read(settings.lake_dir)
    assert state is not None and state.unoptimized_rows == 0
    assert _unindexed(settings.lake_dir) == 0
    hits = code_search.search(code_lake.Lake(settings), "refund_once", mode="keyword").hits
    assert hits and hits[0].path == "src/billing/refund.py"


def test_a_watcher_batch_resolves_imports_against_the_whole_project(watching: tuple[Path, ProjectWatcher]) -> None:
    from ctxlake.tasks.graph_store import IMPORTS_TABLE
    from ctxlake.tasks.lake import connect

    repo, watcher = watching
    (repo / "src" / "report.py").write_text("from src.users.service import UserRepository\n\n\n"
                                            "def report():\n    return UserRepository()\n")
    wait_for(lambda: watcher.batches >= 1 and not watcher.pending, 60, "the batch")
    imports = connect(repo / ".ctx" / "lake").open_table(IMPORTS_TABLE).to_arrow().to_pylist()
    resolved = {r["module"]: r["resolved"] for r in imports if r["path"] == "src/report.py"}
    assert resolved == {"src.users.service": "src/users/service.py"}


def test_the_cache_upkeep_of_a_batch_runs_after_readers_may_go_on(
    watching: tuple[Path, ProjectWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedding cache's upkeep compacts its side table every 16th small append (~0.25 s): not
    while a search waits for the batch."""
    from ctxlake.tasks import embed_cache

    repo, watcher = watching
    during_batch: list[bool] = []
    real = embed_cache.EmbeddingCache.maintain_if_appended

    def spy(self: embed_cache.EmbeddingCache) -> None:
        during_batch.append(bool(watcher.pending))
        real(self)

    monkeypatch.setattr(embed_cache.EmbeddingCache, "maintain_if_appended", spy)
    wait_for(lambda: watcher.is_alive(), 10, "the watcher")
    time.sleep(0.5)
    imports_ready.clear()  # holds the batch back so it is seen under way
    _edit_seen(repo, watcher, "upkeep_after_the_batch")
    imports_ready.set()
    wait_for(lambda: bool(during_batch), 60, "the batch's cache upkeep")
    assert not any(during_batch), during_batch
    assert _found(code_search.search(code_lake.Lake(load_settings(repo)), "upkeep_after_the_batch", mode="keyword",
                                 check_stale=False), "upkeep_after_the_batch")


@pytest.mark.parametrize("due", ["batches", "idle"])
def test_a_watchers_optimize_runs_in_a_child_process(
        watching: tuple[Path, ProjectWatcher], monkeypatch: pytest.MonkeyPatch, due: str) -> None:
    """An optimize maps pylance's copy of lance into the process that runs it (~75 MB, for good)
    and, on the 100,000-file tree, can rewrite a big tier for a minute and 2.3 GB: the service's own
    process never runs it (here, doing so would raise), whether the batches made it due or the
    project went quiet."""
    repo, watcher = watching
    if due == "batches":
        monkeypatch.setattr(watchers, "OPTIMIZE_AFTER_BATCHES", 1)  # one batch makes it due
        monkeypatch.setattr(watchers, "OPTIMIZE_QUIET_S", 0.5)
    else:
        monkeypatch.setattr(watchers, "OPTIMIZE_IDLE_S", 1.0)

    def in_this_process(*_: Any, **__: Any) -> None:
        raise AssertionError("the service's own process optimized the lake")

    monkeypatch.setattr(store, "optimize", in_this_process)
    (repo / "src" / "billing" / "refund.py").write_text("def refund_in_child():\n    return 1\n")
    wait_for(lambda: watcher.batches >= 1 and not watcher.pending, 60, "the batch")
    wait_for(lambda: watcher.unoptimized_batches == 0 and not watcher.optimize_due, 120, "the optimize")
    lake = load_settings(repo).lake_dir
    assert _unindexed(lake) == 0
    state = IndexState.read(lake)
    assert state is not None and state.unoptimized_rows == 0


def test_an_optimize_a_service_run_left_due_runs_in_the_watchers_child(
        watching: tuple[Path, ProjectWatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    """A `ctx run index` the service ran in its own process leaves its due optimize (see
    tasks/upkeep.py OPTIMIZE_ELSEWHERE_ENV); the service hands it to the project's watcher."""
    repo, watcher = watching
    monkeypatch.setattr(watchers, "OPTIMIZE_QUIET_S", 0.5)

    def in_this_process(*_: Any, **__: Any) -> None:
        raise AssertionError("the service's own process optimized the lake")

    monkeypatch.setattr(store, "optimize", in_this_process)
    lake = load_settings(repo).lake_dir
    group = watchers.Watchers(EngineCache(), on_drop=lambda _: None)
    group._by_root[str(repo)] = watcher
    state = IndexState.read(lake)
    assert state is not None and state.unoptimized_rows == 0
    assert not group.optimize_soon(repo)  # nothing due
    state.unoptimized_rows = 5_000  # what a run left when it deferred its optimize
    state.write(lake)
    assert group.optimize_soon(repo) and watcher.optimize_due
    wait_for(lambda: not watcher.optimize_due, 120, "the optimize")
    state = IndexState.read(lake)
    assert state is not None and state.unoptimized_rows == 0


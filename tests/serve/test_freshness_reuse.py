"""The read layer's freshness check in the service: reused while a watcher's change count stands
still, then following the watcher (its pending paths) once a check found the project up to date."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxlake.schemas.config import load_settings
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api import watched as queries
from ctxlake.serve.mcp.base import ServeOptions, ServerState
from ctxlake.tasks import freshness
from ctxlake.tasks.lake import IndexState


@pytest.fixture
def watcher() -> Iterator[dict[str, Any]]:
    seen: dict[str, Any] = {"count": 0, "pending": frozenset(), "watched": True}
    queries.use_watch_state(lambda root: (seen["count"], seen["pending"]) if seen["watched"] else None)
    yield seen
    queries.use_watch_state(lambda root: None)


def index(cli: Callable[..., Any], repo: Path, watcher: dict[str, Any]) -> None:
    """`ctx run index` as a stand-in for a watcher's batch (it asks for freshness itself: as an
    unwatched project, so this test's made-up watcher state is not cached under it)."""
    watcher["watched"] = False
    try:
        assert cli("run", "index", cwd=repo).exit_code == 0
    finally:
        watcher["watched"] = True


def test_answer_is_reused_until_the_count_moves(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                               fake_embedder: Any, watcher: dict[str, Any]) -> None:
    repo = make_repo({"app.py": "def alpha():\n    return 1\n"})
    index(cli, repo, watcher)
    settings = load_settings(repo)
    assert queries.project_freshness(settings).stale_paths == []

    (repo / "app.py").write_text("def alpha():\n    return 2\n")
    # Same count: the service's watcher has not reported the write yet, so the answer stands.
    assert queries.project_freshness(settings).stale_paths == []
    watcher.update(count=1, pending=frozenset({"app.py"}))  # the watcher saw it, the batch runs
    fresh = queries.project_freshness(settings)
    assert (fresh.up_to_date, fresh.stale_paths) == (False, ["app.py"])

    watcher["watched"] = False  # not watched (or the watcher died): every call looks at the files
    (repo / "new.py").write_text("x = 1\n")
    assert sorted(queries.project_freshness(settings).stale_paths) == ["app.py", "new.py"]


def test_after_an_up_to_date_check_the_watcher_alone_answers(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any,
        watcher: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"app.py": "def alpha():\n    return 1\n"})
    index(cli, repo, watcher)
    settings = load_settings(repo)
    assert queries.project_freshness(settings).up_to_date  # the one walk of the tree

    walks: list[Path] = []
    real_check = freshness.check
    monkeypatch.setattr(freshness, "check", lambda *a: walks.append(a[2]) or real_check(*a))

    def ask() -> tuple[freshness.Freshness, int]:
        before = len(walks)
        return queries.project_freshness(settings), len(walks) - before

    for batch in range(1, 4):  # event -> batch applied, three times
        (repo / "app.py").write_text(f"def alpha():\n    return {batch + 1}\n")
        watcher.update(count=2 * batch - 1, pending=frozenset({"app.py"}))
        fresh, walked = ask()
        assert (fresh.stale_paths, walked) == (["app.py"], 0)
        index(cli, repo, watcher)
        watcher.update(count=2 * batch, pending=frozenset())
        fresh, walked = ask()
        assert (fresh.up_to_date, walked) == (True, 0)

    # Another writer left the lake unfinished: the watcher cannot vouch for it, the files are read.
    state = IndexState.read(settings.lake_dir)
    assert state is not None
    state.clean = False
    state.write(settings.lake_dir)
    freshness.write_journal(settings.lake_dir, {PROJECT_SOURCE: ["app.py"]})
    watcher.update(count=7, pending=frozenset())
    fresh, walked = ask()
    assert walked == 1 and not fresh.up_to_date and fresh.reason == "the last run did not finish"


def test_a_changed_index_rule_is_not_answered_from_the_watcher(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, watcher: dict[str, Any]) -> None:
    repo = make_repo({"app.py": "def alpha():\n    return 1\n", "notes/todo.py": "x = 1\n"})
    (repo / ".ctx").mkdir(exist_ok=True)
    index(cli, repo, watcher)
    assert queries.project_freshness(load_settings(repo)).up_to_date
    # .ctx/ is noise to the watcher: its count stands still, nothing is pending.
    config = repo / ".ctx" / "config.toml"
    config.write_text(config.read_text() + '\n[index]\nexclude = ["notes/**"]\n')
    fresh = queries.project_freshness(load_settings(repo))
    assert not fresh.up_to_date and fresh.stale_paths == ["notes/todo.py"]


def test_an_mcp_session_follows_the_service_watcher_instead_of_its_own(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, watcher: dict[str, Any]) -> None:
    repo = make_repo({"app.py": "def alpha():\n    return 1\n"})
    index(cli, repo, watcher)
    before = {t for t in threading.enumerate() if t.name == "ctx-watch"}
    state = ServerState(load_settings(repo), ServeOptions())
    state.start()
    state.lake()
    assert state.freshness().up_to_date
    assert {t for t in threading.enumerate() if t.name == "ctx-watch"} == before, "the session started a watcher"

    (repo / "app.py").write_text("def alpha():\n    return 2\n")
    watcher.update(count=1, pending=frozenset({"app.py"}))
    deadline = time.monotonic() + 30
    while state.freshness().up_to_date and time.monotonic() < deadline:  # rescanned in the background
        time.sleep(0.05)
    assert state.freshness().stale_paths == ["app.py"]
    state.close()


def test_sessions_on_a_project_nothing_watches_share_one_watcher(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, watcher: dict[str, Any]) -> None:
    repo = make_repo({"app.py": "def alpha():\n    return 1\n"})
    index(cli, repo, watcher)
    watcher["watched"] = False  # the service does not follow this project: the sessions watch it

    def watchers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "ctx-watch"}

    before = watchers()
    sessions = [ServerState(load_settings(repo), ServeOptions()) for _ in range(3)]
    for state in sessions:
        state.start()
        state.lake()
    assert len({id(state.fresh) for state in sessions}) == 1
    deadline = time.monotonic() + 30
    while len(watchers() - before) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = watchers() - before
    assert len(started) == 1, f"{len(started)} watchers for three sessions"
    assert all(state.freshness().up_to_date for state in sessions)

    (repo / "app.py").write_text("def alpha():\n    return 2\n")  # seen by the one watcher, for all
    deadline = time.monotonic() + 30
    while sessions[2].freshness().up_to_date and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [state.freshness().stale_paths for state in sessions] == [["app.py"]] * 3

    sessions[0].close()
    sessions[0].close()  # twice: still one release
    time.sleep(0.5)
    assert all(t.is_alive() for t in started), "the others still use the watcher"
    for state in sessions[1:]:
        state.close()
    for thread in started:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in started), "the last session to close stops the watcher"
    fresh = ServerState(load_settings(repo), ServeOptions())
    assert fresh.fresh is not sessions[0].fresh  # a later session starts anew
    fresh.close()

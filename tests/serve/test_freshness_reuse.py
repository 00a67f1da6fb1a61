"""The read layer's freshness check reuses its answer only while a watcher's change count stands still."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import queries


@pytest.fixture
def counter() -> Iterator[dict[str, int | None]]:
    count: dict[str, int | None] = {"n": 0}
    queries.use_change_counter(lambda root: count["n"])
    yield count
    queries.use_change_counter(lambda root: None)


def test_answer_is_reused_until_the_count_moves(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                               fake_embedder: Any, counter: dict[str, int | None]) -> None:
    repo = make_repo({"app.py": "def alpha():\n    return 1\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    assert queries.project_freshness(settings).stale_paths == []

    (repo / "app.py").write_text("def alpha():\n    return 2\n")
    # Same count: the service's watcher has not reported the write yet, so the answer stands.
    assert queries.project_freshness(settings).stale_paths == []
    counter["n"] = 1  # the watcher saw events
    assert queries.project_freshness(settings).stale_paths == ["app.py"]

    counter["n"] = None  # not watched (or the watcher died): every call looks at the files
    (repo / "new.py").write_text("x = 1\n")
    assert sorted(queries.project_freshness(settings).stale_paths) == ["app.py", "new.py"]

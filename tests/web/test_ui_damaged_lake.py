"""A damaged lake in the web UI, over real HTTP: the one line and recovery hint the CLI prints
(tasks/lake.py:lance_failure), never a Lance traceback or a bare 500."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import damage_lake

from ctxlake.serve.web.base import UiContext
from ctxlake.serve.web.server import UiServer

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

HINT = "`ctx run index --force` rebuilds it"


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as res:
            return res.status, res.headers.get("content-type", ""), res.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode()


@pytest.fixture
def served(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> Iterator[tuple[Path, str]]:
    repo = make_repo({"app.py": "def total(xs):\n    return sum(xs)\n", "notes.md": "# Notes\n\nTotals.\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    server = UiServer(UiContext(projects=lambda: [str(repo)], env=dict(os.environ), mode="standalone"), 0)
    url = server.start()
    try:
        yield repo, url
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["truncated", "data_deleted", "no_indices"])
def test_a_damaged_lake_is_the_clis_one_line_and_hint_in_the_ui(served: tuple[Path, str], how: str) -> None:
    repo, url = served
    damage_lake(repo / ".ctx" / "lake", how)
    query = urllib.parse.urlencode({"q": "total", "kind": "code", "mode": "keyword"})
    status, kind, body = get(f"{url}api/search?{query}")
    assert kind.startswith("application/json"), body
    answer = json.loads(body)
    assert status == 503, body
    assert "cannot be read" in answer["error"], answer
    if how != "truncated":  # Lance names the file it misses; a short read names no table (nor does the CLI)
        assert answer["error"].startswith("the lake's chunks "), answer
    assert answer["hint"] == HINT and HINT not in answer["error"]
    assert ".rs:" not in body and "RuntimeError" not in body and "Traceback" not in body
    status, kind, body = get(f"{url}api/files?q=total")
    assert status == 503 and json.loads(body)["hint"] == HINT, body
    for page in ("sources", "search?q=total"):  # server-rendered pages: the notice, not a bare 500
        status, kind, body = get(f"{url}{page}")
        assert status in (200, 503) and kind.startswith("text/html"), (page, status, body[:300])
        assert "Traceback" not in body and ".rs:" not in body and "Internal Server Error" not in body
    if how != "no_indices":  # the Overview counts rows; only a keyword search reads the BM25 index
        status, kind, body = get(f"{url}api/overview")
        assert status == 200, body
        (project,) = json.loads(body)["projects"]
        assert "cannot be read" in project["error"] and HINT in project["error"], project

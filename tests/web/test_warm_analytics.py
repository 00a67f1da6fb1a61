"""The UI computes a project's Analytics figures on a thread when another of its pages is first
served, so the Analytics page finds them ready; once per project and process."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from uisite import Site

from ctxlake.serve.api import stats
from ctxlake.serve.web.base import UiContext
from ctxlake.serve.web.server import UiServer


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as res:
        assert res.status == 200
        return str(res.read().decode())


@contextmanager
def fresh_ui(site: Site) -> Iterator[tuple[str, UiContext]]:
    """A UI of its own over the shared site's project: nothing warmed in it yet."""
    ctx = UiContext(projects=lambda: [str(site.repo)], env={**os.environ, **site.env}, mode="standalone")
    server = UiServer(ctx, 0)
    url = server.start()
    try:
        yield url, ctx
    finally:
        server.stop()


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The projects whose code-lake figures were computed (not taken from the cache), in order;
    the cache emptied first."""
    calls: list[str] = []
    real: Callable[..., Any] = stats._code_figures

    def counting(settings: Any, *args: Any) -> Any:
        calls.append(str(settings.root))
        return real(settings, *args)

    monkeypatch.setattr(stats, "_computed", {})
    monkeypatch.setattr(stats, "_code_figures", counting)
    return calls


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def warming() -> bool:
    return any(t.name == "ctx-ui-warm" and t.is_alive() for t in threading.enumerate())


def test_another_page_warms_the_analytics_figures_once(site: Site, computed: list[str]) -> None:
    with fresh_ui(site) as (url, _):
        get(url + "search")
        assert wait_for(lambda: computed == [str(site.repo)] and not warming())
        html = get(url + "analytics")  # answered from what the warm-up computed
        assert "Chunks per language" in html
        get(url + "knowledge")
        get(url + "sessions")
        assert not wait_for(warming, timeout=0.5)
        assert computed == [str(site.repo)]


def test_the_analytics_page_visited_first_computes_them_itself(site: Site, computed: list[str]) -> None:
    with fresh_ui(site) as (url, ctx):
        assert "Chunks per language" in get(url + "analytics")
        assert computed == [str(site.repo)]
        get(url + "search")  # already warm: no thread
        assert not wait_for(warming, timeout=0.5)
        assert computed == [str(site.repo)]
        assert str(site.repo) in ctx._warmed

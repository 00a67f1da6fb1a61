"""The service hosts the UI: `ctx up` prints its address, `ctx ui` finds it, the page is served by the
warm process on 127.0.0.1, and `ctx down` takes it away."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CTX = str(Path(sys.executable).parent / "ctx")


def ctx(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def project(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, prefect_server: None,
            monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CTX_SERVICE_SCHEDULES", "false")  # no Prefect server: this is about the UI
    repo = make_repo({"app/views.py": "def render_invoice(order):\n    return order\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    return repo


def test_up_prints_the_ui_and_down_stops_it(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:  # the configured port is taken: the UI falls back to a free one
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        monkeypatch.setenv("CTX_UI_PORT", str(taken))
        up = ctx("up", "--watch", str(project), cwd=project)
        try:
            assert up.returncode == 0, up.stderr
            line = next(ln for ln in up.stdout.splitlines() if ln.startswith("UI: "))
            url = line.removeprefix("UI: ")
            assert url.startswith("http://127.0.0.1:") and f":{taken}/" not in url
            shown = ctx("ui", "--no-open", "--json", cwd=project)
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout) == {"url": url, "mode": "service"}
            with urllib.request.urlopen(url + "api/search?q=render_invoice&mode=keyword", timeout=60) as res:
                hits = json.loads(res.read())["code"]["hits"]
            assert hits[0]["path"] == "app/views.py"  # the watched project, served by the service
            # The installed package carries its assets (an editable install links them: still served).
            with urllib.request.urlopen(url + "static/app.js", timeout=60) as res:
                assert res.headers["content-type"].startswith("text/javascript") and b"csrf" in res.read()
            status = ctx("status", cwd=project)
            assert f"UI: {url}" in status.stdout
        finally:
            down = ctx("down", cwd=project)
    assert down.returncode == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)

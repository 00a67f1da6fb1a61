"""The service hosts the UI: `ctx up` prints its address, `ctx ui` finds it, the page is served by the
warm process on 127.0.0.1, and `ctx down` takes it away."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from uisite import CHROMIUM

CTX = str(Path(sys.executable).parent / "ctx")


def ctx(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def project(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, prefect_server: None,
            monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = make_repo({"app/views.py": "def render_invoice(order):\n    return order\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    return repo


def test_the_service_hosts_the_ui_and_its_settings_page_drives_the_schedules(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_SERVICE_SCHEDULES", "true")  # the persistent Prefect server and deployments
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
            check_schedules(url, project)
        finally:
            down = ctx("down", cwd=project)
    assert down.returncode == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def check_schedules(url: str, project: Path) -> None:
    """The settings page's schedules (its script reads /api/schedules) and pausing / resuming one with
    the page's CSRF token."""
    deadline, names, html, cookie = time.monotonic() + 180, set(), "", ""
    while time.monotonic() < deadline:  # the orchestrator comes up after the UI
        with urllib.request.urlopen(url + "settings", timeout=60) as res:
            html, cookie = res.read().decode(), res.headers["set-cookie"].split(";")[0]
        if 'id="schedules-box"' in html:
            with urllib.request.urlopen(url + "api/schedules", timeout=60) as res:
                names = {s["name"] for s in json.loads(res.read())["schedules"]}
            if "ingest_conversations" in names:
                break
        time.sleep(1.0)
    assert "ingest_conversations" in names, "the schedules never showed on the settings page"
    token = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html)
    assert token

    def change(action: str) -> dict[str, Any]:
        req = urllib.request.Request(url + "api/schedules/ingest_conversations", method="POST",
                                     data=json.dumps({"action": action}).encode(),
                                     headers={"Content-Type": "application/json", "Cookie": cookie,
                                              "X-CSRF-Token": token.group(1)})
        try:
            with urllib.request.urlopen(req, timeout=120) as res:
                return {s["name"]: s for s in json.loads(res.read())["schedules"]}
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{action}: {exc.code} {exc.read().decode()}") from None

    assert change("pause")["ingest_conversations"]["paused"] is True
    listed = {s["name"]: s for s in json.loads(ctx("schedule", "list", "--json", cwd=project).stdout)}
    assert listed["ingest_conversations"]["paused"] is True  # the CLI sees what the page did
    assert change("resume")["ingest_conversations"]["paused"] is False
    if os.access(CHROMIUM, os.X_OK) and importlib.util.find_spec("playwright") is not None:
        click_through_schedules(url, project)


SCHEDULE_WAIT_MS = 30_000


def click_through_schedules(url: str, project: Path) -> None:
    """The settings page's script draws the schedules it fetched, and its buttons pause and resume."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(60_000)
            problems: list[str] = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url + "settings")
            page.wait_for_selector("body[data-ready='1']", state="attached")
            pause = page.locator('#schedules-table button[data-schedule="ingest_conversations"][data-action="pause"]')
            pause.click()
            # The button redraws from the POST's answer, which waits on the service's Prefect server:
            # under a loaded machine that took over expect's 5 s default once (a full suite run).
            expect(page.locator('#schedules-table button[data-schedule="ingest_conversations"][data-action="resume"]')
                   ).to_be_visible(timeout=SCHEDULE_WAIT_MS)
            expect(page.locator("#schedule-msg")).to_contain_text("Saved", timeout=SCHEDULE_WAIT_MS)
            listed = {s["name"]: s for s in json.loads(ctx("schedule", "list", "--json", cwd=project).stdout)}
            assert listed["ingest_conversations"]["paused"] is True
            page.locator('#schedules-table button[data-schedule="ingest_conversations"][data-action="resume"]').click()
            expect(pause).to_be_visible(timeout=SCHEDULE_WAIT_MS)
            assert problems == []
        finally:
            browser.close()

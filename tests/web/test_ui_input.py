"""The UI's answers over plain HTTP (Starlette's TestClient, no browser, no index): a query parameter
that is no number is a 400 that names it, never a 500; a full or forbidden disk is the CLI's line with
507 or 503; Settings hides secrets and nothing else."""

from __future__ import annotations

import errno
import html
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from ctxlake.serve.web.app import create_app
from ctxlake.serve.web.base import UiContext
from ctxlake.tasks.lake import STORAGE_HINT

PORT = 8765  # only checked against the Host header: nothing listens


@pytest.fixture
def project(tmp_path: Path) -> Path:
    repo = tmp_path / "proj"
    (repo / ".ctx").mkdir(parents=True)
    return repo


@pytest.fixture
def client(project: Path, tmp_path: Path) -> Iterator[TestClient]:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}
    ctx = UiContext(projects=lambda: [str(project)], env=env, mode="standalone")
    with TestClient(create_app(ctx, lambda: PORT), base_url=f"http://127.0.0.1:{PORT}") as test_client:
        yield test_client
    # A page starts the Analytics warm-up a moment later: end it here, not in a later test
    # (tests/web/test_warm_analytics.py counts the warm-ups it sees).
    for thread in threading.enumerate():
        if thread.name == "ctx-ui-warm":
            if isinstance(thread, threading.Timer):
                thread.cancel()
            thread.join(30)


@pytest.mark.parametrize(("path", "name"), [
    ("/api/search?q=x&limit=abc", "limit"),
    ("/api/files?q=x&limit=abc", "limit"),
    ("/api/file?path=README.md&start=abc", "start"),
    ("/api/file?path=README.md&start=1&end=2x", "end"),
])
def test_a_parameter_that_is_no_number_is_a_json_400(client: TestClient, path: str, name: str) -> None:
    res = client.get(path)
    assert res.status_code == 400, res.text
    assert res.json()["error"].startswith(f"{name} must be a whole number")


@pytest.mark.parametrize("path", ["/sessions?limit=abc", "/sessions/x?offset=abc"])
def test_a_page_with_a_parameter_that_is_no_number_is_an_html_400(client: TestClient, path: str) -> None:
    res = client.get(path)
    assert res.status_code == 400 and res.headers["content-type"].startswith("text/html")
    assert "must be a whole number" in res.text


def _token(client: TestClient) -> str:
    found = re.search(r'name="csrf-token" content="([0-9a-f]+)"', client.get("/knowledge").text)
    assert found
    return found.group(1)


@pytest.mark.parametrize(("code", "status", "words"), [
    (errno.ENOSPC, 507, "the disk is full"),
    (errno.EDQUOT, 507, "the disk quota is exceeded"),
    (errno.EACCES, 503, "permission denied"),
    (errno.EROFS, 503, "the file system is read-only"),
])
def test_a_full_or_forbidden_disk_is_the_clis_line_with_a_fitting_status(
        client: TestClient, project: Path, monkeypatch: pytest.MonkeyPatch, code: int, status: int, words: str) -> None:
    # It was a bare 500 with "OSError: [Errno 28] ..." in the body.
    import ctxlake.tasks.knowledge as knowledge

    def refused(path: Path, text: str) -> None:  # fault injection: the disk refuses the record's file
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(knowledge, "write_atomic", refused)
    res = client.post("/api/knowledge", json={"type": "decision", "title": "Keep the lake on local disk",
                                              "body": "NFS locks misbehave."}, headers={"X-CSRF-Token": _token(client)})
    assert res.status_code == status, res.text
    answer = res.json()
    assert answer["error"].startswith(f"storage error, {words}: {project}/.ctx/knowledge/decisions/"), answer
    assert answer["hint"] == STORAGE_HINT and "Errno" not in res.text


def test_a_disk_full_at_fsync_is_507_with_the_file_named(client: TestClient, project: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxlake.tasks.lake as lake

    def full(fd: int) -> None:  # a full disk often shows only when the data is flushed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    token = _token(client)
    monkeypatch.setattr(lake.os, "fsync", full)
    res = client.post("/api/knowledge", json={"type": "insight", "title": "Flush late", "body": "Delayed allocation."},
                      headers={"X-CSRF-Token": token})
    assert res.status_code == 507, res.text
    assert res.json()["error"].startswith(f"cannot write {project}/.ctx/knowledge/insights/"), res.text
    assert res.json()["error"].endswith(": No space left on device")


def test_a_page_over_a_forbidden_folder_shows_the_clis_line_with_503(client: TestClient, project: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxlake.serve.api.context_search as context_search

    folder = project / ".ctx" / "knowledge"

    def forbidden(*args: object, **kwargs: object) -> None:  # fault injection: the folder cannot be listed
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))

    monkeypatch.setattr(context_search, "project_knowledge", forbidden)
    res = client.get("/knowledge")
    assert res.status_code == 503 and res.headers["content-type"].startswith("text/html")
    assert f"storage error, permission denied: {folder}" in html.unescape(res.text)
    assert "Internal Server Error" not in res.text and "Traceback" not in res.text


def test_out_of_range_numbers_are_clamped(client: TestClient) -> None:
    assert client.get("/sessions?limit=-5").status_code == 200
    assert client.get("/sessions?limit=99999999999999999999").status_code == 200
    res = client.get("/api/search?q=refund&limit=-3&kind=code")  # not indexed: a warning, not an error
    assert res.status_code == 200 and res.json()["warnings"]


def test_settings_hide_secrets_only_and_show_the_mask_as_text(project: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "CTX_EMBED_PROVIDER": "openai",
           "OPENAI_API_KEY": "sk-test-" + "a" * 40}
    ctx = UiContext(projects=lambda: [str(project)], env=env, mode="standalone")
    with TestClient(create_app(ctx, lambda: PORT), base_url=f"http://127.0.0.1:{PORT}") as test_client:
        page = test_client.get("/settings").text
    cells = {m.group(1): html.unescape(re.sub(r"<[^>]+>", "", m.group(2)))
             for m in re.finditer(r'<th scope="row"[^>]*>(\w+)</th><td class="wrap">(.*?)</td>', page)}
    assert cells["max_tokens"].isdigit() and cells["prompt_tokens"].isdigit()
    assert cells["secret_files"] == '"skip"'
    assert cells["api_key"] == "•••• (set, hidden)" and "sk-test" not in page
    assert cells["llm_api_key"] == "not set"


def test_the_knowledge_page_shortens_a_huge_record_with_a_note(client: TestClient, project: Path) -> None:
    from datetime import UTC, datetime

    from ctxlake.tasks.knowledge import Record, render

    folder = project / ".ctx" / "knowledge" / "insights"
    folder.mkdir(parents=True)
    huge = Record(id="insight-20260101-00000001", type="insight", title="A" * 100_000, body="B" * 10_000_000,
                  created_at=datetime(2026, 1, 1, tzinfo=UTC), path="")
    small = Record(id="insight-20260101-00000002", type="insight", title="Exports batch rows", body="Ten thousand a batch.",
                   created_at=datetime(2026, 1, 2, tzinfo=UTC), path="")
    for record in (huge, small):
        (folder / f"{record.id}.md").write_text(render(record), encoding="utf-8")
    res = client.get("/knowledge")
    assert res.status_code == 200 and len(res.text) < 100_000
    assert f"{99_800 + 9_980_000:,} more characters are in <code>.ctx/knowledge/insights/{huge.id}.md" in res.text
    assert "Ten thousand a batch." in res.text
    # The shortened record cannot be edited here (the form would save the shortened text); the other can.
    assert 'data-edit="insight-20260101-00000001"' not in res.text
    assert 'data-edit="insight-20260101-00000002"' in res.text


def add_source(client: TestClient, body: dict[str, str], timeout_s: float = 180) -> dict[str, Any]:
    """POST /api/sources as the Sources page does, then the job as it ends (done or failed)."""
    import time

    token = re.search(r'name="csrf-token" content="([0-9a-f]+)"', client.get("/sources").text)
    assert token
    res = client.post("/api/sources", json=body, headers={"X-CSRF-Token": token.group(1)})
    assert res.status_code == 200, res.text
    job: dict[str, Any] = res.json()
    deadline = time.monotonic() + timeout_s
    while job["state"] not in ("done", "failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        job = client.get(f"/api/jobs/{job['id']}").json()
    return job


def test_a_source_origin_that_looks_like_an_option_is_the_origin(client: TestClient) -> None:
    job = add_source(client, {"name": "opt", "origin": "--help", "ref": "--version"})
    assert job["lines"][0] == "$ ctx add --json --ref=--version -- opt --help"
    assert job["state"] == "failed" and "Usage:" not in job["output"]  # `ctx add` tried the origin; no help text


def test_a_source_added_without_a_name_is_named_after_its_origin(client: TestClient, tmp_path: Path) -> None:
    notes = tmp_path / "team notes"
    notes.mkdir()
    (notes / "ideas.md").write_text("# Ideas\n\nA graph of tools.\n")
    job = add_source(client, {"name": " ", "origin": str(notes)})
    assert job["lines"][0] == f"$ ctx add --json -- {notes}"
    assert job["state"] == "done", job["output"]
    assert '<tr data-source="team-notes">' in client.get("/sources").text

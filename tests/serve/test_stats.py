"""`ctx stats` and the Analytics page's figures against counts taken independently from the lake."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from memlogs import claude, slug, tool_result, tool_use, write_jsonl

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api.stats import lake_stats
from ctxlake.serve.web.charts import hbars, line, stacked_columns
from ctxlake.tasks.lake import connect

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

FILES = {"app/models.py": "class User:\n    def name(self):\n        return 'u'\n",
         "app/views.py": "def index(request):\n    return 'ok'\n\n\ndef detail(request, pk):\n    return pk\n",
         "README.md": "# Demo\n\n## Setup\n\nRun it.\n"}


def _logs(base: Path, cwd: str) -> Path:
    logs = base / "claude"
    folder = logs / "projects" / slug(cwd)
    for n, (minute, error) in enumerate([(0, "ImportError: no module named foo"), (60 * 24, "ImportError: no module named foo"),
                                          (60 * 25, None)]):
        sid = f"s{n}"
        write_jsonl(folder / f"{sid}.jsonl", [
            claude("user", f"{sid}u1", minute, "fix the views", session=sid, cwd=cwd),
            claude("assistant", f"{sid}a1", minute + 1, [tool_use("Edit", file_path=f"{cwd}/app/views.py")], session=sid, cwd=cwd),
            claude("user", f"{sid}u2", minute + 2, tool_result(error or "ok", is_error=bool(error)), session=sid, cwd=cwd),
            claude("assistant", f"{sid}a2", minute + 3, [{"type": "text", "text": "done"}], session=sid, cwd=cwd),
        ])
    return logs


def test_figures_equal_independent_counts(make_repo: Callable[..., Path], cli: Callable[..., Any], tmp_path: Path) -> None:
    repo = make_repo(FILES)
    assert cli("run", "index", cwd=repo).exit_code == 0
    (repo / "app" / "forms.py").write_text("class Form:\n    pass\n")
    assert cli("run", "index", cwd=repo).exit_code == 0  # a second run: two points of index history
    assert cli("run", "ingest", f"--from=claude={_logs(tmp_path, str(repo))}", cwd=repo).exit_code == 0

    settings = load_settings(repo)
    figures = lake_stats(settings, top=5)
    lake = connect(settings.lake_dir)
    chunks = lake.open_table("chunks").to_arrow()
    assert (figures.files, figures.chunks) == (lake.open_table("files").count_rows(), chunks.num_rows)
    assert figures.embedded == sum(v is not None for v in chunks.column("vector").to_pylist())
    langs = {c.label: c.count for c in figures.chunks_per_language}
    assert langs["python"] == sum(lang == "python" for lang in chunks.column("lang").to_pylist())
    assert len(figures.index_size) == 2 and figures.index_size[-1].files == 4 and figures.index_size[0].files == 3
    assert figures.sessions == 3 and figures.messages == 12
    assert [(a.day, a.tool, a.sessions) for a in figures.activity] == [("2026-03-02", "claude", 1), ("2026-03-03", "claude", 2)]
    assert figures.touched_files[0].label.endswith("app/views.py") and figures.touched_files[0].count == 3
    assert figures.frequent_errors[0].count == 2 and "ImportError" in figures.frequent_errors[0].label

    out = cli("stats", "--json", cwd=repo)
    assert out.exit_code == 0
    assert json.loads(out.stdout)["sessions"] == 3
    text = cli("stats", cwd=repo)
    assert "python" in text.stdout and "ImportError" in text.stdout


def test_a_lake_without_sessions_or_history(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    repo = make_repo(FILES)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    figures = lake_stats(load_settings(repo))
    assert figures.sessions == 0 and figures.activity == [] and figures.embedded_share == 0.0
    assert cli("stats", cwd=repo).exit_code == 0


def test_not_indexed_is_exit_4(tmp_path: Path, cli: Callable[..., Any]) -> None:
    (tmp_path / ".ctx").mkdir()
    result = cli("stats", cwd=tmp_path)
    assert result.exit_code == 4 and "ctx run index" in result.stderr and "ctx run ingest" in result.stderr


def test_conversations_without_a_code_index_still_show_their_figures(tmp_path: Path, cli: Callable[..., Any]) -> None:
    repo = tmp_path / "notes"
    (repo / ".ctx").mkdir(parents=True)
    assert cli("run", "ingest", "--no-embed", f"--from=claude={_logs(tmp_path, str(repo))}", cwd=repo).exit_code == 0
    result = cli("stats", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["code_indexed"] is False and (figures["files"], figures["chunks"]) == (0, 0)
    assert (figures["sessions"], figures["messages"]) == (3, 12)
    text = cli("stats", cwd=repo)
    assert text.exit_code == 0 and "code not indexed" in text.stdout and "sessions 3" in text.stdout
    # The web UI's Analytics page says so too, instead of a file count of 0.
    import os
    import urllib.request

    from ctxlake.serve.web.base import UiContext
    from ctxlake.serve.web.server import UiServer

    server = UiServer(UiContext(projects=lambda: [str(repo)], env=dict(os.environ), mode="standalone"), 0)
    url = server.start()
    try:
        with urllib.request.urlopen(url + "analytics", timeout=60) as res:
            page = res.read().decode()
    finally:
        server.stop()
    assert "not indexed (<code>ctx run index</code>)" in page and ">12<" in page


def test_charts_are_valid_svg_with_escaped_labels() -> None:
    hostile = '<script>alert(1)</script> & "x"'
    for svg in (hbars([(hostile, 3), ("b", 1)], hostile), stacked_columns(["2026-01-01"], {hostile: [2]}, "t"),
                line([(hostile, 1.0), ("later", 2.0)], "t", " MB"), hbars([], "empty")):
        root = ElementTree.fromstring(svg)  # parses: well-formed XML
        assert root.tag.endswith("svg") and "<script" not in svg
        assert root.find("{http://www.w3.org/2000/svg}title") is not None


def test_figures_follow_the_lakes_across_runs_and_ingests(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                                          tmp_path: Path) -> None:
    # The figures are kept per state of the lake folders (the Analytics page calls this per visit):
    # every write to either lake must show in the next answer.
    repo = make_repo(FILES)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    first = lake_stats(settings, top=5)
    assert lake_stats(settings, top=5) == first
    assert first.embedded == 0 and first.sessions == 0 and len(first.index_size) == 1

    assert cli("run", "index", cwd=repo).exit_code == 0  # no file changed: only the vectors arrive
    embedded = lake_stats(settings, top=5)
    assert embedded.embedded == embedded.chunks == first.chunks > 0 and len(embedded.index_size) == 2

    (repo / "app" / "forms.py").write_text("class Form:\n    pass\n")
    assert cli("run", "index", cwd=repo).exit_code == 0
    grown = lake_stats(settings, top=5)
    lake = connect(settings.lake_dir)
    assert (grown.files, grown.chunks) == (lake.open_table("files").count_rows(), lake.open_table("chunks").count_rows())
    assert grown.files == first.files + 1 and grown.lake_bytes != embedded.lake_bytes

    assert cli("run", "ingest", f"--from=claude={_logs(tmp_path, str(repo))}", cwd=repo).exit_code == 0
    ingested = lake_stats(settings, top=5)
    assert ingested.sessions == 3 and ingested.messages == 12 and ingested.files == grown.files
    # A caller may change what it got without changing the next caller's answer.
    ingested.chunks_per_language.clear()
    assert lake_stats(settings, top=5).chunks_per_language


def test_each_half_is_recomputed_only_when_its_lake_changed(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.serve.api import stats

    repo = make_repo(FILES)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    computed: list[str] = []
    for half in ("code", "memory"):
        real = getattr(stats, f"_{half}_figures")
        monkeypatch.setattr(stats, f"_{half}_figures",
                            lambda *args, _real=real, _half=half: computed.append(_half) or _real(*args))
    first = lake_stats(settings, top=5)
    assert computed == ["code", "memory"]
    assert lake_stats(settings, top=5) == first and computed == ["code", "memory"]

    assert cli("run", "ingest", f"--from=claude={_logs(tmp_path, str(repo))}", cwd=repo).exit_code == 0
    ingested = lake_stats(settings, top=5)
    assert computed[2:] == ["memory"] and ingested.sessions == 3
    conversational = {"sessions", "messages", "activity", "touched_files", "frequent_errors", "knowledge", "lake_bytes"}
    assert ingested.model_dump(exclude=conversational) == first.model_dump(exclude=conversational)

    (repo / "app" / "forms.py").write_text("class Form:\n    pass\n")
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    grown = lake_stats(settings, top=5)
    assert computed[3:] == ["code"] and grown.files == first.files + 1 and grown.sessions == 3

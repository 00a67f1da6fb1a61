"""Figures a long-lived reader keeps between index runs (the MCP server's and the UI's): per-source
counts, per version of the files and chunks tables, and status's counts, per state of the lake
folder; each run must show in the next answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from helpers import write_files

from ctxlake.schemas.config import Settings, load_settings
from ctxlake.serve.api.code_lake import Lake
from ctxlake.serve.api.index_status import status
from ctxlake.serve.api.models_sources import SourceInfo
from ctxlake.serve.api.source_queries import index_stats, list_sources
from ctxlake.tasks.lake import connect
from ctxlake.tasks.run_log import folder_bytes

pytestmark = pytest.mark.usefixtures("prefect_server")

FILES = {"app/models.py": "class User:\n    def name(self):\n        return 'u'\n",
         "app/views.py": "def index(request):\n    return 'ok'\n\n\ndef detail(request, pk):\n    return pk\n",
         "README.md": "# Demo\n\n## Setup\n\nRun it.\n"}


def project_row(settings: Settings, lake: Lake) -> SourceInfo:
    return next(s for s in list_sources(settings, lake).sources if s.name == "project")


def counted(settings: Settings) -> tuple[int, int, int]:
    """(files, chunks, embedded chunks) of the project, read straight from the tables."""
    db = connect(settings.lake_dir)
    chunks = db.open_table("chunks").to_arrow()
    return (db.open_table("files").count_rows(), chunks.num_rows,
            chunks.num_rows - int(pc.sum(pc.is_null(chunks.column("vector"))).as_py() or 0))


def status_counts(settings: Settings) -> tuple[int, int, int]:
    st = status(settings, check_stale=False)
    assert st.lake_bytes == folder_bytes(settings.lake_dir)
    return st.files, st.chunks, st.embedded


def test_a_warm_lake_lists_each_run_s_figures(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                                fake_embedder: Any) -> None:
    repo = make_repo(FILES)
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    lake = Lake(settings)
    first = project_row(settings, lake)
    assert (first.files, first.chunks, first.embedded) == counted(settings) == status_counts(settings)
    assert first.embedded == 0
    assert index_stats(lake) is index_stats(lake)  # nothing changed: no recount

    assert cli("run", "index", cwd=repo).exit_code == 0  # no file changed: only the vectors arrive
    embedded = project_row(settings, lake)
    assert (embedded.files, embedded.chunks, embedded.embedded) == counted(settings) == status_counts(settings)
    assert embedded.embedded == embedded.chunks == first.chunks

    write_files(repo, {"app/forms.py": "class Form:\n    pass\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    grown = project_row(settings, lake)
    assert (grown.files, grown.chunks, grown.embedded) == counted(settings) == status_counts(settings)
    assert grown.files == first.files + 1
    assert grown.languages == {"python": 3, "markdown": 1}
    # The warm lake's sources are those of a lake opened now (its last run is read at open).
    assert list_sources(settings, lake).sources == list_sources(settings, Lake(settings)).sources

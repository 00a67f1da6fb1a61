"""Every notebook in notebooks/ runs top to bottom against a real lake (nbclient, a real kernel)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO_ROOT
from memlogs import claude, slug, write_jsonl

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.usefixtures("prefect_server", "fake_embedder")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, make_repo: Callable[..., Path], cli: Callable[..., Any],
                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    repo = make_repo({
        "app/models.py": "class User:\n    def name(self):\n        return 'u'\n\n    def email(self):\n        return 'e'\n",
        "app/views.py": "def index(request):\n    return 'ok'\n",
        "README.md": "# Demo\n\n## Setup\n\nRun it.\n",
    })
    assert cli("run", "index", cwd=repo).exit_code == 0
    logs = tmp_path / "claude"  # one agent session in the project, for the conversation analyses
    write_jsonl(logs / "projects" / slug(str(repo)) / "s1.jsonl", [
        claude("user", "u1", 0, "rename the index view", session="s1", cwd=str(repo)),
        claude("assistant", "a1", 1, [{"type": "text", "text": "Renamed it."}], session="s1", cwd=str(repo))])
    assert cli("run", "ingest", f"--from=claude={logs}", cwd=repo).exit_code == 0
    monkeypatch.setenv("CTX_NOTEBOOK_ROOT", str(repo))
    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("text", "")) for o in outputs)
    assert "python" in text and "markdown" in text  # the per-language table saw the fixture's files
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the histogram cell rendered no image"
    if path.stem == "analytics":  # languages, index history and sessions per day each drew a figure
        assert len(images) == 3, [cell.source[:40] for cell in notebook.cells]

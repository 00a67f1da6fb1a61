"""The service's project watcher, in process: the lake's own writes under .ctx/ and git's under
.git/ are not changes to the project (readers redo their freshness check when the count moves),
and a batch waits while the service warms its imports."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_helpers import PROJECT

from ctxlake.serve.service.engine import EngineCache
from ctxlake.serve.service.watchers import ProjectWatcher, imports_ready


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_lake_and_git_writes_do_not_move_the_watchers_count(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    watcher = ProjectWatcher(repo, EngineCache(), log=lambda line: None)
    watcher.start()
    try:
        # The watch is set up when a project write is seen (applied as one batch: two counts).
        target = repo / "src" / "billing" / "refund.py"
        wait_for(lambda: (target.write_text(f"def refund_{time.monotonic_ns()}():\n    pass\n"),
                          time.sleep(0.3), watcher.batches >= 1)[-1], 60, "the watcher's first batch")
        wait_for(lambda: watcher.changes % 2 == 0 and not watcher.pending, 30, "the batch to finish")
        time.sleep(1.0)
        before = watcher.changes

        for i in range(5):  # what a commit of the lake and a git command write
            (repo / ".ctx" / f"scratch-{i}.tmp").write_text("x" * 100)
            (repo / ".git" / f"scratch-{i}.tmp").write_text("x")
            time.sleep(0.1)
        time.sleep(1.5)  # several debounce windows
        assert watcher.changes == before, "writes under .ctx/ or .git/ moved the count"

        (repo / "src" / "new_module.py").write_text("def fresh_name():\n    return 1\n")
        wait_for(lambda: watcher.changes >= before + 2, 30, "a project write to be counted")
        assert watcher.error is None
    finally:
        watcher.stop_event.set()
        watcher.join(15)


def test_a_batch_waits_while_the_service_warms_its_imports(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    imports_ready.clear()  # what the service does while one thread imports the pipeline
    watcher = ProjectWatcher(repo, EngineCache(), log=lambda line: None)
    watcher.start()
    try:
        target = repo / "src" / "billing" / "refund.py"
        wait_for(lambda: (target.write_text(f"def refund_{time.monotonic_ns()}():\n    pass\n"),
                          time.sleep(0.3), bool(watcher.pending))[-1], 60, "the watcher to see an edit")
        time.sleep(1.0)
        assert watcher.batches == 0 and watcher.pending, "the batch ran during the warm-up"
        imports_ready.set()
        wait_for(lambda: watcher.batches >= 1 and not watcher.pending, 60, "the batch after the warm-up")
    finally:
        imports_ready.set()
        watcher.stop_event.set()
        watcher.join(15)


def test_the_service_warm_up_imports_the_pipeline_the_cli_and_the_read_path() -> None:
    """In a fresh interpreter: none of them before, all of them after (the first edit after
    `ctx up`, the first forwarded command and the UI's first page of data then find them loaded)."""
    wanted = ["ctxlake.flows.watch_code", "ctxlake.flows.index_code", "ctxlake.serve.cli.app",
              "ctxlake.serve.api.code_search", "ctxlake.serve.api.index_status", "ctxlake.serve.api.context_search",
              "ctxlake.serve.api.memory_sessions", "ctxlake.serve.api.source_queries",
              "ctxlake.serve.api.overview", "prefect", "lancedb"]
    script = (
        "import sys\n"
        "from ctxlake.serve.service.daemon import _warm_imports\n"
        f"wanted = {wanted!r}\n"
        "before = [m for m in wanted if m in sys.modules]\n"
        "_warm_imports()\n"
        "print(before, [m for m in wanted if m not in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr


def test_a_starting_watcher_applies_what_changed_while_nothing_watched(
        make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> None:
    from ctxlake.schemas.config import load_settings
    from ctxlake.schemas.tables import PROJECT_SOURCE
    from ctxlake.tasks import freshness

    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    # Edits made before the watch begins (the service was down, or the watch was still being set up).
    (repo / "src" / "billing" / "refund.py").write_text("def refund_while_down():\n    return 0\n")
    (repo / "src" / "added_while_down.py").write_text("def brand_new_while_down():\n    return 1\n")
    watcher = ProjectWatcher(repo, EngineCache(), log=lambda line: None)
    watcher.start()
    try:
        wait_for(lambda: watcher.batches >= 1 and not watcher.pending, 60, "the catch-up batch")
        settings = load_settings(repo)
        assert freshness.check(settings.lake_dir, PROJECT_SOURCE, repo, settings.index).up_to_date
        found = cli("search", "brand_new_while_down", "--mode", "keyword", "--json", cwd=repo)
        assert "src/added_while_down.py" in found.stdout
        assert watcher.error is None
    finally:
        watcher.stop_event.set()
        watcher.join(15)

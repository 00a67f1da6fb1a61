"""Watch mode: edits, creations, deletions, renames and a branch switch become searchable while watching."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers import git, write_files

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import code_lake, code_search

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

WAIT_S = 30.0  # generous: the machine running CI may be busy; the benchmark measures latency


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def symbols(root: Path, query: str) -> set[str]:
    lake = code_lake.Lake(load_settings(root))
    hits = code_search.search(lake, query, mode="keyword", limit=20, check_stale=False).hits
    return {name.strip() for h in hits if h.symbol for name in h.symbol.split(",")}


def paths_indexed(root: Path) -> set[str]:
    lake = code_lake.Lake(load_settings(root))
    return set(lake.files.search().select(["path"]).to_arrow().column("path").to_pylist())


@pytest.fixture
def watching(make_repo: Callable[..., Path]) -> Iterator[Path]:
    """A repo with a watcher running on a background thread of this process."""
    from ctxlake.flows.watch_code import request_stop, watch_code

    repo = make_repo({"pkg/alpha.py": "def alpha_function():\n    return 1\n", "README.md": "# R\n",
                      ".env": "API_TOKEN=not-a-real-one\n"})  # skipped by name: counted by status
    (repo / ".ctx").mkdir()
    settings = load_settings(repo)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            watch_code(settings)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # Watching starts after the initial index: wait for it, then give the watcher a moment to arm.
    wait_for(lambda: (repo / ".ctx" / "lake" / "state.json").exists() and "pkg/alpha.py" in paths_indexed(repo),
             "initial index", timeout=120)
    time.sleep(1.0)
    try:
        yield repo
    finally:
        request_stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "watcher did not stop"
        assert not errors, errors


def test_edits_creations_deletions_and_renames_become_searchable(watching: Path) -> None:
    repo = watching
    (repo / "pkg" / "alpha.py").write_text("def alpha_function():\n    return 1\n\n\ndef beta_edit():\n    return 2\n")
    wait_for(lambda: "beta_edit" in symbols(repo, "beta_edit"), "edit")

    write_files(repo, {"pkg/sub/gamma.py": "def gamma_created():\n    return 3\n"})
    wait_for(lambda: "gamma_created" in symbols(repo, "gamma_created"), "creation")

    (repo / "pkg" / "sub" / "gamma.py").rename(repo / "pkg" / "delta.py")
    wait_for(lambda: paths_indexed(repo) >= {"pkg/delta.py"} and "pkg/sub/gamma.py" not in paths_indexed(repo),
             "rename")

    (repo / "pkg" / "delta.py").unlink()
    wait_for(lambda: "pkg/delta.py" not in paths_indexed(repo) and not symbols(repo, "gamma_created"), "deletion")

    # Files the rules ignore stay out, and a new .gitignore takes effect.
    write_files(repo, {"build/out.py": "def built():\n    pass\n", "notes.log": "x"})
    write_files(repo, {".gitignore": "*.log\n"})
    wait_for(lambda: ".gitignore" in paths_indexed(repo), ".gitignore indexed")
    assert not {"build/out.py", "notes.log"} & paths_indexed(repo)

    # What the watcher leaves behind is exactly what a fresh scan would see: nothing stale.
    from ctxlake.schemas.tables import PROJECT_SOURCE
    from ctxlake.tasks import freshness

    settings = load_settings(repo)
    wait_for(lambda: freshness.check(settings.lake_dir, PROJECT_SOURCE, repo, settings.index).up_to_date,
             "lake matches the tree")


def test_a_watched_import_follows_the_file_it_names(watching: Path) -> None:
    """The import rows of a file the batch does not touch are resolved again when the file they
    name comes or goes (the watcher's paths also dropped the removed ones only from this change)."""
    from ctxlake.tasks.graph_store import IMPORTS_TABLE
    from ctxlake.tasks.lake import connect

    repo = watching

    def resolved() -> list[str | None]:
        table = connect(repo / ".ctx" / "lake").open_table(IMPORTS_TABLE)
        return [r["resolved"] for r in table.to_arrow().to_pylist() if r["path"] == "user.py"]

    write_files(repo, {"user.py": "import helper\n\n\ndef use():\n    return helper.go()\n"})
    wait_for(lambda: resolved() == [None], "the importer, unresolved")
    write_files(repo, {"helper.py": "def go():\n    return 1\n"})
    wait_for(lambda: resolved() == ["helper.py"], "resolved once helper.py exists")
    (repo / "helper.py").unlink()
    wait_for(lambda: resolved() == [None], "unresolved once helper.py is gone")


def test_branch_switch_burst_is_batched(watching: Path) -> None:
    repo = watching
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base", "--allow-empty")
    git(repo, "checkout", "-q", "-b", "wide")
    write_files(repo, {f"gen/mod_{i:03d}.py": f"def generated_{i:03d}():\n    return {i}\n" for i in range(150)})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "many files")
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "wide")  # files vanish and come back, in bursts
    wait_for(lambda: sum(p.startswith("gen/") for p in paths_indexed(repo)) == 150, "150 files after checkout")
    assert "generated_149" in symbols(repo, "generated_149")
    git(repo, "checkout", "-q", "main")
    wait_for(lambda: not any(p.startswith("gen/") for p in paths_indexed(repo)), "files gone after checkout back")


def test_watch_subprocess_holds_the_lock_and_stops_on_ctrl_c(make_repo: Callable[..., Path], tmp_path: Path) -> None:
    repo = make_repo({"a.py": "def a():\n    return 1\n"})
    env = {**os.environ, "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}
    ctx = str(Path(sys.executable).parent / "ctx")
    proc = subprocess.Popen([ctx, "run", "index", "--watch"], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        def watcher_running() -> bool:
            out = subprocess.run([ctx, "status", "--json"], cwd=repo, env=env, capture_output=True, text=True)
            return out.returncode == 0 and (json.loads(out.stdout).get("writer") or {}).get(
                "purpose") == "ctx run index --watch"

        wait_for(watcher_running, "watcher in status", timeout=240)
        wait_for(lambda: (repo / ".ctx" / "lake" / "state.json").exists(), "first index", timeout=240)
        human = subprocess.run([ctx, "status"], cwd=repo, env=env, capture_output=True, text=True).stdout
        assert "watcher" in human and f"pid {proc.pid}" in human
        plain = subprocess.run([ctx, "run", "index"], cwd=repo, env=env, capture_output=True, text=True)
        assert plain.returncode == 0 and "keeps" in plain.stdout and "up to date" in plain.stdout
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.startswith("Watched ")
    assert json.loads(subprocess.run([ctx, "status", "--json"], cwd=repo, env=env, capture_output=True,
                                     text=True).stdout)["writer"] is None


SWALLOWED_INTERRUPT = """
import os, signal, sys, time
import ctxlake.flows.watch_code as watch
from ctxlake.serve.cli.app import run

first_index = watch.index_code

def index_then_ctrl_c(*args, **kwargs):
    report = first_index(*args, **kwargs)
    try:  # a Ctrl-C as Prefect ends the subflow: its engine swallowed it there
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    except KeyboardInterrupt:
        pass
    return report

watch.index_code = index_then_ctrl_c
sys.exit(run(["run", "index", "--watch"]))
"""


def test_a_ctrl_c_that_prefect_swallows_still_stops_the_watcher(make_repo: Callable[..., Path]) -> None:
    """A Ctrl-C landing while Prefect ended the first index run's subflow was lost there (its engine
    was joining its heartbeat thread), and the watcher went on watching: 1 in 3 SIGINTs sent as
    the watch began. The handler also asks the watch loop to stop, which nothing swallows."""
    repo = make_repo({"a.py": "def a():\n    return 1\n"})
    env = {**os.environ, "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWED_INTERRUPT], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the watcher went on after the Ctrl-C: {err[-2000:]}") from None
    assert proc.returncode == 0, err
    assert out.startswith("Watched "), out


def test_ctrl_c_in_a_terminal_after_a_batch_ends_the_watcher_cleanly(make_repo: Callable[..., Path]) -> None:
    """A terminal's Ctrl-C signals the whole process group, Prefect's temporary server included.
    After a batch was applied, the watcher used to hang (its last state updates retried against
    the dead server) or end in a traceback; it must end as after a plain SIGINT, leaving nothing."""
    repo = make_repo({"a.py": "def a():\n    return 1\n"})
    env = {**os.environ, "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}
    ctx = str(Path(sys.executable).parent / "ctx")
    proc = subprocess.Popen([ctx, "run", "index", "--watch"], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (repo / ".ctx" / "lake" / "state.json").exists(), "first index", timeout=240)
        (repo / "b.py").write_text("def ctrl_c_marker():\n    return 2\n")
        wait_for(lambda: "b.py" in paths_indexed(repo), "the edit applied", timeout=120)
        group = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # 0 with its summary, or 130 ("interrupted") when the signal came in the middle of a batch.
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "Error" not in err, err
    assert out.startswith("Watched ") or "interrupted" in err, out + err
    time.sleep(0.5)
    left = [p for p in group if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"left running: {left}"


def test_a_batch_keeps_the_count_of_secret_files_the_last_scan_skipped(watching: Path) -> None:
    """A batch looks only at the changed paths; `ctx status` must still say how many files the
    scan left out by name, not 0 after the first edit."""
    from ctxlake.tasks.lake import IndexState

    def secret_skipped() -> int:
        state = IndexState.read(watching / ".ctx" / "lake")
        return int((((state.last_run if state else None) or {}).get("skipped") or {}).get("secret", -1))

    assert secret_skipped() == 1
    (watching / "pkg" / "gamma.py").write_text("def gamma_batch_marker():\n    return 3\n")
    wait_for(lambda: "pkg/gamma.py" in paths_indexed(watching), "the batch")
    assert secret_skipped() == 1


def test_a_batch_of_files_that_are_not_indexed_moves_the_snapshot(watching: Path) -> None:
    """Only a secret-named file goes and another comes: nothing to write to the lake, but `ctx
    status --skipped` reads the snapshot, which must follow (it listed the deleted file)."""
    from ctxlake.tasks.merkle import not_indexed

    lake = watching / ".ctx" / "lake"
    assert [path for path, _, _ in not_indexed(lake, "project")] == [".env"]
    (watching / ".env").unlink()
    (watching / "id_rsa").write_text("not a key\n")
    wait_for(lambda: [path for path, _, _ in not_indexed(lake, "project")] == ["id_rsa"], "the snapshot")

"""Shared fixtures: isolated homes, real git repos in tmp, a Prefect test server, the CLI in-process."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# Before anything imports Prefect or transformers: a private Prefect home, quiet logs, offline.
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="ctx-tests-"))
os.environ.setdefault("PREFECT_HOME", str(_SESSION_TMP / "prefect"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
# A cold Prefect server (fresh venv, migrations) on a busy 2-core machine can take minutes to start.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from helpers import git, write_files  # noqa: E402  (after the environment is set)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One temporary Prefect API server for the whole session (its start costs ~10 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.fixture(autouse=True)
def ctx_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own user data dir (embedding cache, models), so counts are its own."""
    home = tmp_path_factory.mktemp("ctx-home")
    monkeypatch.setenv("CTX_HOME", str(home))
    for key in [k for k in os.environ if k.startswith("CTX_") and k != "CTX_HOME"]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    # Models distilled once are expensive; share them across tests through a session folder.
    return home


@pytest.fixture
def fake_embedder(monkeypatch: pytest.MonkeyPatch) -> type:
    """Select the deterministic fake embedder through the environment, counters reset."""
    from ctxlake.tasks.embedders import FakeEmbedder

    monkeypatch.setenv("CTX_EMBED_PROVIDER", "fake")
    monkeypatch.setenv("CTX_EMBED_MODEL", "hash")
    FakeEmbedder.reset_counters()
    return FakeEmbedder


@pytest.fixture
def make_repo(tmp_path: Path) -> Callable[..., Path]:
    """Create a real git repository with the given files committed."""

    def make(files: dict[str, str | bytes], name: str = "repo", commit: bool = True) -> Path:
        repo = tmp_path / name
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
        write_files(repo, files)
        if commit:
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", "initial", "--allow-empty")
        return repo

    return make


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run `ctx ARGS` in this process (sharing the session's Prefect server) from folder `cwd`."""
    from ctxlake.serve.cli.app import run

    def invoke(*args: str, cwd: Path) -> CliResult:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = run(list(args))
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return invoke



"""Readers during writes, and write failures: queries never fail, a failed write leaves the old index readable."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import write_files

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import code_lake, code_search, ranked_lists

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")


def many_files(n: int, version: int) -> dict[str, str]:
    return {
        f"src/module_{i:02d}.py": "".join(
            f"def handler_{i}_{j}(request):\n    '''Handle request {j} (v{version}).'''\n"
            f"    return request.value * {j + version}\n\n\n" for j in range(6))
        for i in range(n)
    }


def test_queries_in_a_loop_during_reindex_never_fail(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    repo = make_repo(many_files(40, 1))
    assert cli("run", "index", cwd=repo).exit_code == 0
    settings = load_settings(repo)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"queries": 0}
    empty: list[str] = []  # the modes that came back empty
    long_lived = code_lake.Lake(settings)  # like the MCP server: opened once, reads on

    def reader() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                lake = long_lived if i % 2 else code_lake.Lake(settings)
                mode = ("keyword", "hybrid", "fuzzy", "semantic")[i % 4]
                result = code_search.search(lake, "handle request value", mode=mode, check_stale=False)  # type: ignore[arg-type]
                counts["queries"] += 1
                # Semantic hits may be missing while new chunks wait for vectors, and then it says so.
                waiting = mode == "semantic" and any("no chunk has a vector yet" in w for w in result.warnings)
                if not result.hits and not waiting:
                    empty.append(f"{mode} {result.warnings}")
            except BaseException as exc:  # every failure is recorded and fails the test
                errors.append(exc)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        write_files(repo, many_files(40, 2))  # every file changes
        assert cli("run", "index", cwd=repo).exit_code == 0
        assert cli("run", "index", "--force", cwd=repo).exit_code == 0
        write_files(repo, many_files(20, 3))
        for i in range(20, 40):
            (repo / "src" / f"module_{i:02d}.py").unlink()
        assert cli("run", "index", cwd=repo).exit_code == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors[:3]
    assert counts["queries"] > 20
    assert not empty, f"a reader saw an empty or half-written index: {empty[:5]}"


def test_a_failed_write_is_one_clear_error_and_the_old_index_stays_readable(
    make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(many_files(5, 1))
    assert cli("run", "index", cwd=repo).exit_code == 0
    before = json.loads(cli("search", "handler_3_2", "--mode", "keyword", "--json", cwd=repo).stdout)
    write_files(repo, many_files(5, 2))

    import lancedb.merge

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as fault:
        fault.setattr(lancedb.merge.LanceMergeInsertBuilder, "execute", disk_full)
        failed = cli("run", "index", cwd=repo)
    assert failed.exit_code == 8
    assert "ctx: error: cannot write chunks: No space left on device" in failed.stderr
    assert "Traceback" not in failed.stderr
    after = json.loads(cli("search", "handler_3_2", "--mode", "keyword", "--json", cwd=repo).stdout)
    assert after["hits"] == before["hits"]
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["clean"] is False  # and the next run repairs it
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert "(v2)" in json.loads(cli("search", "handler_3_2", "--mode", "keyword", "--json", cwd=repo).stdout)[
        "hits"][0]["snippet"]


def small_indexed_lake(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> tuple[Path, code_lake.Lake]:
    """A three-file repository, indexed, and a reader opened on it."""
    repo = make_repo(many_files(3, 1))
    assert cli("run", "index", cwd=repo).exit_code == 0
    return repo, code_lake.Lake(load_settings(repo))


def test_a_semantic_query_that_read_a_version_without_vectors_asks_again(
    make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, lake = small_indexed_lake(make_repo, cli)
    real = ranked_lists.semantic_rows
    calls: list[int] = []

    def first_read_between_write_and_vectors(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return [] if len(calls) == 1 else real(*args, **kwargs)  # the chunks' version, vectors not yet in

    monkeypatch.setattr(code_search, "semantic_rows", first_read_between_write_and_vectors)
    result = code_search.search(lake, "handle request value", mode="semantic", check_stale=False)
    assert result.hits and len(calls) == 2 and result.warnings == []


def test_a_semantic_query_right_after_a_rewrite_without_vectors_says_so(
    make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader memoises the table's version for VERSION_MEMO_S; a re-index that replaced every
    # chunk with one waiting for its vector inside that window once gave a silent empty answer.
    repo, lake = small_indexed_lake(make_repo, cli)
    assert code_search.search(lake, "handle request value", mode="semantic", check_stale=False).hits
    monkeypatch.setattr(code_lake, "VERSION_MEMO_S", 3600.0)  # the window, held open
    write_files(repo, many_files(3, 2))
    assert cli("run", "index", "--no-embed", cwd=repo).exit_code == 0
    result = code_search.search(lake, "handle request value", mode="semantic", check_stale=False)
    assert not result.hits
    assert any("no chunk has a vector yet" in w for w in result.warnings), result.warnings

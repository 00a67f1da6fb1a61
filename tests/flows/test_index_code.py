"""index_code scenarios through the real CLI: incremental re-embedding, renames, deletes, bad input."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import ctx_subprocess, git, permission_bound, write_files

from ctxlake.flows import index_code
from ctxlake.schemas.config import load_settings
from ctxlake.tasks.lake import CHUNKS_TABLE, FILES_TABLE, IndexState, WriterLock, connect

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

APP = '''"""User service."""

import json


class UserService:
    """Looks users up."""

    def __init__(self, db):
        self.db = db

    def getUserById(self, user_id):
        row = self.db.get(user_id)
        return json.loads(row) if row else None

    def delete_user(self, user_id):
        self.db.delete(user_id)
        return True
'''

UTIL = '''def parse_date(text):
    """Parse an ISO date string into a tuple."""
    year, month, day = text.split("-")
    return int(year), int(month), int(day)


def format_date(value):
    return "-".join(str(v) for v in value)
'''

README = "# Demo\n\nA tiny service used by the tests.\n\n## Usage\n\nCall `getUserById`.\n"


def lake_rows(root: Path, table: str, columns: list[str]) -> list[dict[str, Any]]:
    db = connect(root / ".ctx" / "lake")
    rows: list[dict[str, Any]] = db.open_table(table).search().select(columns).to_arrow().to_pylist()
    return rows


def chunk_paths(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in lake_rows(root, CHUNKS_TABLE, ["path"]):
        out[row["path"]] = out.get(row["path"], 0) + 1
    return out


@pytest.fixture
def project(make_repo: Callable[..., Path]) -> Path:
    return make_repo({"app/service.py": APP, "app/util.py": UTIL, "README.md": README})


def test_first_run_creates_project_and_indexes(project: Path, cli: Callable[..., Any], fake_embedder: Any) -> None:
    result = cli("run", "index", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["added"], report["modified"], report["removed"]) == (3, 0, 0)
    assert "Created" in result.stderr and (project / ".ctx" / "config.toml").is_file()
    assert (project / ".ctx" / ".gitignore").read_text() == "lake/\n"
    assert set(chunk_paths(project)) == {"app/service.py", "app/util.py", "README.md"}
    symbols = {r["symbol"] for r in lake_rows(project, CHUNKS_TABLE, ["symbol"])}
    assert {"UserService.getUserById", "parse_date"} <= {s for sym in symbols if sym for s in sym.split(", ")}
    # Every chunk got a vector; each distinct text was embedded once.
    n_chunks = sum(chunk_paths(project).values())
    assert report["embedded"] == fake_embedder.texts_embedded <= n_chunks
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and state.clean and state.pending_vectors == 0
    assert state.model_id == "fake:hash:64"


def test_an_index_run_bounds_its_heap_and_trims_between_stages(
    project: Path, cli: Callable[..., Any], fake_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The big repository's run kept freed pages per thread and between stages
    (docs/measurements/indexing.md, "One big repository"): `ctx run index` asks for two arenas
    before Prefect starts, and the flow gives freed pages back after the chunk stage, the BM25
    build, the embed stage and each vector write."""
    from ctxlake.tasks import embed, heap

    bounded: list[int | None] = []
    trims: list[str] = []
    monkeypatch.setattr(heap, "bound_heap", lambda mmap_bytes=heap.HEAP_MMAP_BYTES: bounded.append(mmap_bytes) or True)
    monkeypatch.setattr(index_code, "give_back_freed_memory", lambda: trims.append("flow"))
    monkeypatch.setattr(embed, "give_back_freed_memory", lambda: trims.append("vectors"))
    monkeypatch.setattr(index_code, "INLINE_EMBED_FILES", 0)  # a cold run's rows wait for the embed stage
    result = cli("run", "index", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert bounded == [None]
    assert trims.count("flow") == 3 and trims.count("vectors") >= 1
    assert json.loads(result.stdout)["embedded"] > 0


def test_a_big_run_drops_its_import_suffix_index_and_a_small_one_keeps_it(
    project: Path, cli: Callable[..., Any], fake_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imports resolve through an index of every path suffix (~90 MB for 100,000 paths,
    docs/measurements/indexing.md, "One big repository"): a run past the inline-embedding size lets
    it go before its embed stage; a small edit keeps it for the next one (the service's runs reuse
    it)."""
    from ctxlake.tasks import graph

    paths = frozenset({"app/service.py", "app/util.py", "README.md"})
    graph._known_kept.clear()
    with monkeypatch.context() as big:
        big.setattr(index_code, "INLINE_EMBED_FILES", 2)  # three files make a big run here
        assert cli("run", "index", cwd=project).exit_code == 0
    assert paths not in graph._known_kept
    (project / "app" / "util.py").write_text(UTIL + "\n\ndef one_more():\n    return 1\n")
    assert cli("run", "index", cwd=project).exit_code == 0
    assert paths in graph._known_kept


def test_edit_reembeds_only_that_file_then_delete_removes_its_chunks(
    project: Path, cli: Callable[..., Any], fake_embedder: Any
) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    before = {r["id"]: r for r in lake_rows(project, CHUNKS_TABLE, ["id", "path", "text"])}
    fake_embedder.reset_counters()

    service = project / "app" / "service.py"
    service.write_text(APP.replace("return True", "return self.db.count() > 0"))
    result = cli("run", "index", "--json", cwd=project)
    report = json.loads(result.stdout)
    assert (report["added"], report["modified"], report["removed"]) == (0, 1, 0)
    after = {r["id"]: r for r in lake_rows(project, CHUNKS_TABLE, ["id", "path", "text"])}
    new_ids = set(after) - set(before)
    # Only chunks of the edited file changed, and only their new texts went to the model.
    assert new_ids and {after[i]["path"] for i in new_ids} == {"app/service.py"}
    assert {before[i]["path"] for i in set(before) - set(after)} == {"app/service.py"}
    new_texts = {after[i]["text"] for i in new_ids} - {r["text"] for r in before.values()}
    assert fake_embedder.texts_embedded == len(new_texts) > 0

    service.unlink()
    fake_embedder.reset_counters()
    report = json.loads(cli("run", "index", "--json", cwd=project).stdout)
    assert report["removed"] == 1
    assert "app/service.py" not in chunk_paths(project)
    assert {r["path"] for r in lake_rows(project, FILES_TABLE, ["path"])} == {"app/util.py", "README.md"}
    assert fake_embedder.texts_embedded == 0


def test_rename_embeds_nothing(project: Path, cli: Callable[..., Any], fake_embedder: Any) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    fake_embedder.reset_counters()
    (project / "app" / "util.py").rename(project / "app" / "dates.py")
    report = json.loads(cli("run", "index", "--json", cwd=project).stdout)
    assert (report["added"], report["removed"]) == (1, 1)
    assert fake_embedder.texts_embedded == 0
    assert report["vectors_from_cache"] > 0
    assert "app/util.py" not in chunk_paths(project) and "app/dates.py" in chunk_paths(project)
    vectors = lake_rows(project, CHUNKS_TABLE, ["vector"])
    assert all(r["vector"] is not None for r in vectors)


def test_noop_is_decided_without_prefect(project: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    # A fresh process pointed at an unreachable Prefect API: any flow run would fail.
    done = ctx_subprocess("run", "index", cwd=project, env={
        "PREFECT_API_URL": "http://127.0.0.1:9/api", "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash",
        "CTX_HOME": os.environ["CTX_HOME"]})
    assert done.returncode == 0, done.stderr
    assert "Up to date" in done.stdout


def test_force_reembeds_everything(project: Path, cli: Callable[..., Any], fake_embedder: Any) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    first = fake_embedder.texts_embedded
    fake_embedder.reset_counters()
    report = json.loads(cli("run", "index", "--force", "--json", cwd=project).stdout)
    assert fake_embedder.texts_embedded == first == report["embedded"]
    assert report["vectors_from_cache"] == 0


def test_model_change_needs_force(project: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    monkeypatch.setenv("CTX_EMBED_DIMENSIONS", "32")
    result = cli("run", "index", cwd=project)
    assert result.exit_code == 6
    assert "index was built with fake:hash:64, config says fake:hash:32" in result.stderr
    assert "ctx run index --force" in result.stderr
    searched = cli("search", "user", "--mode", "semantic", cwd=project)
    assert searched.exit_code == 6
    assert cli("run", "index", "--force", cwd=project).exit_code == 0
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and state.model_id == "fake:hash:32" and state.dims == 32


def test_bad_input_is_skipped_and_counted(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    long_file = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(7000))  # 21,000 lines
    repo = make_repo({
        "ok.py": "def ok():\n    return 1\n",
        "long.py": long_file,
        "latin1.py": "s = 'caf\xe9'\n".encode("latin-1") * 50,
        "mostly_utf8.txt": b"hello \xff world\n" + b"fine line\n" * 200,
        "blob.bin2": b"\x00\x01\x02binary",
        "logo.png": b"\x89PNG\r\n\x1a\n",
    })
    with open(repo / "huge.log", "wb") as fh:  # 50 MB, sparse: never read
        fh.truncate(50 * 1024 * 1024)
    result = cli("run", "index", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["skipped"] == {"binary": 2, "too_large": 1, "undecodable": 1}
    assert any("latin1.py: skipped, not UTF-8" in w for w in report["warnings"])
    assert any("mostly_utf8.txt: 1 invalid UTF-8" in w for w in report["warnings"])
    paths = chunk_paths(repo)
    assert set(paths) == {"ok.py", "long.py", "mostly_utf8.txt"}
    spans = [(r["start_line"], r["end_line"]) for r in lake_rows(repo, CHUNKS_TABLE, ["path", "start_line", "end_line"])
             if r["path"] == "long.py"]
    covered = set().union(*(range(a, b + 1) for a, b in spans))
    assert covered == set(range(1, 21001))


def test_a_file_name_that_is_not_utf8_is_skipped_and_the_rest_indexed(
        make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    repo = make_repo({"ok.py": "def ok():\n    return 1\n"}, commit=False)
    with open(os.fsencode(repo) + b"/bad\xffname.py", "wb") as fh:
        fh.write(b"def f():\n    pass\n")
    result = cli("run", "index", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["skipped"] == {"bad_name": 1}
    assert any("bad\\xffname.py" in w and "not valid UTF-8" in w for w in report["warnings"])
    assert set(chunk_paths(repo)) == {"ok.py"}
    skipped = cli("status", "--skipped", "--json", cwd=repo)
    assert skipped.exit_code == 0, skipped.stderr
    assert [(r["path"], r["reason"]) for r in json.loads(skipped.stdout)["not_indexed"]] == [
        ("bad\\xffname.py", "bad_name")]
    again = cli("status", "--json", cwd=repo)
    assert json.loads(again.stdout)["stale"] is False


def test_unreadable_files_and_folders_are_warned_about_once_listed_and_indexed_once_permitted(
        make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    repo = make_repo({"ok.py": "def ok():\n    return 1\n", "locked.py": "def locked():\n    return 2\n",
                      "shut/inner.py": "def inner():\n    return 3\n"}, commit=False)
    (repo / "locked.py").chmod(0)
    (repo / "shut").chmod(0)
    try:
        via = permission_bound(repo / "locked.py")
        done = ctx_subprocess("run", "index", cwd=repo, via=via)
    finally:
        (repo / "shut").chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert "skipped: 1 unreadable, 1 unreadable_folder" in done.stdout
    warned = [line for line in done.stderr.splitlines() if "could not be read" in line]
    assert len(warned) == 1 and "locked.py, shut/" in warned[0] and "ctx status --skipped" in warned[0], done.stderr
    assert set(chunk_paths(repo)) == {"ok.py"}
    skipped = cli("status", "--skipped", "--json", cwd=repo)
    assert skipped.exit_code == 0, skipped.stderr
    assert [(r["path"], r["reason"]) for r in json.loads(skipped.stdout)["not_indexed"]] == [
        ("locked.py", "unreadable"), ("shut", "unreadable_folder")]
    listed = cli("status", "--skipped", cwd=repo).stdout
    assert "unreadable_folder (1): a folder that could not be listed" in listed and "  shut/\n" in listed
    # Permissions given back (chmod leaves mtimes alone): the next run reads both.
    (repo / "locked.py").chmod(0o644)
    again = cli("run", "index", "--json", cwd=repo)
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["added"] == 2 and "could not be read" not in again.stderr
    assert set(chunk_paths(repo)) == {"ok.py", "locked.py", "shut/inner.py"}
    assert json.loads(cli("status", "--skipped", "--json", cwd=repo).stdout)["not_indexed"] == []


def test_a_file_made_unreadable_after_indexing_leaves_the_index(
        make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    """chmod keeps a file's mtime, so a scan that trusted (size, mtime) kept serving its old chunks."""
    repo = make_repo({"ok.py": "def ok():\n    return 1\n", "locked.py": "def locked():\n    return 2\n"},
                     commit=False)
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert set(chunk_paths(repo)) == {"ok.py", "locked.py"}
    (repo / "locked.py").chmod(0)
    try:
        via = permission_bound(repo / "locked.py")
        done = ctx_subprocess("run", "index", cwd=repo, via=via)
        assert done.returncode == 0, done.stderr
        assert "locked.py" in done.stderr and "could not be read" in done.stderr, done.stderr
        assert set(chunk_paths(repo)) == {"ok.py"}
        found = ctx_subprocess("search", "locked", "--mode", "keyword", cwd=repo, via=via)
        assert found.returncode == 0 and "locked.py" not in found.stdout, found.stdout
    finally:
        (repo / "locked.py").chmod(0o644)
    again = cli("run", "index", "--json", cwd=repo)
    assert again.exit_code == 0, again.stderr
    assert set(chunk_paths(repo)) == {"ok.py", "locked.py"}


def test_empty_repo_and_missing_path(make_repo: Callable[..., Path], cli: Callable[..., Any], tmp_path: Path) -> None:
    repo = make_repo({}, name="empty")
    result = cli("run", "index", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["files_seen"] == 0
    assert cli("search", "anything", "--mode", "keyword", cwd=repo).exit_code == 0
    missing = cli("run", "index", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.exit_code == 2 and "path does not exist" in missing.stderr


def test_second_writer_is_refused_and_dead_lock_taken_over(project: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    lake = project / ".ctx" / "lake"
    write_files(project, {"new.py": "x = 1\n"})
    held = WriterLock(lake, purpose="test holder").acquire()
    try:
        busy = cli("run", "index", cwd=project)
        assert busy.exit_code == 5
        assert f"pid {os.getpid()} (test holder" in busy.stderr
    finally:
        held.release()
    # A lock file left by a process that is gone (the kernel already dropped its flock).
    (lake / "writer.lock").write_text(json.dumps({"pid": 999_999, "purpose": "ctx run index"}))
    taken = cli("run", "index", cwd=project)
    assert taken.exit_code == 0
    assert "Took over the lock of an indexer that ended without releasing it (pid 999999" in taken.stderr


def test_interrupted_run_is_repaired_by_the_next(project: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    write_files(project, {"app/extra.py": "def extra():\n    return 42\n"})
    (project / "app" / "util.py").write_text(UTIL.replace("int(day)", "int(day or 1)"))

    from ctxlake.tasks import embed

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as fault:
        fault.setattr(embed.embed_pending, "fn", interrupted)
        fault.setattr(embed.embed_pending, "_task", None)
        # Rows written without vectors, then the embed stage interrupted (an edit this small would
        # otherwise be encoded before its rows are written).
        fault.setattr(index_code, "INLINE_EMBED_FILES", 0)
        result = cli("run", "index", cwd=project)
    embed.embed_pending._task = None  # rebuild the Prefect task around the real function
    assert result.exit_code == 130 and "interrupted" in result.stderr
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and not state.clean
    # The user reverts one of the files before re-running: the journal still makes it redone.
    (project / "app" / "util.py").write_text(UTIL)
    repaired = cli("run", "index", "--json", cwd=project)
    assert repaired.exit_code == 0, repaired.stderr
    rows = lake_rows(project, CHUNKS_TABLE, ["path", "text", "vector"])
    assert all(r["vector"] is not None for r in rows)
    util_text = "\n".join(r["text"] for r in rows if r["path"] == "app/util.py")
    assert "int(day or 1)" not in util_text and "int(day)" in util_text
    assert any(r["path"] == "app/extra.py" for r in rows)


def test_small_edit_lands_with_its_vectors_and_skips_the_embed_stage(project: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    write_files(project, {"app/extra.py": "def brand_new_helper():\n    return 'never seen before'\n"})
    from ctxlake.tasks import embed

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the embed stage ran for a one-file edit")

    with pytest.MonkeyPatch.context() as fault, counted_filters() as counted:
        fault.setattr(embed.embed_pending, "fn", must_not_run)
        fault.setattr(embed.embed_pending, "_task", None)
        result = cli("run", "index", "--json", cwd=project)
    embed.embed_pending._task = None
    assert result.exit_code == 0, result.stderr
    # Nor did it count the rows without a vector: that reads the whole vector column (seconds and
    # hundreds of MB on a big lake), and a run that found all embedded and wrote none without knows.
    assert counted and "vector IS NULL" not in counted, counted
    report = json.loads(result.stdout)
    assert report["embedded"] >= 1 and report["added"] == 1
    rows = lake_rows(project, CHUNKS_TABLE, ["path", "vector"])
    assert any(r["path"] == "app/extra.py" for r in rows)
    assert all(r["vector"] is not None for r in rows)
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and state.clean and state.pending_vectors == 0

    # Each run is a new writer with its own cache object; the run's end still checks the cache,
    # so one-file edits do not pile fragments into its side table.
    from ctxlake.tasks import embed_cache
    from ctxlake.tasks.embedders import make_embedder
    from ctxlake.tasks.store import fragment_count

    with pytest.MonkeyPatch.context() as small:
        small.setattr(embed_cache, "RECENT_OPTIMIZE_FRAGMENTS", 3)
        for i in range(6):
            write_files(project, {"app/extra.py": f"def brand_new_helper():\n    return 'edit {i}'\n"})
            assert cli("run", "index", cwd=project).exit_code == 0
            settings = load_settings(project)
            model = make_embedder(settings.embed, settings.models_dir)
            cache = embed_cache.EmbeddingCache(settings.cache_dir, model.model_id, model.dims)
            assert fragment_count(cache.recent) <= 3

    # Many files at once go through the embed stage as before.
    write_files(project, {f"app/bulk{i}.py": f"def bulk_{i}():\n    return {i}\n" for i in range(12)})
    stage = embed.embed_pending.fn
    asked: list[str | None] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("pending_where"))
        return stage(*args, **kwargs)

    with counted_filters() as counted, pytest.MonkeyPatch.context() as spy:
        spy.setattr(embed.embed_pending, "fn", recording)
        spy.setattr(embed.embed_pending, "_task", None)
        bulk = cli("run", "index", "--json", cwd=project)
    embed.embed_pending._task = None
    assert bulk.exit_code == 0 and json.loads(bulk.stdout)["embedded"] >= 12
    assert all(r["vector"] is not None for r in lake_rows(project, CHUNKS_TABLE, ["vector"]))
    # The lake was fully embedded before: the rows without a vector are among this run's, found
    # by id (counted once, for the state; the stage starts from that count and reads them by id)
    # rather than by a scan of every row's vector; nothing is counted after the stage.
    assert "vector IS NULL" not in counted, counted
    assert [f for f in counted if f and f.startswith("vector IS NULL AND id IN (")] == [asked[0]], counted
    assert len(asked) == 1 and asked[0] is not None and asked[0].count("'") >= 2 * 12
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and state.clean and state.pending_vectors == 0


_opened: list[str] | None = None  # while set, the paths the interpreter opens (see opened_files)


def _record_open(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        _opened.append(os.fspath(args[0]))


sys.addaudithook(_record_open)  # an audit hook cannot be removed: it records only inside opened_files


@contextmanager
def opened_files() -> Iterator[list[str]]:
    """The files opened meanwhile (any mode), as the interpreter's "open" audit events report them."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def test_a_run_reads_state_json_once(project: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    write_files(project, {"app/util.py": UTIL + "\n\ndef another():\n    return 2\n"})
    state_file = str(project / ".ctx" / "lake" / "state.json")
    with opened_files() as opened:
        report = index_code.index_code(load_settings(project))
    assert report.modified == 1
    assert opened.count(state_file) == 1, [p for p in opened if p.endswith(".json")]


@contextmanager
def counted_filters() -> Iterator[list[str | None]]:
    """The filters of the `count_rows` calls on any table made meanwhile, in order."""
    from lancedb.table import LanceTable

    counted: list[str | None] = []
    count_rows = LanceTable.count_rows

    def counting(self: LanceTable, filter: str | None = None) -> int:
        counted.append(filter)
        return count_rows(self, filter)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LanceTable, "count_rows", counting)
        yield counted


def test_config_file_and_env_precedence(project: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    config = project / ".ctx" / "config.toml"
    # Section lines are commented in the generated file too (so appended tables never clash).
    config.write_text(config.read_text().replace("# [search]", "[search]")
                      .replace('# mode = "hybrid"', 'mode = "keyword"').replace("# limit = 10", "limit = 1"))
    settings = load_settings(project)
    assert (settings.search.mode, settings.search.limit) == ("keyword", 1)
    monkeypatch.setenv("CTX_SEARCH_LIMIT", "2")
    out = json.loads(cli("search", "user", "--json", cwd=project).stdout)
    assert out["mode"] == "keyword" and len(out["hits"]) == 2
    config.write_text("[serach]\nmode = 1\n")
    bad = cli("status", cwd=project)
    assert bad.exit_code == 3 and "unknown section(s) serach" in bad.stderr


def test_git_checkout_of_another_branch_is_picked_up(project: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=project).exit_code == 0
    git(project, "checkout", "-q", "-b", "feature")
    write_files(project, {"app/feature.py": "def feature_flag():\n    return 'on'\n"})
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "feature")
    assert cli("run", "index", cwd=project).exit_code == 0
    assert "app/feature.py" in chunk_paths(project)
    git(project, "checkout", "-q", "main")
    report = json.loads(cli("run", "index", "--json", cwd=project).stdout)
    assert report["removed"] == 1 and "app/feature.py" not in chunk_paths(project)


def test_emptied_lake_can_be_written_again(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    # A LanceTable with no rows is falsy: the chunks table must be reopened, not created again.
    repo = make_repo({"a.py": "x = 1\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    (repo / "a.py").unlink()
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert chunk_paths(repo) == {}
    write_files(repo, {"b.py": "def b():\n    return 2\n"})
    result = cli("run", "index", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert chunk_paths(repo) == {"b.py": 1}


def test_small_edits_defer_optimizing_yet_stay_searchable(project: Path, cli: Callable[..., Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.flows import index_code

    assert cli("run", "index", cwd=project).exit_code == 0  # a first build optimizes
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and state.unoptimized_rows == 0
    monkeypatch.setattr(index_code, "OPTIMIZE_AFTER_ROWS", 5)
    backlog = []
    for i in range(3):
        (project / "app" / f"extra{i}.py").write_text(f"def deferred_helper_{i}():\n    return {i}\n")
        assert cli("run", "index", cwd=project).exit_code == 0
        found = json.loads(cli("search", f"deferred_helper_{i}", "--mode", "keyword", "--json", cwd=project).stdout)
        assert f"app/extra{i}.py" in [h["path"] for h in found["hits"]]  # searchable before any optimize
        state = IndexState.read(project / ".ctx" / "lake")
        assert state is not None
        backlog.append(state.unoptimized_rows)
    # Each one-file run adds its rows (one chunk inserted, one embedded) to the backlog until
    # the threshold (5) makes the third run optimize.
    assert backlog == [2, 4, 0]


def test_a_run_in_the_service_leaves_a_due_optimize_to_the_watcher(project: Path, cli: Callable[..., Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The service sets OPTIMIZE_ELSEWHERE_ENV around a run in its own process: an optimize there
    would map pylance into the service for good; its watcher runs it in a child instead."""
    from ctxlake.flows import index_code
    from ctxlake.tasks import store

    assert cli("run", "index", cwd=project).exit_code == 0  # a first build optimizes, wherever it runs
    monkeypatch.setattr(index_code, "OPTIMIZE_AFTER_ROWS", 1)
    monkeypatch.setenv(index_code.OPTIMIZE_ELSEWHERE_ENV, "1")

    def in_this_process(*_: Any, **__: Any) -> None:
        raise AssertionError("the run optimized in its own process")

    monkeypatch.setattr(store, "optimize", in_this_process)
    monkeypatch.setattr(index_code, "optimize", in_this_process)
    (project / "app" / "later.py").write_text("def optimized_elsewhere():\n    return 1\n")
    result = cli("run", "index", cwd=project)
    assert result.exit_code == 0, result.stderr
    state = IndexState.read(project / ".ctx" / "lake")
    assert state is not None and state.unoptimized_rows >= 1  # left for the watcher


def test_a_cold_runs_batches_merge_once_and_later_optimizes_leave_that_fragment_alone(
        make_repo: Callable[..., Path], cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold run's batches are merged into one fragment per table; each later run's optimize folds
    its rows into small tiers and rewrites neither that fragment nor the indexes over it (LanceDB's
    optimize rewrote both every time: tasks/upkeep.py)."""
    import lance

    from ctxlake.tasks import upkeep

    monkeypatch.setattr(index_code, "BATCH_FILES", 8)
    monkeypatch.setattr(upkeep, "SMALL_FRAGMENT_ROWS", 16)  # the cold run's 80 rows make a big fragment
    repo = make_repo({f"pkg/m{i:02d}.py": f"def tier_fn_{i}(value):\n    return value + {i}\n" for i in range(80)})
    assert cli("run", "index", cwd=repo).exit_code == 0
    lake = repo / ".ctx" / "lake"

    def fragments(table: str) -> dict[int, list[str]]:
        return {f.fragment_id: [d.path for d in f.data_files()] for f in lance.dataset(lake / f"{table}.lance").get_fragments()}

    def deltas() -> set[str]:
        return {index["uuid"] for index in lance.dataset(lake / f"{CHUNKS_TABLE}.lance").list_indices()}

    first, indexes = fragments(CHUNKS_TABLE), deltas()
    assert len(first) == 1 and len(fragments(FILES_TABLE)) == 1
    (base,) = first
    monkeypatch.setattr(index_code, "OPTIMIZE_AFTER_ROWS", 0)  # every run optimizes
    chunks = connect(lake).open_table(CHUNKS_TABLE)
    for i in range(5):  # under a tenth of the big fragment's rows deleted: it stays as it is
        (repo / "pkg" / f"m{i:02d}.py").write_text(f"def tier_edit_{i}(value):\n    return value * {i}\n")
        assert cli("run", "index", cwd=repo).exit_code == 0
        now = fragments(CHUNKS_TABLE)
        assert now[base] == first[base] and len(now) <= 3, (i, now)
        assert indexes <= deltas(), i  # the indexes built by the cold run are still there, unchanged
        chunks.checkout_latest()
        assert all(chunks.index_stats(idx.name).num_unindexed_rows == 0 for idx in chunks.list_indices())
        found = json.loads(cli("search", f"tier_edit_{i}", "--mode", "keyword", "--json", cwd=repo).stdout)
        assert [h["path"] for h in found["hits"]][:1] == [f"pkg/m{i:02d}.py"]


def test_a_run_whose_vectors_all_come_from_the_cache_still_builds_the_id_index(
        make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    """Upserts go through the chunks' id index; the embed stage built it, and a second checkout of a
    project (every vector in the user-wide cache) never reached that stage, so each later edit's
    upsert joined against the whole table."""
    files = {"app/service.py": APP, "app/util.py": UTIL, "README.md": README}
    first, second = make_repo(files, name="first"), make_repo(files, name="second")
    assert cli("run", "index", cwd=first).exit_code == 0
    report = json.loads(cli("run", "index", "--json", cwd=second).stdout)
    assert report["embedded"] == 0 and report["vectors_from_cache"] > 0
    chunks = connect(second / ".ctx" / "lake").open_table(CHUNKS_TABLE)
    assert [idx.columns for idx in chunks.list_indices() if idx.index_type == "BTree"] == [["id"]]


def test_embedding_window_by_window_gives_the_vectors_of_one_pass(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The embed stage reads pending rows in windows so its memory does not grow with the lake;
    # a window of 3 rows cuts this repo into many, with equal content (util.py's copy) in different ones.
    from ctxlake.tasks import embed

    files = {"app/service.py": APP, "app/util.py": UTIL, "README.md": README, "z/copy_of_util.py": UTIL}
    whole, windowed = make_repo(files, name="whole"), make_repo(files, name="windowed")
    assert cli("run", "index", cwd=whole).exit_code == 0
    fake_embedder.reset_counters()
    monkeypatch.setattr(embed, "WINDOW_ROWS", 3)
    monkeypatch.setenv("CTX_HOME", str(tmp_path / "empty-cache-home"))  # else all of it comes from the cache
    report = json.loads(cli("run", "index", "--json", cwd=windowed).stdout)
    assert report["embedded"] == fake_embedder.texts_embedded > 0
    n_chunks = sum(chunk_paths(windowed).values())

    def vectors(root: Path) -> dict[tuple[str, int], list[float]]:
        return {(r["path"], r["start_line"]): r["vector"] for r in lake_rows(root, CHUNKS_TABLE, ["path", "start_line", "vector"])}

    assert n_chunks > 6 and vectors(windowed) == vectors(whole)
    assert all(v is not None for v in vectors(windowed).values())


def test_a_lake_past_the_ann_threshold_gets_a_partitioned_hnsw_index_and_semantic_search_uses_it(
    make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxlake.serve.api import code_lake, code_search
    from ctxlake.tasks import store

    funcs = "\n\n".join(f"def handler_{i}(request):\n    value = request.get('k{i}')\n    total = value * {i}\n"
                        f"    return total + {i}\n" for i in range(400))
    repo = make_repo({"app/handlers.py": funcs})
    monkeypatch.setattr(store, "ANN_MIN_ROWS", 300)
    monkeypatch.setattr(store, "ANN_PARTITION_ROWS", 64)
    assert cli("run", "index", cwd=repo).exit_code == 0
    db = connect(repo / ".ctx" / "lake")
    indexes = [i for i in db.open_table(CHUNKS_TABLE).list_indices() if i.columns == ["vector"]]
    assert [i.index_type for i in indexes] == ["IvfHnswSq"]
    lake = code_lake.Lake(load_settings(repo))
    result = code_search.search(lake, "handler_17 request value", mode="semantic", limit=5, check_stale=False)
    assert len(result.hits) == 5 and all(h.path == "app/handlers.py" for h in result.hits)

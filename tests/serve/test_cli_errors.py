"""Exit codes and messages of the real `ctx`: usage errors, counts, "not indexed", a full disk, and
`ctx sql` locked to the lake's tables."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from helpers import ctx_subprocess, damage_lake

from ctxlake.tasks.lake import STORAGE_HINT

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

COUNTED = [("search", "x"), ("files", "x"), ("sql", "select 1"), ("sessions",), ("session", "show", "s1"),
           ("context", "search", "x"), ("knowledge",)]


@pytest.fixture
def indexed(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> Path:
    repo = make_repo({"app.py": "def total(xs):\n    return sum(xs)\n", "notes.md": "# Notes\n\nTotals.\n"})
    assert cli("run", "index", cwd=repo).exit_code == 0
    return repo


@pytest.mark.parametrize("args, words", [
    (("search", "--bogus", "x"), "No such option: --bogus"),
    (("frobnicate",), "No such command 'frobnicate'"),
    (("search",), "Missing argument"),
    (("search", "x", "-n", "0"), "'-n' / '--limit'"),
])
def test_usage_errors_exit_2_with_clicks_message(args: tuple[str, ...], words: str, tmp_path: Path) -> None:
    done = ctx_subprocess(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Usage: ctx" in done.stderr and words in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", COUNTED, ids=[" ".join(c) for c in COUNTED])
@pytest.mark.parametrize("count", ["0", "-1"])
def test_counts_below_one_are_rejected(command: tuple[str, ...], count: str, tmp_path: Path,
                                       cli: Callable[..., Any]) -> None:
    result = cli(*command, "-n", count, cwd=tmp_path)
    assert result.exit_code == 2 and "greater than or equal to 1" in result.stderr, result.stderr


def test_not_indexed_is_4_with_or_without_ctx_folder(tmp_path: Path, cli: Callable[..., Any]) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    assert cli("search", "x", cwd=bare).exit_code == 4
    assert cli("sql", "select 1", cwd=bare).exit_code == 4
    # Outside any project, status still tells where the service stands (and exits 4).
    outside = cli("status", cwd=bare)
    assert outside.exit_code == 4 and "Service: down" in outside.stdout, outside.stdout
    outside = cli("status", "--json", cwd=bare)
    assert outside.exit_code == 4 and json.loads(outside.stdout) == {"indexed": False, "service": ANY}
    started = tmp_path / "started"
    (started / ".ctx").mkdir(parents=True)  # a clone with a committed config, never indexed
    for args in (("search", "x"), ("sql", "select 1"), ("files", "x"), ("status",), ("status", "--json")):
        result = cli(*args, cwd=started)
        assert result.exit_code == 4, (args, result.stderr)


def test_a_failed_json_command_prints_its_error_as_one_json_object(tmp_path: Path, indexed: Path,
                                                                  cli: Callable[..., Any]) -> None:
    # A script reading `--json` from stdout got nothing at all when the command failed.
    bare = tmp_path / "bare"
    bare.mkdir()
    lost = cli("search", "total", "--json", cwd=bare)
    assert lost.exit_code == 4
    assert json.loads(lost.stdout) == {"error": f"no ctxlake index in {bare} or any parent folder (looked for .ctx/)",
                                       "hint": "run `ctx run index` in the project first", "code": 4}
    assert lost.stderr.startswith("ctx: error: no ctxlake index"), lost.stderr  # the human line stays
    bad = cli("sql", "--json", "select nope from files", cwd=indexed)
    assert bad.exit_code == 2 and bad.stderr.startswith("ctx: error: SQL error"), bad.stderr
    answer = json.loads(bad.stdout)
    assert answer["code"] == 2 and answer["error"].startswith("SQL error: ") and "nope" in answer["error"]
    assert answer["hint"].startswith("tables: ") and "files" in answer["hint"]
    refused = json.loads(cli("sql", "--json", "LOAD httpfs", cwd=indexed).stdout)
    assert refused["code"] == 2 and "read-only statements" in refused["error"]
    usage = cli("search", "--json", cwd=indexed)  # click's usage error, before the command runs
    assert usage.exit_code == 2 and "Usage: ctx" in usage.stderr
    assert json.loads(usage.stdout) == {"error": ANY, "hint": "see `ctx search --help`", "code": 2}
    # Word for word what stderr says, the argument's name in the same case.
    said = [line.removeprefix("Error: ") for line in usage.stderr.splitlines() if line.startswith("Error: ")]
    assert said == [json.loads(usage.stdout)["error"]] and said[0].lower() == "missing argument 'query'.", usage.stderr
    # Without --json stdout stays empty; after `--` "--json" is the query, not the option.
    assert cli("search", "total", cwd=bare).stdout == ""
    assert cli("search", "--", "--json", cwd=bare).stdout == ""
    # A command that printed its document before failing prints no second one.
    outside = cli("status", "--json", cwd=bare)
    assert outside.exit_code == 4 and json.loads(outside.stdout)["indexed"] is False


def test_the_console_script_prints_the_json_error_too(tmp_path: Path) -> None:
    done = ctx_subprocess("files", "total", "--json", cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    assert json.loads(done.stdout)["code"] == 4 and done.stderr.startswith("ctx: error: ")


def test_a_request_the_service_refuses_is_a_json_error_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from ctxlake.serve.service import client

    # Fault injection at the socket: the service answers as it does for a folder it cannot enter.
    here, there = socket.socketpair()
    there.close()
    monkeypatch.setattr(client, "connect", lambda paths: here)
    monkeypatch.setattr(client, "forward", lambda sock, message: {
        "op": "error", "message": f"working folder does not exist: {message['cwd']}", "code": 2})
    monkeypatch.chdir(tmp_path)
    assert client.run(["search", "x", "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out) == {"error": f"working folder does not exist: {tmp_path}", "hint": None, "code": 2}
    assert out.err.startswith("ctx: error: working folder")
    assert client.run(["search", "x"]) == 2 and capsys.readouterr().out == ""


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_storage_errors_anywhere_are_exit_8(code: int, tmp_path: Path, cli: Callable[..., Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxlake.serve.cli.app as cli_module

    def fail(root: Path) -> bool:  # fault injection: the first write of `ctx run index`
        raise OSError(code, os.strerror(code), str(root / ".ctx" / "config.toml"))

    monkeypatch.setattr(cli_module, "ensure_project", fail)
    repo = tmp_path / "r"
    repo.mkdir()
    result = cli("run", "index", str(repo), cwd=tmp_path)
    assert result.exit_code == 8, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ctx: error:")]
    assert len(lines) == 1 and "config.toml" in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize(("code", "hint"), [
    (errno.ENOSPC, STORAGE_HINT),
    (errno.EACCES, STORAGE_HINT),
    (errno.EISDIR, "check that {folder} is a folder you can write to, then run the command again"),
], ids=["disk full", "forbidden", "folder in the way"])
def test_a_file_write_that_fails_says_what_to_do(make_repo: Callable[..., Path], cli: Callable[..., Any],
                                                 monkeypatch: pytest.MonkeyPatch, code: int, hint: str) -> None:
    # write_atomic's "cannot write PATH: No space left on device" came without a hint.
    import ctxlake.tasks.lake as lake

    def refused(src: str, dst: str) -> None:  # fault injection: the rename onto the record's file fails
        raise OSError(code, os.strerror(code))

    repo = make_repo({"app.py": "A = 1\n"})
    (repo / ".ctx").mkdir()
    monkeypatch.setattr(lake.os, "replace", refused)
    result = cli("remember", "decision", "Keep the lake on local disk", "--json", cwd=repo)
    assert result.exit_code == 8, result.stderr
    folder = repo.resolve() / ".ctx" / "knowledge" / "decisions"
    answer = json.loads(result.stdout)
    assert answer["error"].startswith(f"cannot write {folder}/decision-"), answer
    assert answer["error"].endswith(f": {os.strerror(code)}") and answer["hint"] == hint.format(folder=folder), answer
    assert list(folder.iterdir()) == []  # nor is its temporary file left behind, taking the space


def test_an_interrupted_file_write_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxlake.tasks.lake as lake

    target = tmp_path / "state.json"
    target.write_text("old")

    def interrupted(src: str, dst: str) -> None:  # Ctrl-C lands between the fsync and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(lake.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lake.write_atomic(target, "new")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"] and target.read_text() == "old"


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 600 KiB tmpfs (root only; skipped elsewhere)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_really_full_disk_is_exit_8_with_one_line(tiny_disk: Path, ctx_home: Path) -> None:
    # ctx_home: its own CTX_HOME and no CTX_* settings left over from other tests (hermetic run)
    repo = tiny_disk / "repo"
    repo.mkdir()
    for i in range(70):  # ~420 KB of source on 600 KiB: the lake cannot fit beside it
        (repo / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}.{j}\n\n" for j in range(60)))
    done = ctx_subprocess("run", "index", str(repo), cwd=tiny_disk,
                          env={"CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"})
    assert done.returncode == 8, done.stderr
    assert "No space left" in done.stderr and "Traceback" not in done.stderr
    assert "stays readable" not in done.stderr  # a first run: there is no previous index
    filler = tiny_disk / "filler"  # now fill what is left, so even .ctx/config.toml cannot be written
    with pytest.raises(OSError), filler.open("wb") as out:
        while True:
            out.write(b"x" * 4096)
            out.flush()
    (repo / ".ctx" / "config.toml").unlink()
    again = ctx_subprocess("run", "index", str(repo), cwd=tiny_disk,
                           env={"CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"})
    # Where the run first fails to write: the lake's journal (the writer lock's owner record is
    # only informational and no longer fails the run on its own).
    assert again.returncode == 8 and "Traceback" not in again.stderr, again.stderr
    assert "disk is full" in again.stderr or "No space left on device" in again.stderr, again.stderr


def test_ctx_up_on_a_full_disk_says_so(tiny_disk: Path, tmp_path: Path) -> None:
    """The service could not write a line of its log, and `ctx up` only pointed at that empty log."""
    home = tiny_disk / "home"
    (home / "service").mkdir(parents=True, mode=0o700)
    filler = tiny_disk / "filler"
    with pytest.raises(OSError), filler.open("wb") as out:
        while True:
            out.write(b"x" * 4096)
            out.flush()
    started = ctx_subprocess("up", cwd=tmp_path, env={"CTX_HOME": str(home), "CTX_SERVICE_SCHEDULES": "false"},
                             timeout=120)
    try:
        assert started.returncode != 0 and "Traceback" not in started.stderr, started.stderr
        assert "is full" in started.stderr or "No space left" in started.stderr, started.stderr
    finally:
        ctx_subprocess("down", cwd=tmp_path, env={"CTX_HOME": str(home)})


def test_lances_worded_storage_errors_are_storage_errors() -> None:
    """Lance reports a full disk in a RuntimeError's text, without an errno: a write of messages that
    failed so ended `ctx run ingest` in a 119-line traceback instead of exit 8 and one line."""
    from ctxlake.tasks.lake import lake_failure

    full = lake_failure(RuntimeError("lance error: LanceError(IO): No space left on device, "
                                     "memory/messages.lance"))
    assert full is not None and full.exit_code == 8 and "disk is full" in full.message
    denied = lake_failure(ValueError("Generic LocalFileSystem error: Permission denied (os error 13)"))
    assert denied is not None and "permission denied" in denied.message
    other = lake_failure(RuntimeError("lance error: something else went wrong"))  # damage, or a bug: not the disk
    assert other is None or "disk" not in other.message


def test_sql_reads_the_lake_and_nothing_else(indexed: Path, tmp_path: Path, cli: Callable[..., Any]) -> None:
    ok = cli("sql", "SELECT count(*) AS n FROM files", "--json", cwd=indexed)
    assert ok.exit_code == 0 and json.loads(ok.stdout)["rows"] == [[2]]
    outside = tmp_path / "outside.csv"
    outside.write_text("secret\nvalue\n")
    leak = tmp_path / "leak.csv"
    for statement in [
        f"select 1; COPY (select * from chunks) TO '{leak}'",
        f"COPY (select * from chunks) TO '{leak}'",
        "select 1; INSTALL httpfs",
        "LOAD httpfs",
        f"ATTACH '{tmp_path / 'x.db'}' AS x",
        "select * from read_text('/etc/hostname')",
        f"select * from read_csv('{outside}')",
        f"select * from '{outside}'",
        "SET enable_external_access = true",
    ]:
        result = cli("sql", statement, cwd=indexed)
        assert result.exit_code == 2, (statement, result.stdout, result.stderr)
        assert result.stderr.startswith("ctx: error:") and "Traceback" not in result.stderr
        assert "secret" not in result.stdout
    assert not leak.exists() and not (tmp_path / "x.db").exists()
    assert cli("sql", "select 1;", cwd=indexed).exit_code == 0
    two = cli("sql", "select 1; select 2", cwd=indexed)
    assert two.exit_code == 2 and "exactly one statement" in two.stderr


def test_index_reports_wall_time_from_process_start(make_repo: Callable[..., Path]) -> None:
    import time

    repo = make_repo({"app.py": "def total(xs):\n    return sum(xs)\n"})
    env = {"CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}
    assert ctx_subprocess("run", "index", cwd=repo, env=env).returncode == 0
    (repo / "more.py").write_text("def more():\n    return 1\n")  # a one-file re-index
    began = time.time()
    done = ctx_subprocess("run", "index", "--json", cwd=repo, env=env)
    waited = time.time() - began
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The wall time is what the user waited (less the exit after printing), and it is made of
    # the run's own seconds plus start-up; the run's own clock alone is far shorter.
    assert report["wall_seconds"] <= waited
    assert report["wall_seconds"] >= waited - max(3.0, 0.25 * waited), (report, waited)
    assert report["wall_seconds"] == pytest.approx(
        report["seconds"] + report["startup_seconds"] + report["model_setup_s"], abs=0.01)
    assert report["startup_seconds"] > report["seconds"]
    human = ctx_subprocess("run", "index", "--force", cwd=repo, env=env)
    assert "s starting Python and Prefect" in human.stdout and human.stdout.count("Done in ") == 1


def test_flow_runs_a_command_waits_on_have_no_heartbeat_thread() -> None:
    # Prefect's heartbeat thread sleeps in whole seconds and a run's end joins it (0-1 s a run).
    from prefect import flow
    from prefect.flow_engine import FlowRunEngine
    from prefect.settings import get_current_settings

    from ctxlake.serve.cli.base import without_heartbeats

    @flow
    def noop() -> None:
        return None

    assert FlowRunEngine(flow=noop).heartbeat_seconds is not None  # Prefect's default: on
    with without_heartbeats():
        assert FlowRunEngine(flow=noop).heartbeat_seconds is None
        assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency is not None


def test_an_explicit_home_or_root_is_refused_without_allow_home(cli: Callable[..., Any], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`ctx run index` in ~ was refused, but `ctx run index ~` (or `/`) indexed the whole folder."""
    home = tmp_path / "home"
    (home / "code").mkdir(parents=True)
    (home / "code" / "app.py").write_text("def total(xs):\n    return sum(xs)\n")
    monkeypatch.setenv("HOME", str(home))
    for target, what in ((home, "your home folder"), (Path("/"), "a filesystem root")):
        refused = cli("run", "index", str(target), cwd=tmp_path)
        assert refused.exit_code == 2 and f"refusing to index {target.resolve()}: it is {what}" in refused.stderr
        assert "--allow-home" in refused.stderr
    assert not (home / ".ctx").exists()
    monkeypatch.setenv("CTX_HOME", str(home / ".local" / "share" / "ctxlake"))
    (home / ".local" / "share" / "ctxlake").mkdir(parents=True)
    (home / ".local" / "share" / "ctxlake" / "trusted-configs.json").write_text("{}\n")
    done = cli("run", "index", str(home), "--allow-home", "--json", cwd=tmp_path)
    assert done.exit_code == 0, done.stderr
    assert cli("files", "trusted configs", "--json", cwd=home).stdout.count("trusted-configs") == 0
    assert json.loads(cli("files", "total", "--json", cwd=home).stdout)["files"][0]["path"] == "code/app.py"


def test_system_folders_and_the_data_folder_are_never_index_roots(cli: Callable[..., Any], tmp_path: Path,
                                                                 ctx_home: Path) -> None:
    """`ctx run index /etc` indexed /etc (its shadow file included, read as root) into /etc/.ctx;
    `ctx run index /proc` ended in a traceback; CTX_HOME, which the README says is never indexed,
    was indexed when named."""
    (ctx_home / "models").mkdir(parents=True, exist_ok=True)
    for target, what in (("/etc", "a system folder"), ("/proc", "a system folder"),
                         (str(ctx_home), "ctxlake's own data folder"), (str(ctx_home / "models"), "ctxlake's own data folder")):
        refused = cli("run", "index", target, "--json", cwd=tmp_path)
        assert refused.exit_code == 2 and f"it is {what}" in refused.stderr, (target, refused.stderr)
        assert json.loads(refused.stdout)["code"] == 2
        assert not (Path(target) / ".ctx").exists()


def test_a_table_gone_from_the_lake_is_rebuilt_by_a_plain_run(indexed: Path, cli: Callable[..., Any]) -> None:
    def chunks() -> int:
        result = cli("sql", "select count(*) from chunks", "--json", cwd=indexed)
        assert result.exit_code == 0, result.stderr
        return int(json.loads(result.stdout)["rows"][0][0])

    before = chunks()
    for table in ("chunks", "definitions"):
        shutil.rmtree(indexed / ".ctx" / "lake" / f"{table}.lance")
    again = cli("run", "index", "--json", cwd=indexed)
    assert again.exit_code == 0, again.stderr
    assert "up_to_date" not in json.loads(again.stdout)
    assert chunks() == before
    assert cli("def", "total", cwd=indexed).stdout.startswith("app.py:1")


def test_an_unknown_language_filter_names_the_known_ones(indexed: Path, cli: Callable[..., Any]) -> None:
    for command in ("search", "files"):
        result = cli(command, "total", "--lang", "py", cwd=indexed)
        assert result.exit_code == 0, result.stderr
        assert "no language 'py' in the index; known: markdown, python" in result.stderr, (command, result.stderr)


def test_status_lists_the_changed_files_under_the_line_that_counts_them(indexed: Path, cli: Callable[..., Any]) -> None:
    (indexed / "app.py").write_text("def total(xs):\n    return sum(xs) + 1\n")
    lines = cli("status", cwd=indexed).stdout.splitlines()
    fresh = next(i for i, line in enumerate(lines) if line.startswith("fresh"))
    assert "1 file(s) changed" in lines[fresh] and lines[fresh + 1].strip() == "app.py", lines


ENDLESS = "select sum(hash(a)) from range(100000000000) a"  # hours of work in one C call


def test_sql_is_bounded_by_a_timeout_and_a_row_cap(indexed: Path, cli: Callable[..., Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    started = time.monotonic()
    slow = cli("sql", ENDLESS, "--timeout", "1", cwd=indexed)
    assert time.monotonic() - started < 20
    assert slow.exit_code == 2 and "ran past the 1 s limit and was stopped" in slow.stderr
    assert "[sql] timeout_s" in slow.stderr and "Traceback" not in slow.stderr
    # A result is never materialised past [sql] max_rows, whatever -n asks, and the cut is said.
    monkeypatch.setenv("CTX_SQL_MAX_ROWS", "1000")
    big = json.loads(cli("sql", "-n", "100000000", "--json", "select * from range(200000)", cwd=indexed).stdout)
    assert big["row_count"] == 1000 and len(big["rows"]) == 1000 and big["truncated"] and big["capped"]
    text = cli("sql", "-n", "100000000", "select * from range(200000)", cwd=indexed)
    assert text.exit_code == 0 and "[sql] max_rows caps a result" in text.stderr
    # --limit below the cap cuts as before, and says to raise it.
    small = cli("sql", "-n", "5", "select * from range(10)", cwd=indexed)
    assert "(first 5 rows; raise --limit for more)" in small.stderr


SORT = "select count(*) from (select * from range(3000000) t(a) order by hash(a))"  # ~50 MB to sort


def test_sql_is_held_to_its_memory_limit_and_threads(indexed: Path, cli: Callable[..., Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # DuckDB may take 80% of the machine's memory by default, and past that spilled into `.tmp` in
    # the current folder: a runaway statement could take the machine.
    import duckdb

    def setting(name: str) -> Any:
        result = cli("sql", "--json", f"SELECT current_setting('{name}')", cwd=indexed)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["rows"][0][0]

    quarter = duckdb.connect(":memory:", config={"memory_limit": "25%"})
    assert setting("memory_limit") == quarter.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert setting("threads") == max(1, len(os.sched_getaffinity(0)) // 2)
    assert cli("sql", SORT, cwd=indexed).exit_code == 0  # within the default
    monkeypatch.setenv("CTX_SQL_MEMORY_LIMIT", "16MB")
    monkeypatch.setenv("CTX_SQL_THREADS", "1")
    assert setting("memory_limit") == "15.2 MiB" and setting("threads") == 1
    over = cli("sql", SORT, cwd=indexed)
    assert over.exit_code == 2, over.stderr
    assert over.stderr.startswith("ctx: error: the query needed more memory than [sql] memory_limit (16MB) "
                                  "allows and was stopped: Out of Memory Error"), over.stderr
    assert "raise [sql] memory_limit" in over.stderr and "Traceback" not in over.stderr
    assert not (indexed / ".tmp").exists()  # nothing spilled into the project
    assert json.loads(cli("sql", "--json", SORT, cwd=indexed).stdout)["code"] == 2
    monkeypatch.setenv("CTX_SQL_MEMORY_LIMIT", "lots")
    bad = cli("sql", "select 1", cwd=indexed)
    assert bad.exit_code == 3 and "sql.memory_limit: Value error, 'lots' is no memory size" in bad.stderr


def test_ctrl_c_stops_a_running_sql_statement_at_once(indexed: Path) -> None:
    import signal
    import sys
    import time

    # The worktree's code whatever `ctx` is installed: the console entry point, run as a module.
    argv = [sys.executable, "-c", "from ctxlake.serve.service.client import main; main()"]
    started = time.monotonic()
    quick = subprocess.run([*argv, "sql", "select 1"], cwd=indexed, capture_output=True, text=True, timeout=120)
    assert quick.returncode == 0, quick.stderr
    start_up = time.monotonic() - started
    proc = subprocess.Popen([*argv, "sql", ENDLESS], cwd=indexed, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        time.sleep(start_up + 2)  # well inside the statement, far from its 60 s default limit
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("ctx sql ignored Ctrl-C")
        assert time.monotonic() - sent < 5
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("how", ["truncated", "no_manifest", "no_indices", "state"])
def test_a_damaged_lake_is_one_line_for_readers_and_rebuilt_by_force(
        indexed: Path, cli: Callable[..., Any], how: str) -> None:
    # Readers died with a Lance traceback (Rust file names and all), and `ctx run index --force`
    # either failed too ("the previous index stays readable", which it was not) or left search broken.
    damage_lake(indexed / ".ctx" / "lake", how)
    for args in (("search", "total"), ("status",), ("sql", "select count(*) from chunks")):
        result = cli(*args, cwd=indexed)
        if (how == "no_indices" and args[0] != "search") or (how == "state" and args[0] == "sql"):
            continue  # only a keyword query reads the BM25 index; `ctx sql` reads the tables alone
        assert result.exit_code == 8, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert lines[0].startswith("ctx: error: ") and "Traceback" not in result.stderr, result.stderr
        assert ".rs:" not in result.stderr
        assert "ctx run index --force" in lines[-1]
        if how in ("no_manifest", "no_indices"):
            assert "chunks" in lines[0]
    forced = cli("run", "index", "--force", "--json", cwd=indexed)
    assert forced.exit_code == 0, forced.stderr
    found = cli("search", "total", "--json", cwd=indexed)
    assert found.exit_code == 0, found.stderr
    assert "app.py" in found.stdout
    assert cli("status", cwd=indexed).exit_code == 0


def test_ctx_home_that_is_a_file_is_a_config_error(indexed: Path, cli: Callable[..., Any], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # It was a NotADirectoryError traceback from whichever command first made models/.
    not_a_folder = tmp_path / "home-file"
    not_a_folder.write_text("")
    for home in (not_a_folder, not_a_folder / "below"):
        monkeypatch.setenv("CTX_HOME", str(home))
        for args in (("search", "total"), ("run", "index")):
            result = cli(*args, cwd=indexed)
            assert result.exit_code == 3, result.stderr
            assert result.stderr.startswith("ctx: error: CTX_HOME is ") and "Traceback" not in result.stderr


def test_an_embedding_cache_folder_that_cannot_be_made_is_named_as_such(
        indexed: Path, cli: Callable[..., Any], ctx_home: Path) -> None:
    shutil.rmtree(ctx_home / "embeddings")
    (ctx_home / "embeddings").write_text("")  # a file where the cache's folder goes
    result = cli("run", "index", "--force", cwd=indexed)
    assert result.exit_code == 8, result.stderr
    assert f"cannot create the embedding cache at {ctx_home / 'embeddings'}" in result.stderr


@pytest.mark.parametrize("argv", [["search", "total"], ["files", "total"], ["sessions"], ["context", "search", "x"]])
def test_a_limit_past_the_cap_is_a_usage_error(cli: Callable[..., Any], indexed: Path, argv: list[str]) -> None:
    """`ctx search -n 2147483648` reached LanceDB and ended in an OverflowError traceback (exit 1)."""
    refused = cli(*argv, "-n", "2147483648", "--json", cwd=indexed)
    assert refused.exit_code == 2 and json.loads(refused.stdout)["code"] == 2, refused.stderr
    assert "less than or equal to 1000" in json.loads(refused.stdout)["error"]


def test_a_too_deep_statement_gets_advice_ctx_sql_can_follow(cli: Callable[..., Any], indexed: Path) -> None:
    """DuckDB's own advice was `SET max_expression_depth TO x`, a statement ctx sql refuses."""
    deep = cli("sql", "select " + "+".join(["1"] * 2000), "--json", cwd=indexed)
    assert deep.exit_code == 2 and "1,000 deep" in deep.stderr and "SET" not in deep.stderr, deep.stderr

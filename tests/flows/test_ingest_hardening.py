"""`ctx run ingest` over all seven tools' logs with the reported bad record, a FIFO, a /dev/zero
symlink, a file name that is not UTF-8 and a truncated line: exit 0, every tool's good prompt stored, the malformed counts in the
report and in `ctx status` / `ctx status --json`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from memlogs import claude, write_jsonl
from sevenlogs import TOOLS, build_seven, log_file

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")


@pytest.mark.timeout(300)
def test_bad_logs_do_not_stop_ingestion_and_are_counted(
        tmp_path: Path, make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, ctx_home: Path,
        cli: Callable[..., Any]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = make_repo({"a.py": "x = 1\n"}, name="app")
    roots = build_seven(tmp_path / "stores")
    line = json.dumps(claude("user", "u7", 7, "cut short"))
    write_jsonl(log_file("claude", roots["claude"]), ['{"type":["user"],"sessionId":"x","uuid":"y"}', line[:40]],
                mode="a")
    write_jsonl(log_file("claude", roots["claude"]), [claude("user", "u8", 8, "after the bad lines")], mode="a")
    os.mkfifo(roots["claude"] / "p" / "pipe.jsonl")
    with open(os.path.join(os.fsencode(roots["claude"] / "p"), b"s\xff.jsonl"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(claude("user", "n1", 9, "a log whose name is not UTF-8")) + "\n")
    os.symlink("/dev/zero", roots["codex"] / "2026" / "zero.jsonl")

    result = cli("run", "ingest", *[f"--from={name}={path}" for name, path in roots.items()], "--json",
                 "--no-embed", cwd=repo)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert {t: report["tools"][t]["messages"] for t in TOOLS} == {t: 3 if t == "claude" else 1 for t in TOOLS}
    expected = {"claude": {"file not a regular file": 1, "truncated JSON": 1}, "codex": {"file not a regular file": 1}}
    assert report["malformed_in_logs"] == expected
    assert report["tools"]["claude"]["unknown"] == {"<list>": 1}

    status = cli("status", "--json", cwd=repo)
    assert status.exit_code == 4, status.stderr  # the code is not indexed; the report still comes
    assert json.loads(status.stdout)["memory_malformed"] == expected
    human = cli("status", cwd=repo)
    assert "claude logs: 2 malformed record(s) skipped" in human.stdout


@pytest.mark.timeout(300)
def test_a_record_stamped_at_the_ends_of_the_calendar_stops_nothing(
        tmp_path: Path, make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, ctx_home: Path,
        cli: Callable[..., Any]) -> None:
    """A record stamped 9999-12-31 was stored, then its session's window overflowed the date
    arithmetic (OverflowError, exit 1) in this run and every later one; one stamped year 1 was
    stored as text the read side could not cast back (`ctx session show` exit 8)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = make_repo({"a.py": "x = 1\n"}, name="app")
    logs = tmp_path / "claude" / "projects"
    write_jsonl(logs / "p" / "far.jsonl", [
        claude("user", "f2", 1, "a sane neighbour", session="s-far", cwd=str(repo)),
        {**claude("user", "f1", 0, "stamped at the end of time", session="s-far", cwd=str(repo)),
         "timestamp": "9999-12-31T23:59:59Z"},
    ])
    write_jsonl(logs / "p" / "old.jsonl", [
        {**claude("user", "o1", 0, "stamped in year one", session="s-old", cwd=str(repo)),
         "timestamp": "0001-01-01T00:00:00Z"},
    ])
    first = cli("run", "ingest", f"--from=claude={logs}", "--json", "--no-embed", cwd=repo)
    assert first.exit_code == 0, first.stderr
    # Both are skipped and counted like any record without a usable time.
    report = json.loads(first.stdout)
    assert report["malformed_in_logs"] == {"claude": {"bad timestamp": 2}}
    # Each is placed by the byte its line starts at, not in a form that reads as `path:line`.
    second_line = len((logs / "p" / "far.jsonl").read_bytes().split(b"\n")[0]) + 1
    assert sorted(report["problems"]) == [f"{logs / 'p' / 'far.jsonl'} at byte {second_line}: bad timestamp",
                                          f"{logs / 'p' / 'old.jsonl'} at byte 0: bad timestamp"]
    again = cli("run", "ingest", f"--from=claude={logs}", "--json", "--no-embed", cwd=repo)
    assert again.exit_code == 0, again.stderr  # the next run too: nothing was left half done
    shown = cli("session", "show", "claude:s-far", cwd=repo)
    assert shown.exit_code == 0 and "a sane neighbour" in shown.stdout, shown.stderr
    assert "stamped at the end of time" not in shown.stdout

"""ingest_conversations through the real CLI: counts, no-op rescans, appended lines, redaction in the lake's bytes, crash recovery."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from memlogs import CANARY, SECRET, build_stores, claude, write_jsonl

from ctxlake.errors import LakeError
from ctxlake.tasks.lake import IndexState

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")


@pytest.fixture
def env(tmp_path: Path, make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, ctx_home: Path) -> dict[str, Any]:
    """A project repo, agent stores of three tools under a private HOME (nothing real is read)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = make_repo({"deploy.sh": "#!/bin/sh\necho deploy\n"}, name="app")
    stores = build_stores(tmp_path / "stores", repo)
    args = [f"--from={name}={path}" for name, path in stores.items()]
    return {"repo": repo, "stores": stores, "args": args, "home": ctx_home}


def ingest(cli: Callable[..., Any], env: dict[str, Any], *extra: str) -> dict[str, Any]:
    result = cli("run", "ingest", *env["args"], "--json", *extra, cwd=env["repo"])
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def cli_json(cli: Callable[..., Any], cwd: Path, *args: str) -> Any:
    result = cli(*args, "--json", cwd=cwd)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_ingest_counts_sessions_and_no_op(cli: Callable[..., Any], env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    report = ingest(cli, env)
    # claude: 8 messages of sess-a + 1 elsewhere; codex: 2 (parent) + 3 (fork: 2 replayed, 1 own); gemini: 2.
    assert {name: t["messages"] for name, t in report["tools"].items()} == {"claude": 9, "codex": 5, "gemini": 2}
    assert (report["messages_inserted"], report["duplicates"], report["messages_updated"]) == (14, 2, 0)
    assert report["redacted"] == 1 and report["malformed_records"] == 0
    assert report["sessions_written"] == 6
    assert report["candidates"] == {"created": 2}
    assert report["embedded"]["sessions"] == 6

    sessions = cli_json(cli, env["repo"], "sessions")
    assert [s["session_ref"] for s in sessions] == [
        "gemini:gem-1", "codex:cx-fork", "codex:cx-parent", "claude:sess-a#2", "claude:sess-a"]
    by_ref = {s["session_ref"]: s for s in sessions}
    assert by_ref["gemini:gem-1"]["project_path"] == str(env["repo"])  # linked through Gemini's path hash
    assert (by_ref["codex:cx-fork"]["tokens_in"], by_ref["codex:cx-fork"]["tokens_out"]) == (400, 50)
    first = by_ref["claude:sess-a"]
    assert first["open_tasks"] == ["rotate the old key"]
    assert first["decisions"] == ["We decided to use a dedicated deploy key."]
    assert first["errors"] == ["unknown: error: permission denied (publickey)"]
    assert by_ref["claude:sess-a#2"]["files"] == [f"{env['repo']}/CHANGELOG.md"]
    everywhere = cli_json(cli, env["repo"], "sessions", "--all-projects", "--tool", "claude")
    assert [s["session_ref"] for s in everywhere] == ["claude:sess-a#2", "claude:sess-z", "claude:sess-a"]

    # DuckDB sees the user-wide memory tables beside the project's own (vectors left out); the
    # fork's two replayed codex records are stored once.
    counts = cli_json(cli, env["repo"], "sql", "SELECT tool, count(*) AS n FROM messages GROUP BY 1 ORDER BY 1")
    assert counts["rows"] == [["claude", 9], ["codex", 3], ["gemini", 2]]
    columns = cli_json(cli, env["repo"], "sql", "SELECT * FROM sessions LIMIT 1")["columns"]
    assert {"id", "tool", "started_at"} <= set(columns) and "vector" not in columns

    # Nothing changed: decided from saved positions, the flow is never started.
    def no_flow(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the flow must not run when nothing changed")

    monkeypatch.setattr("ctxlake.serve.cli.memory._run_flow", no_flow)
    again = ingest(cli, env)
    assert again["up_to_date"] is True and again["files_seen"] == 5


def test_appended_lines_are_ingested_alone(cli: Callable[..., Any], env: dict[str, Any]) -> None:
    ingest(cli, env)
    log = next(env["stores"]["claude"].rglob("sess-a.jsonl"))
    write_jsonl(log, [claude("user", "u5", 38, "Ship it", cwd=str(env["repo"])),
                      claude("assistant", "a5", 39, [{"type": "text", "text": "Tagged v1.2.0."}], cwd=str(env["repo"]))],
                mode="a")
    report = ingest(cli, env)
    assert (report["files_changed"], report["messages_inserted"], report["duplicates"]) == (1, 2, 0)
    assert report["sessions_written"] == 2  # the touched session's two segments
    detail = cli_json(cli, env["repo"], "session", "show", "claude:sess-a#2")
    assert [m["text"] for m in detail["messages"]][-2:] == ["Ship it", "Tagged v1.2.0."]
    assert detail["total"] == 4


def test_planted_secret_is_nowhere_in_the_lake_or_knowledge(cli: Callable[..., Any], env: dict[str, Any]) -> None:
    ingest(cli, env)
    places = [env["home"] / "memory", env["repo"] / ".ctx"]
    files = [p for place in places for p in place.rglob("*") if p.is_file()]
    assert any(p.suffix == ".lance" for p in files)
    blobs = {p: p.read_bytes() for p in files}
    # Positive control: text in the lake is stored as bytes a scan can see.
    assert any(CANARY.encode() in b for p, b in blobs.items() if p.suffix == ".lance")
    for needle in (SECRET, SECRET[4:], SECRET[-16:]):
        leaks = [str(p) for p, b in blobs.items() if needle.encode() in b]
        assert leaks == [], f"secret found in {leaks}"
    text = cli_json(cli, env["repo"], "session", "show", "claude:sess-a")["messages"][0]["text"]
    assert text == "Deploy fails: export GITHUB_TOKEN=[REDACTED:github_token] did not help"


def test_context_search_and_session_pages(cli: Callable[..., Any], env: dict[str, Any]) -> None:
    ingest(cli, env)
    found = cli_json(cli, env["repo"], "context", "search", "deploy key", "--mode", "keyword")
    assert found["hits"] and found["hits"][0]["session_ref"].startswith("claude:sess-a")
    assert {h["type"] for h in found["hits"]} <= {"message", "session"}
    sessions_only = cli_json(cli, env["repo"], "context", "search", "health check", "--type", "session")
    assert {h["ref"] for h in sessions_only["hits"]} >= {"gemini:gem-1", "codex:cx-parent"}
    only_codex = cli_json(cli, env["repo"], "context", "search", "health check", "--tool", "codex", "--type", "message")
    assert {h["tool"] for h in only_codex["hits"]} == {"codex"}
    late = cli_json(cli, env["repo"], "context", "search", "health", "--after", "2026-03-02T10:45", "--mode", "keyword")
    assert {h["tool"] for h in late["hits"]} == {"gemini"}
    raw = cli_json(cli, env["repo"], "context", "search", "ssh-add", "--depth", "raw", "--type", "message")
    assert any("[Bash] ssh-add" in h["text"] for h in raw["hits"])
    hybrid = cli_json(cli, env["repo"], "context", "search", "database connection per call")
    assert hybrid["mode"] == "hybrid" and hybrid["hits"][0]["tool"] == "gemini" and hybrid["warnings"] == []
    page = cli_json(cli, env["repo"], "session", "show", "claude:sess-a", "--offset", "2", "--limit", "3")
    assert (page["total"], page["offset"], page["next_offset"], len(page["messages"])) == (6, 2, 5, 3)
    by_prefix = cli_json(cli, env["repo"], "session", "show", "cx-fo")
    assert by_prefix["session"]["session_ref"] == "codex:cx-fork"
    # The short forms: the group's one reading command is the default, options first or after.
    assert cli_json(cli, env["repo"], "session", "cx-fo") == by_prefix
    assert cli_json(cli, env["repo"], "context", "--mode", "keyword", "deploy key")["hits"] == found["hits"]
    assert cli_json(cli, env["repo"], "context", "deploy key", "--mode", "keyword")["hits"] == found["hits"]
    assert [m["text"] for m in by_prefix["messages"]] == ["Also added /readyz on the fork."]


def test_remember_then_ingest_makes_knowledge_searchable(cli: Callable[..., Any], env: dict[str, Any]) -> None:
    ingest(cli, env)
    text = "Deploys use a dedicated key\nThe old personal key is rotated; CI loads the deploy key with ssh-add."
    created = cli_json(cli, env["repo"], "remember", "decision", text, "--file", "deploy.sh", "--tag", "ops")
    assert created["status"] == "created"
    duplicate = cli_json(cli, env["repo"], "remember", "decision", text)
    assert (duplicate["status"], duplicate["id"], duplicate["path"]) == ("duplicate", created["id"], None)
    report = ingest(cli, env)
    assert report["knowledge_rows"] == 1 and report["messages_inserted"] == 0
    listed = cli_json(cli, env["repo"], "knowledge")
    assert [r["id"] for r in listed["records"]] == [created["id"]] and listed["inbox"] == 2
    assert listed["records"][0]["files"] == ["deploy.sh"] and listed["records"][0]["tags"] == ["ops"]
    hits = cli_json(cli, env["repo"], "context", "search", "dedicated key", "--type", "decision")
    assert [h["ref"] for h in hits["hits"]] == [created["id"]]


def test_bad_input_gets_one_clear_line(cli: Callable[..., Any], env: dict[str, Any]) -> None:
    early = cli("sessions", cwd=env["repo"])
    assert early.exit_code == 4 and "ctx run ingest" in early.stderr
    bad_tool = cli("run", "ingest", "--from", "nosuch=/tmp", cwd=env["repo"])
    assert bad_tool.exit_code == 2 and "unknown agent tool 'nosuch'" in bad_tool.stderr
    missing = cli("run", "ingest", "--from", f"claude={env['repo']}/missing", cwd=env["repo"])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    no_sep = cli("run", "ingest", "--from", "claude", cwd=env["repo"])
    assert no_sep.exit_code == 2 and "TOOL=PATH" in no_sep.stderr
    ingest(cli, env)
    for args, words in [(("session", "show", "nope"), "no session matches"),
                        (("session", "show", "claude:sess"), "matches 3 sessions"),
                        (("context", "search", " "), "empty query"),
                        (("context", "search", "x", "--after", "yesterday-ish"), "not a date"),
                        (("context", "search", "x", "--type", "rumor"), "unknown type"),
                        (("remember", "opinion", "x"), "unknown knowledge type")]:
        result = cli(*args, cwd=env["repo"])
        assert result.exit_code == 2 and words in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) <= 2


def test_a_crashed_ingest_is_repaired_by_the_next_run(cli: Callable[..., Any], env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxlake.flows.ingest_conversations as flow

    real = flow.store_messages
    calls = {"n": 0}

    class Failing:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:
                raise LakeError("disk full (injected)")
            return real(*args, **kwargs)

    monkeypatch.setattr(flow, "store_messages", Failing())
    crashed = cli("run", "ingest", *env["args"], cwd=env["repo"])
    assert crashed.exit_code == 8 and "disk full" in crashed.stderr
    state = IndexState.read(env["home"] / "memory")
    assert state is not None and not state.clean
    monkeypatch.setattr(flow, "store_messages", real)
    report = ingest(cli, env)
    # The group that failed is read again, the committed one is not read twice, and the sessions
    # the crashed run stored messages for are summarized now.
    assert 0 < report["messages_inserted"] < 14 and report["files_changed"] < 5
    sessions = cli_json(cli, env["repo"], "sessions", "--all-projects")
    assert len(sessions) == 6 and sum(s["n_messages"] for s in sessions) == 14
    again = ingest(cli, env)
    assert again["up_to_date"] is True


def test_small_ingests_do_not_rewrite_the_tables_until_fragments_pile_up(
        cli: Callable[..., Any], env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import lancedb

    from ctxlake.tasks import memory_store

    monkeypatch.setitem(memory_store.OPTIMIZE_FRAGMENTS, "messages", 6)
    ingest(cli, env)
    messages = lancedb.connect(str(env["home"] / "memory")).open_table("messages")

    def fragments() -> int:  # those written since the last compaction
        messages.checkout_latest()
        return memory_store.new_fragments(messages)

    log = next(env["stores"]["claude"].rglob("sess-a.jsonl"))
    seen, reports = [fragments()], []
    for n in range(8):
        # No digit in the word: a query's "zebra4" also asks for "4", which the tmp path in another
        # message's file paths (pytest-4) can hold.
        word = "zebra" + "abcdefgh"[n]
        write_jsonl(log, [claude("user", f"late{n}", 40 + n, f"{word} rollout note", cwd=str(env["repo"]))], mode="a")
        reports.append(ingest(cli, env))
        seen.append(fragments())
        # A new message is found by keyword at once, whether or not its fragment is indexed yet.
        found = cli_json(cli, env["repo"], "context", "search", word, "--mode", "keyword", "--type", "message")
        assert [h["text"] for h in found["hits"]] == [f"{word} rollout note"]
    compacted = [i for i, r in enumerate(reports) if "messages" in r["optimized"]]
    assert compacted, f"never compacted; fragments per run {seen}"
    first = compacted[0]
    # Until the bar, each ingest only added fragments; the run that reached it compacted them.
    assert all(seen[i + 1] > seen[i] for i in range(first)), seen
    assert seen[first] + 1 >= memory_store.OPTIMIZE_FRAGMENTS["messages"] > seen[first + 1] == 0, seen
    assert all(r["optimized"] == [] for r in reports[:first]) and first >= 2, seen
    forced = ingest(cli, env, "--force")
    assert set(forced["optimized"]) >= {"messages", "sessions"}


def test_an_ingest_in_the_service_leaves_compaction_to_a_process_of_its_own(
        cli: Callable[..., Any], env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The service sets OPTIMIZE_ELSEWHERE_ENV around a `ctx run ingest` in its own process. Checking
    whether a compaction is due opens the table through pylance (`to_lance`), which stayed mapped in
    the service for good (~45 MB); there the run must not reach it, and a run elsewhere compacts."""
    from lancedb.table import LanceTable

    from ctxlake.tasks import memory_store, upkeep

    ingest(cli, env)  # the first ingest builds the indexes (and goes to a child in the service)
    monkeypatch.setitem(memory_store.OPTIMIZE_FRAGMENTS, "messages", 1)  # every new fragment is due
    log = next(env["stores"]["claude"].rglob("sess-a.jsonl"))
    write_jsonl(log, [claude("user", "late0", 40, "zebra rollout note", cwd=str(env["repo"]))], mode="a")

    def no_pylance(self: LanceTable, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("to_lance reached in the service's process")

    with monkeypatch.context() as inside:
        inside.setenv(upkeep.OPTIMIZE_ELSEWHERE_ENV, "1")
        inside.setattr(LanceTable, "to_lance", no_pylance)
        served = ingest(cli, env)
        assert ingest(cli, env)["up_to_date"] is True  # in the service, the rows left do not undo the no-op
    assert served["messages_inserted"] == 1 and served["optimized"] == []
    found = cli_json(cli, env["repo"], "context", "search", "zebra", "--mode", "keyword", "--type", "message")
    assert [h["text"] for h in found["hits"]] == ["zebra rollout note"]  # searchable before any compaction
    later = ingest(cli, env)  # the service's next ingest run, a process of its own: no new logs, yet it
    assert "messages" in later["optimized"]  # goes past the no-op path to compact what was left
    assert ingest(cli, env)["up_to_date"] is True


def test_vectors_reach_every_row_by_the_inline_path_and_after_a_backlog(
        cli: Callable[..., Any], env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import lancedb

    import ctxlake.flows.ingest_conversations as flow
    from ctxlake.tasks.memory_store import EMBED_WHERE

    memory = lancedb.connect(str(env["home"] / "memory"))

    def missing() -> dict[str, int]:
        return {name: memory.open_table(name).count_rows(EMBED_WHERE[name]) for name in ("messages", "sessions")}

    first = ingest(cli, env, "--no-embed")
    assert first["embedded"] == {} and missing()["messages"] > 0 and missing()["sessions"] == 6
    # Rows left without vectors are a backlog: the next run scans for them although its own write is small.
    scans: list[str] = []
    real_embed_table = flow.embed_table

    def counting(table: Any, name: str, *args: Any) -> int:
        scans.append(name)
        return int(real_embed_table(table, name, *args))

    monkeypatch.setattr(flow, "embed_table", counting)
    log = next(env["stores"]["claude"].rglob("sess-a.jsonl"))
    write_jsonl(log, [claude("user", "late1", 40, "Please add a retry", cwd=str(env["repo"]))], mode="a")
    backlog = ingest(cli, env)
    assert missing() == {"messages": 0, "sessions": 0}
    assert {"messages", "sessions"} <= set(scans) and backlog["embedded"]["sessions"] >= 6
    # No backlog: a small write is embedded as it is stored and the whole-table scans are skipped.
    scans.clear()
    write_jsonl(log, [claude("user", "late2", 41, "Retry added with backoff", cwd=str(env["repo"]))], mode="a")
    small = ingest(cli, env)
    assert missing() == {"messages": 0, "sessions": 0}
    assert scans == ["knowledge"] and small["embedded"]["messages"] == 1 and small["embedded"]["sessions"] >= 1
    found = cli_json(cli, env["repo"], "context", "search", "backoff retry", "--mode", "semantic", "--type", "message")
    assert found["hits"][0]["text"] == "Retry added with backoff"


def test_reads_are_scoped_by_the_recorded_project_paths(cli: Callable[..., Any], env: dict[str, Any]) -> None:
    from ctxlake.tasks.memory_state import PROJECTS_FILE, read_project_paths
    from ctxlake.tasks.sessionize import scope_filter

    ingest(cli, env)
    memory = env["home"] / "memory"
    recorded = read_project_paths(memory)
    assert recorded is not None and str(env["repo"]) in recorded and "/srv/u/other" in recorded
    mine = cli_json(cli, env["repo"], "sessions")
    # A lake from before the record: reads fall back to the prefix match, the next ingest rebuilds it.
    (memory / PROJECTS_FILE).unlink()
    assert cli_json(cli, env["repo"], "sessions") == mine
    log = next(env["stores"]["claude"].rglob("sess-a.jsonl"))
    write_jsonl(log, [claude("user", "late1", 40, "One more thing", cwd=str(env["repo"] / "docs"))], mode="a")
    ingest(cli, env)
    assert read_project_paths(memory) == recorded | {str(env["repo"] / "docs")}
    assert [s["session_ref"] for s in cli_json(cli, env["repo"], "sessions")] == [s["session_ref"] for s in mine]
    # A sibling folder sharing the name's prefix is another project.
    paths = {"/srv/app", "/srv/app/sub", "/srv/app2"}
    assert scope_filter("/srv/app/", paths) == "project_path IN ('/srv/app', '/srv/app/sub')"
    assert scope_filter("/srv/none", paths) == "project_path IN ('/srv/none')"
    assert "LIKE '/srv/app/%'" in scope_filter("/srv/app", None)


def test_an_ingest_bounds_its_heap_and_trims_after_each_group(
    cli: Callable[..., Any], env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long cold ingest grew on memory glibc kept per thread (docs/measurements/memory.md, "A long
    history"): the in-process run asks for two arenas before Prefect starts, and gives freed pages
    back after each group of logs it stored."""
    import ctxlake.flows.ingest_conversations as flow
    from ctxlake.tasks import heap

    bounded: list[int | None] = []
    trims: list[int] = []
    monkeypatch.setattr(heap, "bound_heap", lambda mmap_bytes=heap.HEAP_MMAP_BYTES: bounded.append(mmap_bytes) or True)
    monkeypatch.setattr(flow, "give_back_freed_memory", lambda: trims.append(len(trims)))
    monkeypatch.setenv(heap.SHUFFLE_ENV, "0")
    monkeypatch.delenv(heap.SHUFFLE_ENV)  # unset here, and unset again after the test
    report = ingest(cli, env)
    assert bounded == [None]  # arenas only: the mmap bound costs a writer time (bound_writer_heap)
    assert os.environ[heap.SHUFFLE_ENV] == str(heap.SHUFFLE_BATCH_BYTES)  # vector index builds' buffers
    assert report["messages_inserted"] == 14
    assert len(trims) >= len(report["tools"]) == 3  # each tool's logs are one group at least


def test_a_users_own_index_build_buffer_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.tasks import heap

    monkeypatch.setenv(heap.SHUFFLE_ENV, str(256 << 20))
    heap.bound_index_builds()
    assert os.environ[heap.SHUFFLE_ENV] == str(256 << 20)

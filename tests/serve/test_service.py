"""The always-on service as real processes in a tmp $CTX_HOME: start, forward, fall back, watch,
recover from SIGKILL, refuse garbage, stop without orphans, and MCP through the stdlib proxy."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anyio
import psutil
import pytest
from helpers import gone_within
from mcp import Client, StdioServerParameters
from mcp_helpers import PROJECT, call_ok
from memlogs import claude, write_jsonl

from ctxlake.serve.service import protocol

pytestmark = pytest.mark.usefixtures("prefect_server")

CTX = str(Path(sys.executable).parent / "ctx")
FD_LIMIT = 400  # the descriptors a service gets in the test that runs it out of them
HEAVY = ("lancedb", "pyarrow", "torch", "prefect", "pydantic", "typer", "rich")


def ctx(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def service_dir(home: Path) -> Path:
    return home / "service"


def service_pid(home: Path) -> int:
    return int(json.loads((service_dir(home) / "service.json").read_text())["pid"])


@pytest.fixture(autouse=True)
def no_schedules(ctx_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Most tests here are about the transport: their services skip the Prefect server (~10 s each);
    test_service_runs_the_schedules_and_stops_them_with_it turns it back on."""
    monkeypatch.setenv("CTX_SERVICE_SCHEDULES", "false")


@pytest.fixture
def indexed(make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any) -> Path:
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    return repo


@pytest.fixture
def service(indexed: Path, ctx_home: Path) -> Iterator[Path]:
    """A running service for this test's home; stopped (forcibly if need be) afterwards."""
    started = ctx("up", cwd=indexed)
    assert started.returncode == 0, started.stderr
    yield ctx_home
    ctx("down", cwd=indexed)
    info = service_dir(ctx_home) / "service.json"
    if info.exists():  # a test that killed it and did not restart: leave nothing running
        with contextlib.suppress(ProcessLookupError):
            os.kill(service_pid(ctx_home), signal.SIGKILL)


def test_forwarded_output_equals_in_process_and_files_are_private(indexed: Path, service: Path) -> None:
    via_service = ctx("search", "invoice total", cwd=indexed)
    as_json = ctx("search", "invoice total", "--json", cwd=indexed)
    assert via_service.returncode == 0, via_service.stderr
    assert json.loads(as_json.stdout)["hits"][0]["path"] == "src/billing/invoice.py"
    folder = service_dir(service)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "ctx.sock").stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / "service.json").stat().st_mode) == 0o600
    # A domain error keeps its exit code and message through the service.
    bad = ctx("search", "x", "--mode", "nope", cwd=indexed)
    assert bad.returncode == 2 and "unknown --mode" in bad.stderr
    assert ctx("down", cwd=indexed).returncode == 0
    in_process = ctx("search", "invoice total", cwd=indexed)
    assert in_process.returncode == 0
    assert in_process.stdout == via_service.stdout and in_process.stderr == via_service.stderr


def test_forced_index_runs_in_a_child_and_reports_through_the_service(indexed: Path, service: Path) -> None:
    pid = service_pid(service)
    before = {c.pid for c in psutil.Process(pid).children(recursive=True)}
    seen: set[int] = set()
    niceness: set[int] = set()
    proc = subprocess.Popen([CTX, "run", "index", "--force", "--json"], cwd=indexed, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:  # the whole-tree run is a child of the service, not its own thread
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=False):
                if child.pid not in before and "in_process" in " ".join(child.cmdline()):
                    seen.add(child.pid)
                    niceness.add(child.nice())
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["added"] >= 2 and report["files_seen"] >= 2  # the child's report came back whole
    assert seen, "no child process ran the forced index"
    # Lower priority than the service's queries (a few early samples may predate its os.nice call).
    assert max(niceness) >= psutil.Process(pid).nice() + 10, niceness
    assert service_pid(service) == pid
    assert json.loads(ctx("search", "invoice total", "--json", cwd=indexed).stdout)["hits"]


def _imports_of(argv: list[str], cwd: Path, stdin: str | None = None) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the thin client with ARGV under -X importtime: its result and the top-level packages it imported."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "ctxlake.serve.service.client", *argv],
                         cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60, check=False)
    return run, {line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines() if "|" in line}


def test_commands_and_mcp_sessions_are_served_while_a_forced_index_runs(indexed: Path, service: Path) -> None:
    """A whole-tree run in its child takes minutes on a big project: meanwhile the service keeps
    answering (it used to hold its one-request-at-a-time state for the child's whole run, and
    every command and new `ctx serve` fell back to a cold in-process engine)."""
    from ctxlake.tasks.lake import WriterLock

    pid = service_pid(service)
    held = WriterLock(indexed / ".ctx" / "lake", purpose="the test").acquire()  # the child waits on it
    try:
        run, seen = None, set()
        proc = subprocess.Popen([CTX, "run", "index", "--force", "--json", "--wait", "120"], cwd=indexed,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                seen = {c.pid for c in psutil.Process(pid).children() if "in_process" in " ".join(c.cmdline())}
            time.sleep(0.05)
        assert seen, "the forced run did not start its child"
        run, imported = _imports_of(["search", "invoice"], indexed)
        assert run.returncode == 0 and "invoice.py" in run.stdout, run.stderr[-2000:]
        assert not imported & set(HEAVY), f"ran in-process, not in the service: {sorted(imported & set(HEAVY))}"
        init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
        served, imported = _imports_of(["serve"], indexed, stdin=init + "\n")
        assert json.loads(served.stdout.splitlines()[0])["result"]["serverInfo"], served.stderr[-2000:]
        assert not imported & set(HEAVY), f"an in-process MCP server, not the proxy: {sorted(imported & set(HEAVY))}"
        # Another index run meanwhile is told at once, as without the service, instead of waiting
        # (the wait is for the service's own watcher batches, which take a moment).
        started = time.monotonic()
        second = ctx("run", "index", cwd=indexed)
        assert second.returncode != 0 and "another writer holds the lake" in second.stderr, second.stderr
        assert time.monotonic() - started < 30
        assert proc.poll() is None, "the forced run ended before the lock was given back"
    finally:
        held.release()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["files_seen"] >= 2


def _children_running(pid: int, argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """Run `ctx ARGV`; the service's children that ran the in-process path meanwhile."""
    before = {c.pid for c in psutil.Process(pid).children(recursive=True)}
    seen: set[int] = set()
    proc = subprocess.Popen([CTX, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=False):
                if child.pid not in before and "in_process" in " ".join(child.cmdline()):
                    seen.add(child.pid)
        time.sleep(0.02)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def test_the_first_run_of_an_unwatched_project_runs_in_a_child_then_runs_stay(indexed: Path, service: Path) -> None:
    """A project's first run here scans its whole tree (a child: its memory goes when it ends);
    once watched, its runs find the watcher's batches applied and run in the service."""
    pid = service_pid(service)
    (indexed / "src" / "billing" / "invoice.py").write_text("def total_with_tax(x):\n    return x * 1.2\n")
    first, seen = _children_running(pid, ["run", "index", "--json"], indexed)
    assert first.returncode == 0, first.stderr
    assert seen, "the first run of an unwatched project did not run in a child"
    assert json.loads(first.stdout)["modified"] == 1
    (indexed / "src" / "billing" / "invoice.py").write_text("def total_with_vat(x):\n    return x * 1.25\n")
    second, seen = _children_running(pid, ["run", "index", "--json"], indexed)
    assert second.returncode == 0, second.stderr
    assert not seen, "a run of a watched project went to a child"
    hits = json.loads(ctx("search", "total_with_vat", "--mode", "keyword", "--json", cwd=indexed).stdout)["hits"]
    assert hits and hits[0]["path"] == "src/billing/invoice.py"
    assert service_pid(service) == pid


def test_a_projects_first_run_without_a_path_is_watched_after(
        make_repo: Callable[..., Path], indexed: Path, service: Path) -> None:
    """`ctx run index` in a new project (no .ctx/ yet, no path given) through the service: once it
    succeeds the project is watched, like one named by its path."""
    fresh = make_repo({"tool.py": "def sharpen_the_pencil():\n    return 1\n"}, name="fresh")
    assert not (fresh / ".ctx").exists()
    assert ctx("run", "index", cwd=fresh).returncode == 0
    watching = json.loads(ctx("status", "--json", cwd=fresh).stdout)["service"]["watching"]
    assert str(fresh.resolve()) in watching, watching


def test_files_written_through_the_service_name_no_ctx_home_the_user_did_not_set(
        indexed: Path) -> None:
    """`ctx init` through the service writes the same .mcp.json as in-process: with CTX_HOME unset
    it names no folder of this machine (the service's own home must not leak into it)."""
    home = Path(tempfile.mkdtemp(prefix="ctx-h"))  # short: the socket's path must fit sun_path
    env = {k: v for k, v in os.environ.items() if k not in ("CTX_HOME", "XDG_DATA_HOME")}
    env.update(HOME=str(home), CTX_SERVICE_SCHEDULES="false")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CTX, *args], cwd=indexed, env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    assert run("up").returncode == 0
    try:
        assert "Service: up" in run("status").stdout
        made = run("init", "--client", "claude", "--yes")
        assert made.returncode == 0, made.stderr
        entry = json.loads((indexed / ".mcp.json").read_text())["mcpServers"]["ctx"]
        assert "CTX_HOME" not in json.dumps(entry), entry
    finally:
        run("down")
        shutil.rmtree(home, ignore_errors=True)


def test_help_and_flow_output_through_the_service_are_as_in_process(indexed: Path, service: Path) -> None:
    """Help and usage errors name `ctx`, not the daemon's module, and a flow run here hands back
    no Prefect INFO lines."""
    helped = ctx("search", "--help", cwd=indexed)
    assert helped.returncode == 0 and "Usage: ctx search" in helped.stdout, helped.stdout
    assert "Usage: ctx search" in ctx("search", cwd=indexed).stderr
    # A service started without the test session's quiet Prefect settings, as a user's is.
    assert ctx("down", cwd=indexed).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_LOGGING")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CTX, *args], cwd=indexed, env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    assert run("up").returncode == 0
    ingested = run("run", "ingest")
    assert ingested.returncode == 0, ingested.stderr
    assert "INFO" not in ingested.stderr and "Task run" not in ingested.stderr, ingested.stderr


def _new_session(logs: Path, n: int) -> list[str]:
    """A small Claude Code transcript under `logs`: the `--from` argument that reads it."""
    write_jsonl(logs / "projects" / "-srv-app" / f"sess-{n}.jsonl", [
        claude("user", f"u{n}", n, f"why does the invoice total drift, case {n}?", session=f"sess-{n}"),
        claude("assistant", f"a{n}", n + 0.5, [{"type": "text", "text": f"rounding in case {n}"}], session=f"sess-{n}"),
    ])
    return [f"--from=claude={logs / 'projects'}"]


def test_a_first_or_forced_ingest_runs_in_a_child_and_later_ones_in_the_service(
        indexed: Path, service: Path, tmp_path: Path) -> None:
    """The first ingest reads every log there is (minutes and ~1.5 GB at 20,000 sessions) and a
    forced one compacts every table: in a child, as whole-tree index runs are. Later ones stay."""
    pid, logs = service_pid(service), tmp_path / "logs"
    first, seen = _children_running(pid, ["run", "ingest", *_new_session(logs, 1)], indexed)
    assert first.returncode == 0, first.stderr[-3000:]
    assert seen, "the first ingest did not run in a child"
    later, seen = _children_running(pid, ["run", "ingest", *_new_session(logs, 2)], indexed)
    assert later.returncode == 0, later.stderr[-3000:]
    assert not seen, "a later ingest went to a child"
    # It left compaction to a process of its own: pylance (lance's second copy, which the compaction
    # and even its check load) would stay mapped in the service for good.
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "lance/lance.abi3.so" not in maps and "lancedb/_lancedb.abi3.so" in maps
    forced, seen = _children_running(pid, ["run", "ingest", "--force", *_new_session(logs, 3)], indexed)
    assert forced.returncode == 0 and seen, forced.stderr[-3000:]
    found = ctx("context", "search", "rounding in case 3", "--all-projects", "--json", cwd=indexed)
    assert found.returncode == 0 and "case 3" in found.stdout, found.stderr


def test_adding_a_source_runs_in_a_child(indexed: Path, service: Path, tmp_path: Path) -> None:
    """`ctx add` fetches and indexes a whole source: in the service's child, as whole-tree index
    runs are; the source is then searched with the project through the service."""
    docs = tmp_path / "handbook"
    (docs / "guide").mkdir(parents=True)
    (docs / "guide" / "refunds.md").write_text("# Refunds\n\nA refund voucher expires after ninety days.\n")
    added, seen = _children_running(service_pid(service), ["add-docs", "handbook", str(docs), "--json"], indexed)
    assert added.returncode == 0, added.stderr[-3000:]
    assert seen, "adding a source did not run in a child"
    found = ctx("search", "refund voucher expires", "--mode", "keyword", "--json", cwd=indexed)
    assert any(h["source"] == "handbook" for h in json.loads(found.stdout)["hits"]), found.stdout


def test_eval_runs_in_its_own_client() -> None:
    """`ctx eval` indexes whole trees for minutes to hours and prints each task as it goes: it is
    never sent to the service (where it held the one CLI request slot and the interpreter)."""
    from ctxlake.serve.service.client import runs_locally

    assert runs_locally(["eval", "tasks.jsonl", "--mirrors", "m"])
    assert not runs_locally(["search", "eval"])


def test_flow_runs_in_a_service_without_schedules_each_find_prefect_up(
        indexed: Path, service: Path, tmp_path: Path) -> None:
    """Without its own Prefect server (schedules off) the service starts Prefect's temporary one in
    the thread of the first flow run's request. The kernel's parent-death signal, set for a
    command's server, killed it as that thread ended, and every later run ended in
    `httpx.ConnectError: Connection refused`."""
    assert ctx("run", "ingest", *_new_session(tmp_path, 0), cwd=indexed, timeout=300).returncode == 0  # a child's
    for n in range(1, 4):  # each has a new session to store: a flow run in the service
        ingested = ctx("run", "ingest", *_new_session(tmp_path, n), cwd=indexed, timeout=300)
        assert ingested.returncode == 0, ingested.stderr[-3000:]
        assert "ConnectError" not in ingested.stderr, ingested.stderr[-3000:]


def test_schedule_commands_say_the_service_runs_no_schedules(indexed: Path, service: Path) -> None:
    listed = ctx("schedule", "list", cwd=indexed)
    assert listed.returncode == 1 and "the service runs no schedules" in listed.stderr, listed.stderr
    assert "schedules = false" in listed.stderr and "not running" not in listed.stderr


def test_thin_client_imports_nothing_heavy(indexed: Path, service: Path) -> None:
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "ctxlake.serve.service.client", "search",
                          "invoice"], cwd=indexed, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and "invoice.py" in run.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines() if "|" in line}
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    # Nor the standard library's slower modules: each command served pays its client's start-up
    # (these four were ~25 ms of ~60).
    slow = {"dataclasses", "inspect", "tomllib", "shutil"}
    assert not imported & slow, sorted(imported & slow)


def test_edit_is_searchable_through_the_watcher(indexed: Path, ctx_home: Path) -> None:
    assert ctx("up", "--watch", str(indexed), cwd=indexed).returncode == 0
    try:
        status = ctx("status", cwd=indexed)
        assert "Service: up" in status.stdout and str(indexed) in status.stdout
        (indexed / "src" / "billing" / "refund.py").write_text("def issue_refund_voucher(order):\n    return order\n")
        deadline, found = time.monotonic() + 60, False  # functional, not timed: CI may be loaded
        while time.monotonic() < deadline and not found:
            out = ctx("search", "issue_refund_voucher", "--mode", "keyword", "--json", cwd=indexed)
            found = any(h["path"] == "src/billing/refund.py" for h in json.loads(out.stdout)["hits"])
            time.sleep(0.1)
        assert found, "the edit never became searchable"
    finally:
        ctx("down", cwd=indexed)


def test_kill_9_falls_back_then_up_recovers(indexed: Path, service: Path) -> None:
    first = service_pid(service)
    os.kill(first, signal.SIGKILL)
    psutil.Process(first).wait(10) if psutil.pid_exists(first) else None
    assert (service_dir(service) / "ctx.sock").exists()  # stale socket left behind
    fallback = ctx("search", "invoice", "--json", cwd=indexed)
    assert fallback.returncode == 0 and json.loads(fallback.stdout)["hits"]
    again = ctx("up", cwd=indexed)
    assert again.returncode == 0 and "started" in again.stdout, again.stderr
    assert service_pid(service) != first
    assert ctx("search", "invoice", "--json", cwd=indexed).returncode == 0


def test_a_stopped_service_holds_no_command(indexed: Path, service: Path) -> None:
    """SIGSTOP: the socket still accepts, nothing answers. Commands (and `ctx status`, which a
    session hook runs too) say so and run in their own process instead of waiting for ever."""
    pid = service_pid(service)
    os.kill(pid, signal.SIGSTOP)
    try:
        found = ctx("search", "invoice", "--json", cwd=indexed, timeout=90)
        assert found.returncode == 0 and json.loads(found.stdout)["hits"], found.stderr
        assert "did not answer in time" in found.stderr
        status = ctx("status", cwd=indexed, timeout=90)
        assert "Service: up, but it did not answer in time" in status.stdout, status.stdout + status.stderr
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ctx("search", "invoice", "--json", cwd=indexed).returncode == 0
    assert service_pid(service) == pid


def test_two_concurrent_ups_start_one_service(indexed: Path, ctx_home: Path) -> None:
    procs = [subprocess.Popen([CTX, "up"], cwd=indexed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs)
        pids = {line.split("pid ")[1].split(",")[0] for out in outs for line in out.splitlines() if "pid " in line}
        assert len(pids) == 1, outs
        daemons = [p for p in psutil.process_iter(["cmdline", "environ"])
                   if "ctxlake.serve.service.daemon" in " ".join(p.info["cmdline"] or [])
                   and (p.info["environ"] or {}).get("CTX_HOME") == str(ctx_home)]
        assert len(daemons) == 1
    finally:
        ctx("down", cwd=indexed)


def test_up_and_down_answer_in_json_for_scripts(indexed: Path, ctx_home: Path) -> None:
    try:
        first = json.loads(ctx("up", "--json", cwd=indexed).stdout)
        again = json.loads(ctx("up", "--json", cwd=indexed).stdout)
        assert first["started"] is True and again["started"] is False and first["pid"] == again["pid"]
        assert first["pid"] == service_pid(ctx_home) and Path(first["socket"]).is_socket()
    finally:
        stopped = json.loads(ctx("down", "--json", cwd=indexed).stdout)
    assert stopped["stopped"] is True and stopped["pid"] == first["pid"]
    assert json.loads(ctx("down", "--json", cwd=indexed).stdout) == {**stopped, "stopped": False, "pid": None,
                                                                     "seconds": ANY}
    refused = ctx("up", "--foreground", "--json", cwd=indexed)
    assert refused.returncode == 2 and json.loads(refused.stdout)["code"] == 2


def test_a_served_query_stops_when_its_client_quits(indexed: Path, service: Path) -> None:
    """A `ctx sql` the service ran for a client that quit (Ctrl-C) went on to [sql] timeout_s (60 s
    by default), a core busy for nobody and the service's request slot taken; it stops at once."""
    served = psutil.Process(service_pid(service))

    def cpu() -> float:
        times = served.cpu_times()
        return float(times.user + times.system)

    before = cpu()
    client = subprocess.Popen([CTX, "sql", "SELECT sum(hash(i)) FROM range(100000000000) t(i)"], cwd=indexed,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cpu() - before < 1.0:  # the query is running in the service
        time.sleep(0.1)
    assert cpu() - before >= 1.0 and client.poll() is None, "the query never ran in the service"
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=20)
    assert client.returncode == 130 and "interrupted" in err, err
    time.sleep(2.0)  # the service notices within a second
    idle_from = cpu()
    time.sleep(2.0)
    assert cpu() - idle_from < 0.5, "the service is still busy with the query"
    assert "the client of `ctx sql" in (service_dir(service) / "service.log").read_text()
    answer = ctx("sql", "SELECT 41 + 1 AS n", "--json", cwd=indexed)
    assert answer.returncode == 0 and json.loads(answer.stdout)["rows"] == [[42]], answer.stderr


def _forced_run_in_a_child(home: Path, project: Path, *options: str) -> tuple[subprocess.Popen[str], psutil.Process]:
    """`ctx run index --force` sent to the service, once the service's child runs it: (the client, the child)."""
    pid = service_pid(home)
    client = subprocess.Popen([CTX, "run", "index", "--force", *options], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline, child = time.monotonic() + 60, None
    while child is None and time.monotonic() < deadline and client.poll() is None:
        child = next((c for c in psutil.Process(pid).children() if "in_process" in " ".join(c.cmdline())), None)
        time.sleep(0.02)
    assert child is not None, "the forced run did not start a child of the service"
    return client, child


def test_a_served_child_run_stops_when_its_client_quits(indexed: Path, service: Path) -> None:
    """A forced re-index runs in the service's child: a Ctrl-C of its client stops it there as a
    Ctrl-C stops it without the service (exit 130), instead of it running on for nobody; the next
    run and the searches find the lake whole."""
    client, child = _forced_run_in_a_child(service, indexed)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=20)
    assert client.returncode == 130 and "interrupted" in err, err
    assert gone_within(child.pid, 30), "the child run went on after its client quit"
    log = service_dir(service) / "service.log"
    deadline = time.monotonic() + 10
    while "left before its answer" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "client gone: interrupting `ctx run index`" in log.read_text()
    ended = re.search(r"`ctx run index --force` left before its answer \(exit (-?\d+)\)", log.read_text())
    assert ended is not None and ended.group(1) != "0", log.read_text()[-2000:]  # stopped, not run to its end
    again = ctx("run", "index", cwd=indexed, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    found = ctx("search", "invoice total", "--json", cwd=indexed)
    assert json.loads(found.stdout)["hits"][0]["path"] == "src/billing/invoice.py", found.stderr


def test_ctx_down_during_a_child_run_leaves_the_run_to_its_client(indexed: Path, service: Path) -> None:
    """`ctx down` while a forced re-index ran in the service's child ended the client with exit 0 or
    241 and no output at all, the index not done: it now runs the command itself, with a notice."""
    client, _ = _forced_run_in_a_child(service, indexed, "--json")
    assert ctx("down", cwd=indexed).returncode == 0
    out, err = client.communicate(timeout=300)
    assert client.returncode == 0 and "running here instead" in err, err[-3000:]
    assert json.loads(out)["files_seen"] > 0  # the run, done here


def test_a_folder_where_the_socket_belongs_is_named_not_a_traceback(indexed: Path, ctx_home: Path) -> None:
    (service_dir(ctx_home) / "ctx.sock").mkdir(parents=True)
    started = ctx("up", cwd=indexed)
    assert started.returncode != 0 and "Traceback" not in started.stderr, started.stderr
    assert "is a folder where the service's socket belongs" in started.stderr


def test_the_service_outlives_running_out_of_descriptors(indexed: Path, ctx_home: Path) -> None:
    """accept() failing with EMFILE (a client holding thousands of connections) ended the service:
    the accept loop re-raised every OSError but a timeout."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    started = subprocess.run([CTX, "up"], cwd=indexed, capture_output=True, text=True, timeout=120, check=False,
                             preexec_fn=low_limit)
    assert started.returncode == 0, started.stderr
    try:
        pid = service_pid(ctx_home)
        assert ctx("search", "invoice total", cwd=indexed).returncode == 0
        held: list[socket.socket] = []
        log = service_dir(ctx_home) / "service.log"
        deadline = time.monotonic() + 60
        while "imports warmed" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)  # its warm-up imports need descriptors too: this is about taking connections
        # More connections than the service can hold descriptors for, as fast as it takes them.
        while "cannot take a connection now" not in log.read_text() and time.monotonic() < deadline:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(service_dir(ctx_home) / "ctx.sock"))
            except BlockingIOError:  # its listen queue is full for now
                sock.close()
                time.sleep(0.01)
                continue
            held.append(sock)
        assert "cannot take a connection now" in log.read_text() and psutil.pid_exists(pid)
        for sock in held:
            sock.close()
        found = ctx("search", "invoice total", "--json", cwd=indexed)
        assert found.returncode == 0 and json.loads(found.stdout)["hits"][0]["path"] == "src/billing/invoice.py"
        assert service_pid(ctx_home) == pid and psutil.Process(pid).is_running()
        assert "Traceback" not in log.read_text()
    finally:
        ctx("down", cwd=indexed)


def test_a_served_run_shows_its_progress_on_a_terminal(indexed: Path, service: Path) -> None:
    """A command the service runs (a forced index: in its child) for a client whose stderr is a
    terminal draws its stages on one status line while it runs, as the in-process path draws its
    bars; the result comes as before, and the line is cleared at the end."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([CTX, "run", "index", "--force"], cwd=indexed, stdout=subprocess.PIPE,
                            stderr=slave, text=True, env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end closed with the process
            break
        if not data:
            break
        seen += data
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "indexed" in out.lower(), out
    drawn = [part for part in text.split("\r\x1b[2K") if part.strip()]
    assert any(word in " ".join(drawn) for word in ("starting", "scanning", "chunking", "embedding")), text
    assert text.count("\r\x1b[2K") > len(drawn), text  # each line drawn over the last, then cleared


def test_garbage_gets_an_error_and_the_service_stays_up(indexed: Path, service: Path) -> None:
    sock_path = str(service_dir(service) / "ctx.sock")
    for garbage in (b"\x00\x00\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n", struct.pack(">I", 2**31) + b"x"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(sock_path)
            sock.sendall(garbage)
            (length,) = struct.unpack(">I", sock.recv(4))
            reply = json.loads(sock.recv(length))
            assert reply["op"] == "error" and "bad request" in reply["message"]
    # Frames of the protocol with fields of the wrong type: an error answer, not a closed
    # connection ("columns": "abc"), nor "abc" taken for three folders to watch.
    for message in ({"op": "cli", "argv": ["search", "x"], "cwd": str(indexed), "columns": "abc"},
                    {"op": "cli", "argv": ["search", "x"], "cwd": str(indexed), "env": [1, 2]},
                    {"op": "cli", "argv": "search x", "cwd": str(indexed)},
                    {"op": "watch", "paths": "abc"}, {"op": "watch", "paths": ["relative/folder"]}):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(sock_path)
            data = json.dumps({**message, "v": 1}).encode()
            sock.sendall(struct.pack(">I", len(data)) + data)
            (length,) = struct.unpack(">I", sock.recv(4))
            reply = json.loads(sock.recv(length))
            assert reply["op"] == "error" and reply["code"] == 2, (message, reply)
    assert ctx("search", "invoice", cwd=indexed).returncode == 0
    assert "Service: up" in ctx("status", cwd=indexed).stdout
    watching = json.loads(ctx("status", "--json", cwd=indexed).stdout)["service"]["watching"]
    assert not [w for w in watching if w.endswith(("/a", "/b", "/c", "relative/folder"))], watching


def _as_nobody(sock_path: str) -> str:
    """Connect to the service from a forked child running as uid 65534; what happened, as a word."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try, report one word through the pipe, exit at once
        word = b"?"
        try:
            # Enter the folder first: the test's tmp parents are root's own (0700), and a relative
            # path then tests only the service folder's and the socket's permissions.
            os.chdir(os.path.dirname(sock_path))
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(os.path.basename(sock_path))
                # Send nothing: a refused peer is answered at once, an accepted one is waited on.
                (length,) = struct.unpack(">I", sock.recv(4))
                reply = json.loads(sock.recv(length))
                word = b"refused" if "another user" in reply.get("message", "") else b"answered"
        except PermissionError:
            word = b"denied"
        except TimeoutError:
            word = b"served"  # the service waited for this peer's request
        except BaseException:
            word = b"error"
        os.write(write_end, word)
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as fh:
        return fh.read().decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_another_user_is_refused(indexed: Path, service: Path) -> None:
    folder = service_dir(service)
    sock_path = str(folder / "ctx.sock")
    assert _as_nobody(sock_path) == "denied"  # the 0700 folder and 0600 socket keep others out
    folder.chmod(0o755)  # a user who loosens the permissions still gets no service from it:
    (folder / "ctx.sock").chmod(0o666)  # the service checks the peer's uid (SO_PEERCRED)
    try:
        assert _as_nobody(sock_path) == "refused"
    finally:
        folder.chmod(0o700)
        (folder / "ctx.sock").chmod(0o600)
    assert ctx("search", "invoice", cwd=indexed).returncode == 0


def test_down_leaves_no_child_processes(indexed: Path, service: Path) -> None:
    # An index run in the service starts Prefect's temporary API server as a child.
    (indexed / "new_module.py").write_text("def brand_new_function():\n    return 1\n")
    assert ctx("run", "index", cwd=indexed, timeout=300).returncode == 0
    proc = psutil.Process(service_pid(service))
    tree = [proc, *proc.children(recursive=True)]
    assert ctx("down", cwd=indexed).returncode == 0
    _gone, alive = psutil.wait_procs(tree, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline() for p in alive]
    assert not (service_dir(service) / "ctx.sock").exists()


def test_mcp_through_the_proxy(indexed: Path, service: Path) -> None:
    params = StdioServerParameters(command=CTX, args=["serve", "--root", str(indexed)], env=dict(os.environ),
                                   cwd=str(indexed.parent))
    rss: list[float] = []

    async def main() -> None:
        async with Client(params) as client:
            assert client.server_info is not None and client.server_info.name == "ctxlake"
            found = await call_ok(client, "search_code", {"query": "invoice total"})
            assert found["hits"][0]["path"] == "src/billing/invoice.py"
            proxies = [p for p in psutil.Process().children(recursive=True)
                       if p.cmdline()[1:2] == ["serve"] or "serve" in p.cmdline()[-3:]]
            rss.extend(p.memory_info().rss for p in proxies)

    anyio.run(main)
    assert rss and max(rss) < 80 * 2**20, rss  # the proxy is a small stdlib process, not an engine


def test_concurrent_forwarded_commands_do_not_mix(indexed: Path, service: Path) -> None:
    results: dict[str, str] = {}

    def one(query: str) -> None:
        results[query] = ctx("search", query, "--json", cwd=indexed).stdout

    threads = [threading.Thread(target=one, args=(q,)) for q in ("invoice", "getUserById", "currency")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for query, out in results.items():
        assert json.loads(out)["query"] == query


def test_deleted_project_is_dropped_and_the_service_stays_up(indexed: Path, ctx_home: Path,
                                                                 tmp_path: Path) -> None:
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    (doomed / "a.py").write_text("x = 1\n")
    assert ctx("up", "--watch", str(doomed), "--watch", str(indexed), cwd=indexed).returncode == 0
    try:
        import shutil

        shutil.rmtree(doomed)
        log = service_dir(ctx_home) / "service.log"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "dropped" not in log.read_text():
            time.sleep(0.2)
        assert f"dropped {doomed}" in log.read_text()
        status = ctx("status", cwd=indexed).stdout
        assert "watching 1 project(s)" in status and str(indexed) in status
    finally:
        ctx("down", cwd=indexed)


def test_watched_projects_are_watched_again_after_a_restart(
        indexed: Path, ctx_home: Path, make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    import shutil

    other = make_repo(PROJECT, name="other")
    assert cli("run", "index", cwd=other).exit_code == 0
    assert ctx("up", "--watch", str(indexed), "--watch", str(other), cwd=indexed).returncode == 0
    record = service_dir(ctx_home) / "watched.json"
    try:
        assert "watching 2 project(s)" in ctx("status", cwd=indexed).stdout
        assert sorted(json.loads(record.read_text())) == sorted([str(indexed.resolve()), str(other.resolve())])
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
    finally:
        ctx("down", cwd=indexed)
    shutil.rmtree(other / ".ctx" / "lake")  # `ctx clean` there: nothing left to keep fresh
    assert ctx("up", cwd=indexed).returncode == 0  # no --watch: the record says what to watch
    try:
        status = ctx("status", cwd=indexed).stdout
        assert "watching 1 project(s)" in status and str(indexed) in status and str(other) not in status
        assert f"not watching {other.resolve()} again" in (service_dir(ctx_home) / "service.log").read_text()
    finally:
        ctx("down", cwd=indexed)


def test_watcher_outwaits_another_writer_and_down_does_not_wait_for_it(indexed: Path, service: Path) -> None:
    """A forced re-index may hold the lake for minutes: the watcher keeps the edit pending (stale to
    readers) and applies it once the lake is free; `ctx down` meanwhile stops it at once."""
    from ctxlake.tasks.lake import WriterLock

    assert ctx("run", "index", cwd=indexed).returncode == 0  # registers: the service watches it
    held = WriterLock(indexed / ".ctx" / "lake", purpose="test: a long re-index").acquire()
    try:
        (indexed / "late.py").write_text("def applied_after_the_lock():\n    return 1\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answer = json.loads(ctx("search", "applied_after_the_lock", "--mode", "keyword", "--json", cwd=indexed).stdout)
            if "late.py" in answer.get("stale_paths", []):
                break
            time.sleep(0.3)
        assert answer["stale"] and "late.py" in answer["stale_paths"]
        assert all(hit["path"] != "late.py" for hit in answer["hits"])  # not in the lake yet
    finally:
        held.release()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hits = json.loads(ctx("search", "applied_after_the_lock", "--mode", "keyword", "--json", cwd=indexed).stdout)["hits"]
        if any(hit["path"] == "late.py" for hit in hits):
            break
        time.sleep(0.3)
    assert any(hit["path"] == "late.py" for hit in hits)  # the same watcher, still alive, applied it

    held = WriterLock(indexed / ".ctx" / "lake", purpose="test: a long re-index").acquire()
    try:
        (indexed / "later.py").write_text("def waits_for_the_lock():\n    return 2\n")
        time.sleep(1.0)  # the watcher now waits for the lake
        started = time.monotonic()
        assert ctx("down", cwd=indexed).returncode == 0
        assert time.monotonic() - started < 8, "ctx down waited for a watcher stuck on the lock"
    finally:
        held.release()


def test_autostart_starts_the_service_when_enabled(indexed: Path, ctx_home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    off = ctx("search", "invoice", cwd=indexed)
    assert off.returncode == 0 and not (service_dir(ctx_home) / "ctx.sock").exists()  # off by default
    monkeypatch.setenv("CTX_SERVICE_AUTOSTART", "1")
    try:
        on = ctx("search", "invoice", cwd=indexed)
        assert on.returncode == 0 and on.stdout == off.stdout
        assert "Service: up" in ctx("status", cwd=indexed).stdout
    finally:
        ctx("down", cwd=indexed)
    # From the project's config.toml only once the user trusts that content: a clone's committed
    # `autostart = true` started a long-lived service (watchers, schedules, a web UI port).
    monkeypatch.delenv("CTX_SERVICE_AUTOSTART")
    config = indexed / ".ctx" / "config.toml"
    config.write_text(config.read_text() + "\n[service]\nautostart = true\n")
    untrusted = ctx("search", "invoice", cwd=indexed)
    assert untrusted.returncode == 0 and not (service_dir(ctx_home) / "ctx.sock").exists()
    assert "ignoring service.autostart" in untrusted.stderr
    assert ctx("trust", cwd=indexed).returncode == 0
    try:
        assert ctx("search", "invoice", cwd=indexed).returncode == 0
        assert "Service: up" in ctx("status", cwd=indexed).stdout
    finally:
        ctx("down", cwd=indexed)


def test_idle_project_is_evicted(indexed: Path, service: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_SERVICE_IDLE_EVICT_S", "0")  # forwarded: this project's [service] idle_evict_s
    assert ctx("search", "invoice", cwd=indexed).returncode == 0
    log = service_dir(service) / "service.log"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "evicted idle project" not in log.read_text():
        time.sleep(0.2)
    assert f"evicted idle project {indexed}" in log.read_text()
    assert ctx("search", "invoice", cwd=indexed).returncode == 0  # reopened on demand


def test_service_runs_the_schedules_and_stops_them_with_it(
        indexed: Path, ctx_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_SERVICE_SCHEDULES", "true")
    assert ctx("up", cwd=indexed).returncode == 0
    try:
        # Right after `ctx up` the service answers while its Prefect server still starts: the
        # command waits for it (it said "the ctx service is not running").
        first = ctx("schedule", "list", "--json", cwd=indexed)
        assert first.returncode == 0, first.stderr
        assert {"ingest_conversations", "sync_sources"} <= {row["name"] for row in json.loads(first.stdout)}
        # A project registers (watcher + its periodic index_code deployment) on its first run there.
        assert ctx("run", "index", cwd=indexed).returncode == 0
        # The orchestrator starts in the background: wait for it and for the project's deployment.
        deadline = time.monotonic() + 120
        listed: subprocess.CompletedProcess[str] | None = None
        names: set[str] = set()
        while time.monotonic() < deadline:
            listed = ctx("schedule", "list", "--json", cwd=indexed)
            if listed.returncode == 0:
                names = {row["name"] for row in json.loads(listed.stdout)}
                if any(name.startswith("index_code") for name in names):
                    break
            time.sleep(1.0)
        assert listed is not None and listed.returncode == 0, listed.stderr if listed else "no answer"
        assert {"ingest_conversations", "sync_sources"} <= names, names
        assert any(name.startswith("index_code") for name in names), names
        status = json.loads(ctx("status", "--json", cwd=indexed).stdout)
        assert status["service"]["schedules"], status["service"]
        pid = service_pid(ctx_home)
        children = [p.pid for p in psutil.Process(pid).children(recursive=True)]
    finally:
        assert ctx("down", cwd=indexed).returncode == 0
    time.sleep(0.5)
    alive = [c for c in children if psutil.pid_exists(c) and psutil.Process(c).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running after ctx down: {alive}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_services_prefect_server_ends_with_it(indexed: Path, ctx_home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The Prefect server runs in its own session, so a `kill -9` of the service does not reach it
    through the process group: the kernel's parent-death signal, armed from a thread that lives as
    long as the service, stops it. (Where that signal does not exist, the next `ctx up` or `ctx
    down` stops the server the service recorded: test_reap_stops_only_the_recorded_server.)"""
    monkeypatch.setenv("CTX_SERVICE_SCHEDULES", "true")
    record = service_dir(ctx_home) / "prefect-server.json"

    def server_started(other_than: int = 0) -> int:
        deadline, pid = time.monotonic() + 120, 0
        while time.monotonic() < deadline and pid in (0, other_than):
            with contextlib.suppress(OSError, ValueError):
                pid = int(json.loads(record.read_text())["pid"])
            time.sleep(0.5)
        assert pid not in (0, other_than), "the service recorded no Prefect server of its own"
        return pid

    assert ctx("up", cwd=indexed).returncode == 0
    try:
        first = server_started()
        os.kill(service_pid(ctx_home), signal.SIGKILL)
        assert gone_within(first, 30), "the killed service's Prefect server is still running"
        assert ctx("up", cwd=indexed).returncode == 0
        second = server_started(other_than=first)
    finally:
        assert ctx("down", cwd=indexed).returncode == 0
    assert gone_within(second, 20), "ctx down left the service's Prefect server running"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_temporary_prefect_server_of_a_service_without_schedules_ends_with_it(
        indexed: Path, service: Path, tmp_path: Path) -> None:
    """Without schedules the service's flow runs start Prefect's temporary server from a request
    thread; a `kill -9` of the service used to leave it running (~220 MB each time)."""
    assert ctx("run", "ingest", *_new_session(tmp_path, 0), cwd=indexed, timeout=300).returncode == 0  # a child's
    ingested = ctx("run", "ingest", *_new_session(tmp_path, 1), cwd=indexed, timeout=300)
    assert ingested.returncode == 0, ingested.stderr[-3000:]
    pid = service_pid(service)
    servers = [c.pid for c in psutil.Process(pid).children(recursive=True) if "uvicorn" in " ".join(c.cmdline())]
    assert servers, "no temporary Prefect server among the service's children"
    # The request thread that started it is gone; the server serves the next run.
    ingested = ctx("run", "ingest", *_new_session(tmp_path, 2), cwd=indexed, timeout=300)
    assert ingested.returncode == 0, ingested.stderr[-3000:]
    assert all(psutil.pid_exists(s) for s in servers)
    os.kill(pid, signal.SIGKILL)
    assert all(gone_within(s, 30) for s in servers), "the killed service's temporary Prefect server is still running"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_services_index_child_ends_with_it_and_the_client_runs_the_index_itself(
        indexed: Path, service: Path) -> None:
    """A forced re-index runs in the service's child; a `kill -9` of the service used to leave that
    child writing the lake until its run ended, while the client, its service gone, ran the same
    index itself beside it."""
    client, child = _forced_run_in_a_child(service, indexed)
    os.kill(service_pid(service), signal.SIGKILL)
    assert gone_within(child.pid, 5), "the killed service's index child is still running"
    _, err = client.communicate(timeout=300)
    assert client.returncode == 0, err[-3000:]
    assert "running here instead" in err
    assert json.loads(ctx("status", "--json", cwd=indexed).stdout)["chunks"] > 0


def test_reap_stops_only_the_recorded_server(tmp_path: Path) -> None:
    """What `ctx up` and `ctx down` do with a server a dead service recorded: stop it (its whole
    session), but not a process that only has its pid now (another command line)."""
    from ctxlake.serve.service.lifecycle import reap_prefect_server, record_prefect_server
    from ctxlake.serve.service.paths import ServicePaths

    paths = ServicePaths(tmp_path)
    paths.dir.mkdir()
    sleep = [sys.executable, "-c", "import sys, time; time.sleep(120)"]
    stranger = subprocess.Popen(sleep, start_new_session=True)
    server = subprocess.Popen([*sleep, "prefect", "server", "start"], start_new_session=True)
    try:
        record_prefect_server(paths, stranger.pid)
        assert reap_prefect_server(paths) is None
        assert stranger.poll() is None and not paths.prefect_server.exists()
        record_prefect_server(paths, server.pid)
        assert reap_prefect_server(paths) == server.pid
        assert server.wait(10) is not None
    finally:
        for proc in (stranger, server):
            proc.kill()
            proc.wait()


def test_the_clients_terminal_width_is_the_one_shutil_tells(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from ctxlake.serve.service.client import terminal_columns

    monkeypatch.setenv("COLUMNS", "132")
    assert terminal_columns() == 132
    for unset in ("0", "wide"):
        monkeypatch.setenv("COLUMNS", unset)
        assert terminal_columns() == shutil.get_terminal_size(fallback=(80, 24)).columns


@pytest.mark.parametrize("through", ["service", "in-process"])
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(indexed: Path, service: Path,
                                                                     through: str) -> None:
    if through == "in-process":
        assert ctx("down", cwd=indexed).returncode == 0
    # The reader closes its end before the command writes: the write gets EPIPE.
    reader_r, reader_w = os.pipe()
    os.close(reader_r)
    try:
        done = subprocess.run([CTX, "search", "invoice total", "--json"], cwd=indexed, stdout=reader_w,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(reader_w)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def _frame(sock_path: str, message: dict[str, Any]) -> dict[str, Any]:
    """One request on a connection of its own; the first frame after `accepted` and `working`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(sock_path)
        data = json.dumps(message).encode()
        sock.sendall(struct.pack(">I", len(data)) + data)
        while True:
            reply = protocol.recv(sock)
            if reply.get("op") not in ("accepted", "working"):
                return reply


def test_a_malformed_mcp_or_env_request_is_answered_and_leaves_the_services_environment(
        indexed: Path, ctx_home: Path) -> None:
    """An `mcp` request's fields were not checked: argv 5, env [1] or columns "x" closed the
    connection unanswered, and columns "x" (or an env value with a NUL byte, in any request) failed
    after the service had taken its own CTX_* variables out of os.environ and before it put them
    back: from then on its watcher indexed without them (here: without the fake embedder)."""
    assert ctx("up", "--watch", str(indexed), cwd=indexed).returncode == 0
    try:
        sock_path = str(service_dir(ctx_home) / "ctx.sock")
        cwd = str(indexed)
        for message in ({"op": "mcp", "argv": 5, "cwd": cwd}, {"op": "mcp", "argv": []},
                        {"op": "mcp", "argv": [], "cwd": cwd, "env": [1]},
                        {"op": "mcp", "argv": [], "cwd": cwd, "columns": "x"},
                        {"op": "mcp", "argv": [], "cwd": str(indexed / "missing")},
                        {"op": "cli", "argv": ["status"], "cwd": cwd, "env": {"CTX_EMBED_MODEL": "hash\x00"}},
                        {"op": "mcp", "argv": [], "cwd": cwd, "env": {"CTX_HOME=": "x"}}):
            reply = _frame(sock_path, {**message, "v": 1})
            assert reply["op"] == "error" and reply["code"] == 2, (message, reply)
        (indexed / "src" / "billing" / "refund.py").write_text("def issue_refund_voucher(order):\n    return order\n")
        deadline, found = time.monotonic() + 60, False
        while time.monotonic() < deadline and not found:
            out = ctx("search", "issue_refund_voucher", "--mode", "keyword", "--json", cwd=indexed)
            found = any(h["path"] == "src/billing/refund.py" for h in json.loads(out.stdout)["hits"])
            time.sleep(0.2)
        assert found, "the edit never became searchable: " + (service_dir(ctx_home) / "service.log").read_text()[-2000:]
    finally:
        ctx("down", cwd=indexed)

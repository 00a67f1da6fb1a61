"""The service's Prefect side with a real `prefect server start` in a tmp home (one server per module)."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from memlogs import claude, write_jsonl

from ctxlake.schemas.config import load_settings
from ctxlake.schemas.trust import trust
from ctxlake.serve.service.orchestrator import SERVER_NICE, Orchestrator, healthy
from ctxlake.serve.service.schedules import drop_missed_runs, pause_schedule, set_schedule

CONFIG = """
[embed]
provider = "fake"
model = "hash"

[memory]
tools = ["claude"]
roots = {{ claude = "{logs}" }}

[schedule]
ingest_every_s = 3600
index_every_s = 3600
logs_debounce_s = 1.0
max_failures = 2
"""


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def schedule(orch: Orchestrator, name: str) -> dict[str, Any]:
    return next(s for s in orch.schedules() if s["name"] == name)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Orchestrator, Path]]:
    base = tmp_path_factory.mktemp("orch")
    project, logs, home = base / "proj", base / "logs" / "projects", base / "home"
    (project / ".ctx").mkdir(parents=True)
    logs.mkdir(parents=True)
    (project / ".ctx" / "config.toml").write_text(CONFIG.format(logs=logs), encoding="utf-8")
    trust(project / ".ctx" / "config.toml", home)  # memory.roots is honoured only from a trusted file
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "CTX_HOME")}
    os.environ.pop("PREFECT_API_URL", None)
    os.environ["CTX_HOME"] = str(home)  # the flow-run processes inherit it
    # Written while no service ran: the start-up ingest picks it up.
    write_jsonl(logs / "-srv-u-proj" / "sess-before.jsonl",
                [claude("user", "b0", 0, "written while down", session="sess-before")])
    orch = Orchestrator(home, load_settings(project))
    orch.start()
    try:
        yield orch, logs
    finally:
        orch.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def ctx_home() -> None:
    """The module's service owns CTX_HOME (overrides the per-test home of conftest)."""


def test_server_starts_and_serves_default_deployments(service: tuple[Orchestrator, Path]) -> None:
    orch, _ = service
    assert orch.api_url and healthy(orch.api_url)
    assert os.environ["PREFECT_API_URL"] == orch.api_url
    print(f"prefect server start: {orch.server_start_s:.1f} s")
    # The server and whatever it started yield the CPU to the service's queries.
    server = psutil.Process(orch._server.pid)
    assert {p.nice() for p in [server, *server.children(recursive=True)]} == {min(19, os.nice(0) + SERVER_NICE)}
    names = {s["name"]: s for s in orch.schedules()}
    assert names["ingest_conversations"]["kind"] == "interval"
    assert names["ingest_conversations"]["spec"] == "3600s"
    assert names["sync_sources"] == names["sync_sources"] | {"kind": "cron", "spec": "0 3 * * *", "paused": False}
    wait_for(lambda: schedule(orch, "sync_sources")["next_run"], 30, "the scheduler to plan the next sync run")


def _cross_site(url: str, method: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """What a page on another site makes a browser send (no body, a simple request, or a preflight)."""
    req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method,
                                 headers={"Origin": "http://attacker.example", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, {k.lower(): v for k, v in res.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}


async def _deployment_id(api_url: str, name: str) -> Any:
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api_url) as client:
        return next(d.id for d in await client.read_deployments() if d.name == name)


def test_a_page_on_another_site_cannot_drive_the_prefect_api(service: tuple[Orchestrator, Path]) -> None:
    """The server allowed every origin (CORS "*"), took state changes without a CSRF token and
    checked no Host: any web page could find its port and pause the service's deployments, or read
    and start their runs; one whose DNS name is rebound to 127.0.0.1 could even read the token."""
    orch, _ = service
    assert orch.api_url
    status, headers = _cross_site(f"{orch.api_url}/deployments/filter", "OPTIONS",
                                  {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in headers, (status, headers)
    deployment = asyncio.run(_deployment_id(orch.api_url, "sync_sources"))
    status, _ = _cross_site(f"{orch.api_url}/deployments/{deployment}/pause_deployment", "POST",
                            {"Content-Type": "text/plain"})
    assert status == 403
    assert schedule(orch, "sync_sources")["paused"] is False
    assert healthy(orch.api_url)  # what the service itself asks still answers
    # A page whose DNS name was rebound to 127.0.0.1 is same-origin with the server: its Host is refused.
    port = orch.api_url.split(":")[2].split("/")[0]
    status, _ = _cross_site(f"{orch.api_url}/csrf-token?client=page", "GET",
                            {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"})
    assert status == 421
    assert _cross_site(f"{orch.api_url}/health", "GET",
                       {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"})[0] == 200
    # A browser opens a websocket to any origin without asking CORS: a page's Origin is refused.
    assert asyncio.run(_websocket(f"ws://127.0.0.1:{port}/api/events/out", "http://attacker.example")) == 403
    assert asyncio.run(_websocket(f"ws://127.0.0.1:{port}/api/events/out", f"http://127.0.0.1:{port}")) == "open"


async def _websocket(url: str, origin: str) -> int | str:
    import websockets

    try:
        async with websockets.connect(url, additional_headers={"Origin": origin}, open_timeout=30):
            return "open"
    except websockets.exceptions.InvalidStatus as exc:
        return int(exc.response.status_code)


def test_start_ingests_once_what_was_written_while_down(service: tuple[Orchestrator, Path]) -> None:
    orch, _ = service
    try:
        wait_for(lambda: orch.ingest_triggers >= 1, 120, "the start-up ingest trigger")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; failed attempts: {orch.trigger_errors}") from None
    row = wait_for(lambda: (r := schedule(orch, "ingest_conversations"))["last_run"] and r, 180, "the ingest run")
    assert row["last_run"]["state"] == "COMPLETED", row["last_run"]
    assert orch.ingest_triggers == 1
    from ctxlake.serve.api.memory_lake import MemoryLake
    from ctxlake.serve.api.memory_sessions import list_sessions

    sessions = list_sessions(MemoryLake(orch.settings), all_projects=True)
    assert any(s.session_ref.startswith("claude:sess-before") for s in sessions), [s.session_ref for s in sessions]


def test_interval_fires_then_pause_and_set(service: tuple[Orchestrator, Path], tmp_path: Path) -> None:
    from schedule_flows import quick

    orch, _ = service
    marker = tmp_path / "marker.txt"
    orch.add_deployment(quick.to_deployment("quick", interval=timedelta(seconds=3),
                                            parameters={"marker": str(marker)}))
    done = wait_for(lambda: (schedule(orch, "quick")["last_run"] or {}).get("state") == "COMPLETED", 120,
                    "a completed run of the 3 s schedule")
    assert done and marker.read_text().startswith("ran")

    pause_schedule(orch.api_url or "", "quick", paused=True)
    assert schedule(orch, "quick")["paused"] and schedule(orch, "quick")["next_run"] is None
    # Runs already under way may still finish (each takes seconds, more on a loaded machine):
    # wait until the marker has stopped growing for 8 s, then no new run may come.
    count, still_since = len(marker.read_text().splitlines()), time.monotonic()
    deadline = still_since + 90
    while time.monotonic() - still_since < 8 and time.monotonic() < deadline:
        time.sleep(1)
        now = len(marker.read_text().splitlines())
        if now != count:
            count, still_since = now, time.monotonic()
    time.sleep(10)
    assert len(marker.read_text().splitlines()) == count, "a paused schedule still ran"

    set_schedule(orch.api_url or "", "quick", cron="0 4 * * *")
    pause_schedule(orch.api_url or "", "quick", paused=False)
    row = schedule(orch, "quick")
    assert (row["kind"], row["spec"], row["paused"]) == ("cron", "0 4 * * *", False)


def test_failing_deployment_is_recorded_and_paused(service: tuple[Orchestrator, Path]) -> None:
    from schedule_flows import always_fails

    orch, _ = service
    orch.add_deployment(always_fails.to_deployment("fails", interval=timedelta(seconds=2)))
    row = wait_for(lambda: (r := schedule(orch, "fails"))["paused"] and r, 180, "the failing schedule to be paused")
    assert row["last_run"]["state"] == "FAILED"
    assert "deliberate failure" in (row["last_run"]["error"] or "")
    assert healthy(orch.api_url or "")  # the service survived


def test_log_events_make_one_debounced_ingest_run(service: tuple[Orchestrator, Path]) -> None:
    orch, logs = service
    wait_for(lambda: orch.ingest_triggers >= 1, 120, "the start-up ingest trigger")  # not counted below
    before = orch.ingest_triggers
    session = logs / "-srv-u-proj" / "sess-a.jsonl"
    session.parent.mkdir(parents=True, exist_ok=True)
    for i in range(4):  # a burst of appends, as an agent writes
        write_jsonl(session, [claude("user", f"u{i}", i, f"message {i}")], mode="a")
        time.sleep(0.2)
    # Generous: under a loaded CI machine the server can take long to accept the run request.
    try:
        wait_for(lambda: orch.ingest_triggers > before, 120, "the debounced ingest trigger")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; failed attempts: {orch.trigger_errors}") from None
    time.sleep(3)
    assert orch.ingest_triggers == before + 1
    row = wait_for(lambda: (r := schedule(orch, "ingest_conversations"))["last_run"] and r, 180, "the ingest run")
    assert row["last_run"]["state"] == "COMPLETED", row["last_run"]


def test_runs_missed_while_down_are_dropped_and_planned_ones_kept(service: tuple[Orchestrator, Path]) -> None:
    """A service down for hours comes back to late runs of every deployment: start() drops them
    (drop_missed_runs) instead of running them all at once. A deployment no runner serves keeps
    its runs where the test put them."""
    import asyncio

    from prefect.client.orchestration import PrefectClient
    from prefect.states import Scheduled

    orch, _ = service
    url = orch.api_url or ""
    now = datetime.now(UTC)

    async def plan() -> tuple[Any, Any]:
        async with PrefectClient(url) as client:
            flow_id = await client.create_flow_from_name("test-missed")
            dep_id = await client.create_deployment(flow_id=flow_id, name="nobody-serves-it")
            late = await client.create_flow_run_from_deployment(dep_id, state=Scheduled(scheduled_time=now - timedelta(hours=3)))
            later = await client.create_flow_run_from_deployment(dep_id, state=Scheduled(scheduled_time=now + timedelta(hours=3)))
            return late.id, later.id

    async def still_there(run_id: Any) -> bool:
        from prefect.exceptions import ObjectNotFound

        async with PrefectClient(url) as client:
            try:
                await client.read_flow_run(run_id)
            except ObjectNotFound:
                return False
            return True

    late, later = asyncio.run(plan())
    assert drop_missed_runs(url, now) >= 1
    assert not asyncio.run(still_there(late))
    assert asyncio.run(still_there(later))
    assert drop_missed_runs(url, now) == 0  # nothing left to drop


def test_stop_leaves_no_child_process(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / ".ctx").mkdir(parents=True)
    (project / ".ctx" / "config.toml").write_text('[memory]\ntools = ["claude"]\nroots = { claude = "%s" }\n'
                                                  % (tmp_path / "none"), encoding="utf-8")
    saved = os.environ.pop("PREFECT_API_URL", None)
    # Children from before (a test session's own Prefect server) are not the orchestrator's to stop.
    servers_before = [p for p in psutil.Process().children(recursive=True) if _is_server(p)]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    orch = Orchestrator(tmp_path / "home", load_settings(project))
    orch.start()
    url = orch.api_url
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert children, "the server should be a child process"
    orch.stop()
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert url and not healthy(url)
    # Other processes may end on their own meanwhile; a Prefect server started before must not.
    assert all(p.is_running() for p in servers_before), "stop() ended a server it did not start"
    if saved:
        os.environ["PREFECT_API_URL"] = saved


def _is_server(process: psutil.Process) -> bool:
    try:
        return any("uvicorn" in part for part in process.cmdline())
    except psutil.Error:
        return False


def _health_answerer() -> Any:
    """An HTTP server on a free port of 127.0.0.1 that answers 200 to everything, as another
    process's Prefect server would."""
    import http.server
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    return other


def test_a_port_taken_before_the_server_binds_it_is_not_mistaken_for_ours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process may take the free port between its choice and the server's bind; its
    server then answered the health check, ours exited, and the service used the other's."""
    import ctxlake.serve.service.orchestrator as orchestrator

    other = _health_answerer()
    taken = other.server_address[1]
    ports, real_free_port = iter([taken]), orchestrator.free_port
    monkeypatch.setattr(orchestrator, "free_port", lambda: next(ports, None) or real_free_port())
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    project = tmp_path / "proj"
    project.mkdir()
    orch = Orchestrator(tmp_path / "home", load_settings(project))
    try:
        orch._start_server()
        assert orch._server is not None and orch.api_url
        assert f":{taken}/" not in orch.api_url
        assert orchestrator.listens(orch._server.pid, int(orch.api_url.rsplit(":", 1)[1].split("/")[0])) is True
        other.shutdown()
        assert healthy(orch.api_url)
    finally:
        other.shutdown()
        other.server_close()
        orch._kill_server()

"""The temporary Prefect server a plain `ctx run` starts (no service, no PREFECT_API_URL) is guarded
like the service's own: a web page cannot drive it, while Prefect's clients still work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ctxlake.serve.service.prefect_guard import (
    PREFECT_FACTORY,
    TEMPORARY_FACTORY,
    guard_temporary_command,
)

PROBE = textwrap.dedent('''
    import asyncio, json, urllib.error, urllib.request
    import prefect.server.api.server as prefect_server
    from prefect import flow
    from ctxlake.serve.cli.base import start_prefect_shielded

    start_prefect_shielded()
    server = prefect_server.SubprocessASGIServer()
    api, port = server.api_url, server.port

    @flow
    def answer():
        return 42

    def ask(path, method="GET", headers=None):
        req = urllib.request.Request(api + path, data=b"{}" if method == "POST" else None, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                return [res.status, {k.lower(): v for k, v in res.headers.items()}]
        except urllib.error.HTTPError as exc:
            return [exc.code, {k.lower(): v for k, v in exc.headers.items()}]

    async def websocket(origin):
        import websockets
        try:
            async with websockets.connect(f"ws://127.0.0.1:{port}/api/events/out",
                                          additional_headers={"Origin": origin}, open_timeout=30):
                return "open"
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code

    page = "http://attacker.example"
    result = {
        "answer": answer(),  # flow and task runs: Prefect's clients send the CSRF token themselves
        "preflight": ask("/flow_runs/filter", "OPTIONS",
                         {"Origin": page, "Access-Control-Request-Method": "POST",
                          "Access-Control-Request-Headers": "content-type"}),
        "cross_site_post": ask("/flow_runs/filter", "POST", {"Origin": page, "Content-Type": "text/plain"}),
        "post_without_token": ask("/flow_runs/filter", "POST", {"Content-Type": "application/json"}),
        "rebound_host": ask("/csrf-token?client=page", "GET",
                            {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}),
        "own_origin": ask("/health", "GET", {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}),
        "cross_site_websocket": asyncio.run(websocket(page)),
    }
    print("RESULT " + json.dumps(result))
''')


def test_a_web_page_cannot_drive_the_temporary_prefect_server(tmp_path: Path) -> None:
    """Prefect started it with CORS "*", no CSRF token and no Host check: while `ctx run index
    --watch` ran, any page the user opened could find its port (8000-8999) and list, cancel or
    create flow runs, or send events over its websocket."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["answer"] == 42
    status, headers = result["preflight"]
    assert "access-control-allow-origin" not in headers, (status, headers)
    assert result["cross_site_post"][0] == 403
    assert result["post_without_token"][0] == 403  # CSRF on, Origin or not
    assert result["rebound_host"][0] == 421
    assert result["own_origin"][0] == 200
    assert result["cross_site_websocket"] == 403


def test_only_prefects_server_command_is_rewritten() -> None:
    command = [sys.executable, "-m", "uvicorn", "--factory", PREFECT_FACTORY, "--host", "127.0.0.1",
               "--port", "8123", "--lifespan", "on"]
    args, env = guard_temporary_command(command, {"PATH": "/bin"})
    assert args[args.index("--factory") + 1] == TEMPORARY_FACTORY
    assert env is not None and env["PATH"] == "/bin"
    assert env["CTX_PREFECT_GUARD_PORT"] == "8123"
    assert env["PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED"] == "true"
    assert env["PREFECT_SERVER_CORS_ALLOWED_ORIGINS"] == "http://127.0.0.1:8123"
    other = ["git", "status"]
    assert guard_temporary_command(other, None) == (other, None)


@pytest.mark.parametrize("port", ["", "80; rm", None])
def test_the_guarded_app_needs_its_port(port: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxlake.serve.service.prefect_guard import GUARD_PORT_ENV, temporary_app

    if port is None:
        monkeypatch.delenv(GUARD_PORT_ENV, raising=False)
    else:
        monkeypatch.setenv(GUARD_PORT_ENV, port)
    with pytest.raises(SystemExit, match=GUARD_PORT_ENV):
        temporary_app()

"""Prefect's API servers behind a guard: the resident service's `prefect server start`, and the
temporary server Prefect starts for a plain `ctx run` (no service, no PREFECT_API_URL).

As Prefect ships it, its server allows every origin (CORS "*"), takes state changes without a CSRF
token and checks no Host header. Any web page the user has open could find its port (the temporary
one picks from 8000-8999) and drive the API: cancel or pause the runs, start the service's
deployments with parameters of its choosing, or send events over its websocket. A page whose DNS
name is rebound to 127.0.0.1 is same-origin with the server and could even read a CSRF token.

So both servers run with:
- CSRF protection on (Prefect's clients fetch and send the token themselves);
- CORS allowed for the server's own origin only (its UI);
- a `HostGuard` in front of the app: another Host header is refused (421), and a request or
  websocket that a page of another origin sent is refused (403), websockets included (a browser
  opens those cross-origin without asking CORS).
"""

from __future__ import annotations

import os
import sys
from typing import Any

GUARD_PORT_ENV = "CTX_PREFECT_GUARD_PORT"
PREFECT_FACTORY = "prefect.server.api.server:create_app"
TEMPORARY_FACTORY = "ctxlake.serve.service.prefect_guard:temporary_app"
PREFECT_SERVER_MAIN = ("import sys; from ctxlake.serve.service.prefect_guard import run_prefect_server; "
                       "run_prefect_server(sys.argv[1:])")


def guard_settings(port: int | str) -> dict[str, str]:
    """Prefect's own settings for a server on 127.0.0.1:`port`: CSRF tokens required, CORS for its origin."""
    return {
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
        "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": f"http://127.0.0.1:{port}",
    }


def _own_hosts(port: int | str) -> set[str]:
    return {f"127.0.0.1:{port}", f"localhost:{port}"}


class HostGuard:
    """Refuses an HTTP request or websocket whose Host is not one of `hosts` (421; a websocket is
    closed), or that carries an Origin other than those hosts' (403): what a browser sends for a
    page of another site. Prefect's own clients send no Origin; its UI sends its own."""

    def __init__(self, app: Any, hosts: set[str]) -> None:
        self.app = app
        self.hosts = {h.lower() for h in hosts}
        self.origins = {f"http://{h}" for h in self.hosts}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            origin = headers.get(b"origin")
            if headers.get(b"host", "").lower() not in self.hosts:
                await self._refuse(scope, send, 421,
                                   b"Misdirected request: this server answers only to 127.0.0.1 and localhost.")
                return
            if origin is not None and origin.lower() not in self.origins:
                await self._refuse(scope, send, 403, b"Forbidden: a request from another site's page.")
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: Any, send: Any, status: int, body: bytes) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def run_prefect_server(argv: list[str]) -> None:
    """`prefect server start ARGV` (in the server's own process) with its app behind a HostGuard for
    127.0.0.1 and localhost on its --port. The caller sets guard_settings(port) in its environment."""
    import runpy

    import prefect.server.api.server as prefect_app

    port = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"), None)
    if port is None:
        raise SystemExit("run_prefect_server: --port is required (the Host check needs it)")
    build = prefect_app.create_app

    def guarded(*args: Any, **kwargs: Any) -> Any:
        return HostGuard(build(*args, **kwargs), _own_hosts(port))

    # `prefect server start` imports create_app from that module when it runs: it gets this one.
    setattr(prefect_app, "create_app", guarded)  # noqa: B010 - a module attribute replaced on purpose
    sys.argv = ["prefect", *argv]
    runpy.run_module("prefect", run_name="__main__", alter_sys=True)


def temporary_app() -> Any:
    """uvicorn's app factory for Prefect's temporary server: Prefect's app behind a HostGuard for
    the port in CTX_PREFECT_GUARD_PORT (set by guard_temporary_command)."""
    from prefect.server.api.server import create_app

    port = os.environ.get(GUARD_PORT_ENV, "")
    if not port.isdigit():
        raise SystemExit(f"temporary_app: {GUARD_PORT_ENV} must name the server's port")
    return HostGuard(create_app(), _own_hosts(port))


def guard_temporary_command(args: list[str], env: dict[str, str] | None) -> tuple[list[str], dict[str, str] | None]:
    """Prefect's command for its temporary server (`python -m uvicorn --factory
    prefect.server.api.server:create_app --port N ...`) and environment, made the guarded server's.
    Any other command is returned as it is."""
    if PREFECT_FACTORY not in args or "--port" not in args[:-1]:
        return args, env
    port = args[args.index("--port") + 1]
    guarded = [TEMPORARY_FACTORY if a == PREFECT_FACTORY else a for a in args]
    return guarded, {**(os.environ if env is None else env), **guard_settings(port), GUARD_PORT_ENV: port}

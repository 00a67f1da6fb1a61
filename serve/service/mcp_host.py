"""The service's side of `ctx serve`: one MCP session per proxy connection, over the socket.

Sessions of one project share the warm Lake and model through the engine cache.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ctxlake.serve.service import protocol

if TYPE_CHECKING:
    from contextlib import AbstractContextManager


class Service(Protocol):
    """What a hosted session needs of the daemon (daemon.Service; naming it would be a cycle)."""

    def request_env(self, message: dict[str, Any]) -> AbstractContextManager[None]: ...


def _parse(argv: list[str]) -> argparse.Namespace | None:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--root", type=Path)
    parser.add_argument("--allow-index", action="store_true")
    parser.add_argument("--allow-agents", action="store_true")
    parser.add_argument("--allow-writes", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    try:
        args, rest = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit):
        return None
    return None if rest else args  # anything else: let the in-process command handle (or reject) it


def serve_connection(service: Service, conn: socket.socket, message: dict[str, Any]) -> None:
    cwd = str(message.get("cwd", ""))
    if not os.path.isdir(cwd):  # as a `cli` request says it, rather than a connection closed by chdir's error
        protocol.send(conn, {"op": "error", "message": f"working folder does not exist: {cwd}", "code": 2})
        return
    args = _parse([str(a) for a in message.get("argv", [])])
    if args is None:
        protocol.send(conn, {"op": "local"})
        return
    from ctxlake.errors import CtxError
    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.cli.mcp import serve_root
    from ctxlake.serve.mcp.base import ServeOptions
    from ctxlake.serve.mcp.server import build_server
    from ctxlake.serve.service.protocol import Busy

    try:
        with service.request_env(message):
            project = serve_root(args.root)
            settings = load_settings(project)
    except CtxError as exc:
        protocol.send(conn, {"op": "error", "message": exc.message, "code": exc.exit_code})
        return
    except Busy:
        protocol.send(conn, {"op": "local"})  # the proxy starts an in-process server instead
        return
    notice = None
    if not (settings.lake_dir / "state.json").is_file():
        notice = (f"ctx serve: {project} is not indexed yet; tools will say so until "
                  "`ctx run index` has run there (docs tools work meanwhile).")
    options = ServeOptions(allow_index=args.allow_index, allow_agents=args.allow_agents,
                           allow_writes=args.allow_writes, log_level="DEBUG" if args.verbose else "WARNING")
    server = build_server(settings, options)
    protocol.send(conn, {"op": "mcp-ready", "notice": notice})
    import anyio
    from mcp.server.stdio import stdio_server

    reader = io.TextIOWrapper(conn.makefile("rb"), encoding="utf-8", errors="replace")
    writer = io.TextIOWrapper(conn.makefile("wb"), encoding="utf-8", write_through=True)

    async def session() -> None:
        async with stdio_server(anyio.wrap_file(reader), anyio.wrap_file(writer)) as (read_stream, write_stream):
            low = server._lowlevel_server
            await low.run(read_stream, write_stream, low.create_initialization_options())

    try:
        anyio.run(session)
    finally:
        reader.close()
        writer.close()

"""`ctx serve` as a thin proxy: stdin/stdout bytes <-> the service's MCP session for this project.

Standard library only, so ten agent sessions cost ten small processes and one warm engine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

from ctxlake.serve.service import protocol
from ctxlake.serve.service.paths import service_paths
from ctxlake.serve.service.protocol import forwarded_env


def _pump_stdin(sock: socket.socket) -> None:
    try:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)  # the client closed stdin: end the session cleanly


HANDSHAKE_TIMEOUT_S = 30.0


def proxy_or_none(argv: list[str]) -> int | None:
    """Run `ctx serve` through the service; None when it must run in-process (service down, --http)."""
    if "--http" in argv or "--help" in argv:
        return None
    try:
        sock = protocol.connect(str(service_paths().socket), timeout=2.0)
    except OSError:
        return None
    # Connected: the service is up. Opening the project there can take seconds on a busy machine;
    # falling back to a whole in-process engine (~300 MB) for that would be the worse answer.
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        protocol.send(sock, {"op": "mcp", "v": protocol.PROTOCOL_VERSION, "argv": argv[1:],
                             "cwd": os.getcwd(), "env": forwarded_env()})
        reply = protocol.recv(sock)
    except (OSError, protocol.ProtocolError):
        sock.close()
        return None
    if reply.get("op") == "local":
        sock.close()
        return None
    if reply.get("op") == "error":
        sock.close()
        print(f"ctx: error: {reply.get('message')}", file=sys.stderr)
        return int(reply.get("code", 1))
    if reply.get("notice"):
        print(str(reply["notice"]), file=sys.stderr)
    sock.settimeout(None)
    threading.Thread(target=_pump_stdin, args=(sock,), daemon=True).start()
    try:
        with sock:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                os.write(1, data)
    except OSError as exc:
        print(f"ctx serve: the service connection ended ({exc.__class__.__name__}); restart the MCP client "
              "to reconnect", file=sys.stderr)
        return 1
    return 0

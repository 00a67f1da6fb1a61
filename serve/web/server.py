"""Run the web UI: in a thread of the service (`ctx up`), or standalone in the foreground (`ctx ui`
when the service cannot run). Always on 127.0.0.1."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxlake.serve.web.app import create_app
from ctxlake.serve.web.base import Schedules, UiContext

HOST = "127.0.0.1"  # never another interface: the UI reads private code and conversations
START_TIMEOUT_S = 20.0
# uvicorn (h11) buffers at most this much of a request line and headers still arriving; past it, it answers 400
# and closes with the rest unread, which the client sees as a connection reset. h11's 16 KiB default did that to
# a 200 KB search URL: at 1 MiB such a request reaches the guard, whose 414 or 431 says what is too long.
MAX_HEAD_BYTES = 1 << 20


def bind_socket(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1: the preferred port, else any free one."""
    for candidate in ([port, 0] if port else [0]):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, candidate))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE and candidate:
                continue
            raise
        sock.listen(128)
        sock.set_inheritable(True)
        return sock
    raise OSError(errno.EADDRINUSE, "no free port")


class UiServer:
    """uvicorn over an already bound socket, so the port is known before the first request."""

    def __init__(self, ctx: UiContext, port: int = 0) -> None:
        import uvicorn

        self.sock = bind_socket(port)
        self.port: int = self.sock.getsockname()[1]
        self.ctx = ctx
        app = create_app(ctx, lambda: self.port)
        # h11 even where httptools is installed ("auto" would pick it): the head limit above is h11's.
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", http="h11",
                                timeout_graceful_shutdown=2, h11_max_incomplete_event_size=MAX_HEAD_BYTES)
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def serve(self) -> None:
        """Serve in this thread until stopped (the foreground mode)."""
        self.server.run(sockets=[self.sock])

    def start(self) -> str:
        """Serve in a daemon thread; returns the URL once it accepts requests."""
        self.thread = threading.Thread(target=self.serve, name="ctx-ui", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started and time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise RuntimeError("the web UI stopped at start")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.sock.close()


def service_ui(projects: Callable[[], list[str]], orchestrator: Callable[[], Any], port: int) -> UiServer:
    """The UI as the service hosts it: the service's registered projects and its orchestrator."""
    server = UiServer(UiContext(projects=projects, schedules=Schedules(orchestrator), mode="service"), port)
    server.start()
    return server


def standalone(root: Path, port: int) -> UiServer:
    """The UI without the service: this project only, no schedules."""
    return UiServer(UiContext(projects=lambda: [str(root)], mode="standalone"), port)

"""A real HTTP server on 127.0.0.1 serving a small docs site (llms.txt, markdown, HTML, ETag/304, 404) for web source tests."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Page:
    body: str
    content_type: str = "text/markdown; charset=utf-8"
    status: int = 200
    etag: bool = True  # answer If-None-Match with 304 when it matches
    last_modified: str | None = None  # sent, and If-Modified-Since equal to it gets a 304


@dataclass
class DocSite:
    """Routes by path; every request is logged as (method, path, status) for assertions."""

    pages: dict[str, Page] = field(default_factory=dict)
    log: list[tuple[str, str, int]] = field(default_factory=list)
    base: str = ""
    delay_s: float = 0.0  # per request, to observe concurrency
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return self.base + path

    def requests(self, path: str) -> list[int]:
        return [status for _, p, status in self.log if p == path]


def _handler(site: DocSite) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            # Counted in flight while it waits, not while the answer goes out: a client that has
            # read the answer may send its next request before this thread would have counted down.
            with site.lock:
                site.in_flight += 1
                site.max_in_flight = max(site.max_in_flight, site.in_flight)
            try:
                time.sleep(site.delay_s)
            finally:
                with site.lock:
                    site.in_flight -= 1
            self._get()

        def _get(self) -> None:
            page = site.pages.get(self.path)
            if page is None:
                self._send(404, b"<html><body><h1>Not Found</h1></body></html>", "text/html")
                return
            data = page.body.encode("utf-8")
            tag = '"' + hashlib.sha1(data).hexdigest()[:16] + '"'
            if page.etag and page.status == 200 and self.headers.get("If-None-Match") == tag:
                self._send(304, b"", None, {"ETag": tag})
                return
            modified = page.last_modified
            if modified and page.status == 200 and self.headers.get("If-Modified-Since") == modified:
                self._send(304, b"", None, {"Last-Modified": modified})
                return
            extra = {"ETag": tag} if page.etag else {}
            if modified:
                extra["Last-Modified"] = modified
            self._send(page.status, data, page.content_type, extra)

        def _send(self, status: int, data: bytes, ctype: str | None, extra: dict[str, str] | None = None) -> None:
            site.log.append(("GET", self.path, status))
            self.send_response(status)
            if ctype:
                self.send_header("Content-Type", ctype)
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep test output clean

    return Handler


@contextmanager
def serve(site: DocSite) -> Iterator[DocSite]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site))
    site.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()

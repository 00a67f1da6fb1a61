"""The UI's size limits on its real uvicorn server: a very long URL gets 414 and very long headers 431, where
h11's 16 KiB buffer had the connection reset; a chunked body (no Content-Length) over 1 MiB gets 413 as a
declared one does. The guard answers these before any page: a bare project is enough."""

from __future__ import annotations

import http.client
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from uisite import read_answer

from ctxlake.serve.web.app import MAX_BODY_BYTES
from ctxlake.serve.web.base import UiContext
from ctxlake.serve.web.security import MAX_HEADER_BYTES, MAX_URL_BYTES, SESSION_COOKIE
from ctxlake.serve.web.server import UiServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[UiServer]:
    repo = tmp_path / "proj"
    (repo / ".ctx").mkdir(parents=True)
    ui = UiServer(UiContext(projects=lambda: [str(repo)], env={"HOME": str(tmp_path / "home")}, mode="standalone"))
    ui.start()
    try:
        yield ui
    finally:
        ui.stop()


def get(conn: http.client.HTTPConnection, target: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn.request("GET", target, headers=headers or {})
    res = conn.getresponse()
    return res.status, res.read().decode()


def test_a_200_kb_query_string_is_a_414_that_says_so_not_a_connection_reset(server: UiServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    status, text = get(conn, "/api/search?q=" + "a" * 200_000)
    assert status == 414, text[:200]
    assert text == "URI too long: this server takes a path and query string of up to 65,536 bytes."
    # An answer like any other: the same connection goes on serving.
    assert get(conn, "/healthz")[0] == 200
    at_limit = "/healthz?q=" + "a" * (MAX_URL_BYTES - len("/healthz?q="))
    assert get(conn, at_limit)[0] == 200
    assert get(conn, at_limit + "a")[0] == 414
    status, text = get(conn, "/healthz", {"X-Padding": "b" * (MAX_HEADER_BYTES + 1)})
    assert status == 431 and text.startswith("Request header fields too large"), text
    assert get(conn, "/healthz")[0] == 200
    conn.close()


def chunked_post(server: UiServer, body: bytes, wait_s: float = 10.0) -> tuple[int, str]:
    """POST `body` in 64 KiB chunks with no Content-Length, over a plain socket; the last (empty) chunk goes only
    if no answer came first: a server that stops at its cap answers having read every byte sent (had it closed
    with some unread, the connection would be reset and the answer lost); one that reads on waits for the end."""
    session = "s" * 43
    token = server.server.config.app.token_for(session)
    head = (f"POST /api/knowledge HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nCookie: {SESSION_COOKIE}={session}\r\n"
            f"X-CSRF-Token: {token}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head)
        for start in range(0, len(body), 64 << 10):
            piece = body[start:start + (64 << 10)]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        if not select.select([sock], [], [], wait_s)[0]:
            sock.sendall(b"0\r\n\r\n")
        return read_answer(sock)


def test_a_chunked_body_over_1_mib_is_a_413_before_the_rest_is_read(server: UiServer) -> None:
    status, text = chunked_post(server, b"a" * (MAX_BODY_BYTES + 1))
    assert status == 413 and '"the request body is over 1,048,576 bytes"' in text, text
    # Under the cap a chunked body is read to its end and parsed (this one is no JSON object).
    status, text = chunked_post(server, b"[" + b"1," * 100_000 + b"1]", wait_s=0.2)
    assert status == 400 and '"the request body must be a JSON object"' in text, text

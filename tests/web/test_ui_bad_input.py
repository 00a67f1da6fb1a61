"""Hostile input to the served UI over plain HTTP (the session fixture site: indexed, one session
ingested): each is a 4xx naming what was wrong, never a 500."""

from __future__ import annotations

import json
import os
import select
import socket
import urllib.parse

import anyio
import pytest
from mcp import Client
from test_security import call, session
from uisite import Site, read_answer

from ctxlake.schemas.config import load_settings
from ctxlake.serve.mcp.server import build_server


@pytest.mark.parametrize("after", ["9999999999d", "999999999d", "0001-01-01T00:00+05:00", "700000d"])
def test_a_time_window_at_or_past_the_edge_of_the_calendar_is_a_400(site: Site, after: str) -> None:
    """`now - 9999999999 days` raised OverflowError: a 500 with its repr (and an opaque MCP tool error)."""
    query = urllib.parse.urlencode({"q": "refund", "kind": "conversations", "after": after})
    status, _, text = call(site.url + "api/search?" + query)
    if after == "700000d":  # year 110: a date all the same (it was written '110-05-18', which Lance refused: a 503)
        assert status == 200, text
        assert json.loads(text)["context"]["hits"]
        return
    assert status == 400, text
    assert json.loads(text)["error"] == f"after: {after!r} is outside the dates a record can have"
    status, _, page = call(site.url + "sessions?" + urllib.parse.urlencode({"after": after}))
    assert status == 400 and "outside the dates a record can have" in page


def test_the_mcp_memory_tools_say_the_same_of_such_a_window(site: Site) -> None:
    server = build_server(load_settings(site.repo, env={**os.environ, **site.env}))

    async def main() -> None:
        async with Client(server) as client:
            result = await client.call_tool("search_context", {"query": "refund", "time_range": {"after": "9999999999d"}})
            text = result.content[0].text
            assert result.is_error and "time_range.after: '9999999999d' is outside the dates a record can have" in text, text
            result = await client.call_tool("search_context", {"query": "refund", "time_range": {"after": "700000d"}})
            assert not result.is_error and result.structured_content["hits"], result.content[0].text

    anyio.run(main)


def raw_post(site: Site, path: str, body: bytes, cookie: str, token: str) -> tuple[int, str]:
    """A POST over a plain socket, so that the body is sent as is (and the answer read even when the
    server stops reading it)."""
    port = int(site.url.rsplit(":", 1)[1].strip("/"))
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\nX-CSRF-Token: {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        # A server that refuses the body by its Content-Length answers now (sending the body
        # anyway would have the connection reset, and the answer lost, as it closes).
        if not select.select([sock], [], [], 1.0)[0]:
            sock.sendall(body)
        return read_answer(sock)


def test_an_oversized_or_too_deep_body_is_refused_before_it_is_parsed(site: Site) -> None:
    """The body was read whole, whatever its size (a 50 MB title was parsed, then refused as too
    long); a deeply nested one made json raise RecursionError: a 500."""
    cookie, token = session(site)
    big = b'{"type": "decision", "title": "' + b"a" * (2 << 20) + b'"}'
    status, text = raw_post(site, "/api/knowledge", big, cookie, token)
    assert status == 413 and "over 1,048,576 bytes" in json.loads(text)["error"], text
    status, text = raw_post(site, "/api/knowledge", b"[" * 100_000 + b"]" * 100_000, cookie, token)
    assert status == 400 and json.loads(text)["error"] == "the request body must be a JSON object", text
    ok = json.dumps({"type": "insight", "title": "Refund vouchers expire after a year", "body": "é" * 20_000}).encode()
    status, text = raw_post(site, "/api/knowledge", ok, cookie, token)
    assert status == 200 and json.loads(text)["status"] == "created", text


def test_an_unknown_source_name_in_a_search_is_a_400_that_names_it(site: Site) -> None:
    """It was silently an empty answer, where the CLI and search_code say the name is unknown."""
    status, _, text = call(site.url + "api/search?" + urllib.parse.urlencode({"q": "refund", "source": "project,nope"}))
    assert status == 400, text
    assert json.loads(text)["error"] == "unknown source(s): nope"
    status, _, text = call(site.url + "api/search?" + urllib.parse.urlencode({"q": "refund", "source": "project"}))
    assert status == 200 and json.loads(text)["code"]["hits"], text

"""Hostile input to the served UI over plain HTTP (the session fixture site: indexed, one session
ingested): each is a 4xx naming what was wrong, never a 500."""

from __future__ import annotations

import json
import os
import urllib.parse

import anyio
import pytest
from mcp import Client
from test_security import call
from uisite import Site

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

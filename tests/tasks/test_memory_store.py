"""store_sessions and store_messages over a real memory lake: a batch of touched sessions replaces
every stored segment of those sessions and nothing else, without a merge (which joins the whole
table); a first run appends the messages it has not stored yet, also without one."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ctxlake.schemas.tables import SESSIONS, with_vector_width
from ctxlake.tasks.embed_cache import EmbeddingCache
from ctxlake.tasks.memory_store import (
    RunIds,
    messages_table,
    open_memory,
    store_messages,
    store_sessions,
)
from ctxlake.tasks.scrape.base import Msg
from ctxlake.tasks.sessionize import touched_filter

DIMS = 8


def _sessions(rows: list[tuple[str, int, str]]) -> pa.Table:
    """(session id, segment, title) -> SESSIONS rows of Claude Code sessions, without vectors."""
    at = datetime(2026, 11, 1, tzinfo=UTC)
    return pa.Table.from_pylist([
        {"id": f"claude:{sid}" + (f"#{seg}" if seg > 1 else ""), "tool": "claude", "session_id": sid,
         "segment": seg, "project_path": "/srv/app", "title": title, "started_at": at, "ended_at": at,
         "n_messages": 2, "n_user": 1, "n_assistant": 1, "tokens_in": 10, "tokens_out": 5,
         "text": f"{title} summary", "content_hash": f"h-{sid}-{seg}-{title}", "vector": None}
        for sid, seg, title in rows], schema=with_vector_width(SESSIONS, DIMS))


def _stored(tables) -> dict[str, str]:  # type: ignore[no-untyped-def]
    got = tables.sessions.search().select(["id", "title"]).limit(None).to_arrow()
    return dict(zip(got.column("id").to_pylist(), got.column("title").to_pylist(), strict=True))


def test_a_batch_replaces_its_sessions_segments_and_leaves_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = open_memory(tmp_path / "memory", DIMS)
    cache = EmbeddingCache(tmp_path / "cache", "test-model", DIMS)
    tables.sessions.add(_sessions([("a", 1, "a one"), ("a", 2, "a two"), ("b", 1, "b old"), ("c", 1, "c kept")]))

    def no_merge(*args: object, **kwargs: object) -> None:
        raise AssertionError("store_sessions merged")  # a merge by id joins every row of the table

    monkeypatch.setattr(type(tables.sessions), "merge_insert", no_merge)
    batch = [("claude", "a"), ("claude", "b")]
    # Session a is now one segment (re-split after a new message), b's summary changed, c not touched.
    result = store_sessions.fn(tables.sessions, _sessions([("a", 1, "a whole"), ("b", 1, "b new")]),
                               touched_filter(batch), cache)
    assert result.inserted == 2
    assert _stored(tables) == {"claude:a": "a whole", "claude:b": "b new", "claude:c": "c kept"}

    again = _stored(tables)  # the same batch again (a run redoing its journal): the same rows
    store_sessions.fn(tables.sessions, _sessions([("a", 1, "a whole"), ("b", 1, "b new")]), touched_filter(batch), cache)
    assert _stored(tables) == again and tables.sessions.count_rows() == 3

    # A touched session that no longer has any segment: its rows go, the others stay.
    store_sessions.fn(tables.sessions, _sessions([]), touched_filter([("claude", "b")]), cache)
    assert _stored(tables) == {"claude:a": "a whole", "claude:c": "c kept"}


def _messages(keys: list[str]) -> pa.Table:
    at = datetime(2026, 11, 1, tzinfo=UTC)
    return messages_table([Msg(tool="claude", session_id="s", timestamp=at, seq=i, role="user", kind="text",
                               text=f"message {key}", key=key, source_file="/logs/s.jsonl")
                           for i, key in enumerate(keys)], DIMS)


def _texts(tables) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(tables.messages.search().select(["text"]).limit(None).to_arrow().column("text").to_pylist())


def test_a_first_run_appends_what_it_has_not_stored_and_merges_the_rest(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tables = open_memory(tmp_path / "memory", DIMS)
    merged: list[int] = []
    real_merge = type(tables.messages).merge_insert

    def counting_merge(table, on):  # type: ignore[no-untyped-def]
        merged.append(1)
        return real_merge(table, on)

    monkeypatch.setattr(type(tables.messages), "merge_insert", counting_merge)
    run_ids = RunIds()
    assert store_messages.fn(tables, _messages(["a", "b"]), False, None, run_ids=run_ids).inserted == 2
    # New ids only: appended, no merge (a merge by id joins every row of the table).
    assert store_messages.fn(tables, _messages(["c", "d"]), False, None, run_ids=run_ids).inserted == 2
    assert merged == []
    # A resumed session's copies of stored records beside a new one: the copies go through the merge.
    result = store_messages.fn(tables, _messages(["b", "d", "e"]), False, None, run_ids=run_ids)
    assert (result.inserted, result.duplicates) == (1, 2) and merged == [1]
    assert _texts(tables) == ["message a", "message b", "message c", "message d", "message e"]


def test_a_hash_collision_loses_no_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every id hashing the same: each row looks stored, and the merge, which compares ids, keeps them all."""
    tables = open_memory(tmp_path / "memory", DIMS)
    monkeypatch.setattr(RunIds, "hashes", staticmethod(lambda ids: np.zeros(len(ids), np.uint64)))
    run_ids = RunIds()
    store_messages.fn(tables, _messages(["a"]), False, None, run_ids=run_ids)
    result = store_messages.fn(tables, _messages(["b", "c"]), False, None, run_ids=run_ids)
    assert (result.inserted, result.duplicates) == (2, 0)
    assert _texts(tables) == ["message a", "message b", "message c"]

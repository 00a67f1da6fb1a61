"""The service's request heartbeat on real sockets: beats, progress frames, a client that left,
and descriptors past select()'s 1,024 (a service holding LanceDB's files has them)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ctxlake.serve.service import protocol


@contextlib.contextmanager
def high_descriptors(count: int = 1100) -> Iterator[None]:
    """Open enough descriptors that the next ones are numbered past 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count + 64:
        pytest.skip(f"the descriptor limit ({hard}) is too low")
    if soft != resource.RLIM_INFINITY and soft < count + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count + 64, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_beats_and_progress_reach_a_client_on_a_high_descriptor() -> None:
    with high_descriptors():
        service_end, client_end = socket.socketpair()
        assert service_end.fileno() > 1024
        gone = threading.Event()
        states = iter([[{"stage": "chunk", "done": 3}], None, [{"stage": "chunk", "done": 9}]])
        with service_end, client_end:
            client_end.settimeout(5)
            started = time.monotonic()
            with protocol.heartbeat(service_end, every=0.3, gone=gone, progress=lambda: next(states, None),
                                    progress_every=0.1):
                time.sleep(1.0)
            ended = time.monotonic() - started
            service_end.shutdown(socket.SHUT_WR)
            frames = []
            with contextlib.suppress(protocol.ProtocolError, OSError):
                while True:
                    frames.append(protocol.recv(client_end))
    assert not gone.is_set()
    assert ended < 1.2  # the block's end is not held up by the thread's wait
    assert [f["progress"] for f in frames if "progress" in f] == [[{"stage": "chunk", "done": 3}],
                                                                  [{"stage": "chunk", "done": 9}]]
    assert all(f["op"] == "working" for f in frames) and len(frames) >= 3


def test_a_client_that_closes_its_end_is_noticed_at_once() -> None:
    with high_descriptors():
        service_end, client_end = socket.socketpair()
        gone = threading.Event()
        with service_end, protocol.heartbeat(service_end, every=30.0, gone=gone):
            time.sleep(0.2)
            assert not gone.is_set()
            client_end.close()
            assert gone.wait(2.0), "the closed connection went unnoticed"


def test_the_progress_feed_carries_a_stages_reports_through_its_pipe() -> None:
    """What a served command's stages write (FdReporter on the feed's pipe) comes out of the feed:
    each change once, an unchanged stage under way again after a second (the client's elapsed time
    moves through a long step), nothing once every stage is finished and shown."""
    from ctxlake.serve.service.progress import REPEAT_S, ProgressFeed
    from ctxlake.tasks.progress import FdReporter

    def settled(feed: ProgressFeed, finished: bool = False) -> list[dict[str, object]] | None:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if (state := feed.changed()) is not None and state[-1]["finished"] is finished:
                return state
            time.sleep(0.01)
        return None

    with ProgressFeed() as feed:
        stages = FdReporter(feed.fd)
        stages.start("chunk", 10, "chunking")
        assert settled(feed) == [{"stage": "chunk", "description": "chunking", "total": 10, "done": 0,
                                  "finished": False}]
        assert feed.changed() is None
        time.sleep(REPEAT_S + 0.1)
        assert feed.changed() is not None  # the same state, sent again while the stage runs
        stages.advance("chunk", 10)
        stages.finish("chunk")
        state = settled(feed, finished=True)
        assert state is not None and state[-1]["done"] == 10
        time.sleep(REPEAT_S + 0.1)
        assert feed.changed() is None


def test_a_progress_variable_without_its_pipe_names_nothing() -> None:
    """A process that inherited the variable but not the descriptor (or has another file under
    that number) must not write its progress into that file."""
    from ctxlake.tasks.progress import fd_of, fd_token

    read_end, write_end = os.pipe()
    try:
        token = fd_token(write_end)
        assert fd_of(token) == write_end
        with open(os.devnull, "rb") as other:
            assert fd_of(f"{other.fileno()}:{token.split(':')[1]}") is None  # a file, not that pipe
        assert fd_of(f"{write_end}:1") is None  # that number, another pipe
        assert fd_of("12") is None and fd_of("") is None and fd_of("x:y") is None
    finally:
        os.close(read_end)
        os.close(write_end)

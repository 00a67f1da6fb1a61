"""`ctx status` about a service that is alive but slow: it says so, and never waits on Prefect."""

from __future__ import annotations

import fcntl
import socket
import threading
import time
from pathlib import Path

import pytest

from ctxlake.serve.cli.service import service_status
from ctxlake.serve.service import protocol
from ctxlake.serve.service.client import forward
from ctxlake.serve.service.paths import service_paths
from ctxlake.serve.service.request_handling import call_within


def test_a_service_holding_its_lock_without_answering_is_up_but_not_answering(ctx_home: Path) -> None:
    paths = service_paths()
    paths.ensure_dir()
    assert service_status()["up"] is False  # nothing there: down
    with open(paths.lock, "a+") as held:  # what a live service holds while it starts or is stuck
        fcntl.flock(held, fcntl.LOCK_EX)
        status = service_status()
    assert status["up"] is True and status["answering"] is False


def test_a_slow_call_is_given_up_on_in_time() -> None:
    started = time.perf_counter()
    assert call_within(lambda: time.sleep(5) or "late", 0.2) is None
    assert time.perf_counter() - started < 2
    assert call_within(lambda: "quick", 2.0) == "quick"


def test_a_command_running_long_is_heard_from_and_a_silent_service_is_given_up_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The client hears `working` frames while a command runs and returns its answer; from a
    service that accepted the connection but says nothing (SIGSTOP, a hang) it gives up in time."""
    monkeypatch.setattr(protocol, "FIRST_REPLY_S", 0.5)
    monkeypatch.setattr(protocol, "SILENCE_S", 0.5)
    service_end, client_end = socket.socketpair()

    def serve() -> None:
        protocol.recv(service_end)
        protocol.send(service_end, {"op": "accepted"})
        with protocol.heartbeat(service_end, every=0.2):
            time.sleep(1.5)  # three times the client's patience, spoken through
        protocol.send(service_end, {"op": "result", "code": 0, "stdout": "done\n", "stderr": ""})

    worker = threading.Thread(target=serve)
    worker.start()
    assert forward(client_end, {"op": "cli", "argv": ["x"]})["stdout"] == "done\n"
    worker.join()
    service_end.close()

    silent_end, client_end = socket.socketpair()
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        forward(client_end, {"op": "cli", "argv": ["x"]})
    assert time.perf_counter() - started < 3
    silent_end.close()

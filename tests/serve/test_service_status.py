"""`ctx status` about a service that is alive but slow: it says so, and never waits on Prefect."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

from ctxlake.serve.cli.service import service_status
from ctxlake.serve.service.daemon import call_within
from ctxlake.serve.service.paths import service_paths


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

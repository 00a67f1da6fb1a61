"""The service's watch over the agent tools' log folders (real watchfiles, real folders)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ctxlake.serve.service.orchestrator import watch_log_folders


def _wait_for(calls: list[float], n: int, deadline_s: float = 30.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if len(calls) >= n:
            return True
        time.sleep(0.05)
    return False


def test_writes_in_present_and_late_folders_are_seen(tmp_path: Path) -> None:
    present, late = tmp_path / "claude" / "projects", tmp_path / "codex" / "sessions"
    present.mkdir(parents=True)
    calls: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_log_folders, args=([present, late], stop, lambda: calls.append(time.monotonic())),
                               kwargs={"appear_s": 0.3}, daemon=True)
    watcher.start()
    try:
        time.sleep(1.0)  # the watch is set up
        assert calls == []  # folders present at start are not a change by themselves
        (present / "a.jsonl").write_text("{}\n")
        assert _wait_for(calls, 1), "a write in a watched folder was not seen"
        # A tool installed after `ctx up`: its folder appears with a log already in it.
        seen = len(calls)
        late.mkdir(parents=True)
        (late / "rollout.jsonl").write_text("{}\n")
        assert _wait_for(calls, seen + 1), "a folder that appeared later was not noticed"
        time.sleep(1.5)  # it is watched from now on
        seen = len(calls)
        (late / "rollout.jsonl").write_text("{}\n{}\n")
        assert _wait_for(calls, seen + 1), "a write in the folder that appeared later was not seen"
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert not watcher.is_alive()


def test_no_folder_yet_waits_and_stops(tmp_path: Path) -> None:
    stop = threading.Event()
    calls: list[float] = []
    watcher = threading.Thread(target=watch_log_folders, args=([tmp_path / "none"], stop, lambda: calls.append(1.0)),
                               kwargs={"appear_s": 0.2}, daemon=True)
    watcher.start()
    time.sleep(0.5)
    stop.set()
    watcher.join(timeout=5)
    assert not watcher.is_alive() and calls == []

"""A served command's stage progress, for a client whose stderr is a terminal.

The command (in the service's process or in a child) writes JSON lines to a pipe whose write end
it finds in PROGRESS_FD_ENV (tasks/progress.py, FdReporter); a thread here keeps the latest line
of each stage, and the request's heartbeat sends them to the client, which draws one status line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

PROGRESS_S = 0.5  # the most often a client is sent its command's progress
REPEAT_S = 1.0  # how often an unchanged stage under way is sent again (its elapsed time moves)


class ProgressFeed:
    """The pipe and the latest state read from it. `fd` is the write end, open between enter and
    exit (a child gets it with pass_fds)."""

    def __init__(self) -> None:
        self.fd = -1
        self._read_end = -1
        self._stages: dict[str, dict[str, Any]] = {}  # in the order they started
        self._version = 0
        self._shown = 0
        self._sent_at = 0.0
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ProgressFeed:
        self._read_end, self.fd = os.pipe()
        self._reader = threading.Thread(target=self._read, name="progress feed", daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # the reader sees the end once every copy of this end is closed (a child's too)
        self.fd = -1
        if self._reader is not None:
            self._reader.join(timeout=5.0)

    def _read(self) -> None:
        with os.fdopen(self._read_end, "rb") as stream:
            for line in stream:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict) or not isinstance(record.get("stage"), str):
                    continue
                with self._lock:
                    self._stages[record["stage"]] = record
                    self._version += 1

    def changed(self) -> list[dict[str, Any]] | None:
        """The stages' latest state when it changed since the last call, or a stage is still under
        way and a second has passed (the client's elapsed time keeps moving through a long step,
        such as the model's one-time distillation); else None."""
        now = time.monotonic()
        with self._lock:
            running = any(not s.get("finished") for s in self._stages.values())
            if self._version == self._shown and not (running and now - self._sent_at >= REPEAT_S):
                return None
            self._shown, self._sent_at = self._version, now
            return list(self._stages.values())

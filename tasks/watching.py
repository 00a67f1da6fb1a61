"""What the watch loops share (flows/watch_code.py, serve/service/watchers.py): the stop request
and the reading of a batch of file events. Apart from the flow so that a command can arm its
SIGINT handler before Prefect is imported (Prefect reads its logging settings at import, from the
environment the command sets first)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Folders whose churn never matters: git's bookkeeping and the lake's own writes (.ctx/lake).
NOISE = (".git/", ".ctx/")

# One watcher per process; `request_stop` ends it from another thread (tests, embedding hosts).
STOP = threading.Event()


def request_stop() -> None:
    STOP.set()


def stop_on_interrupt(signum: int, frame: Any) -> None:
    """SIGINT handler of `ctx run index --watch`: ask the watch loop to stop, then interrupt as
    Python's own handler does. A Ctrl-C that lands while Prefect ends the first index run's
    subflow is swallowed there (its engine was joining its heartbeat thread), and the watcher went
    on watching; the stop request survives that."""
    request_stop()
    raise KeyboardInterrupt


def changed_paths(root: Path, events: Iterable[tuple[int, str]]) -> set[str]:
    """The project-relative paths of one batch of watcher events, without the root and the noise."""
    paths = {Path(p).relative_to(root).as_posix() for _, p in events if Path(p).is_relative_to(root)}
    return {p for p in paths if p != "." and not p.startswith(NOISE)}

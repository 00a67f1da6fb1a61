"""The stop request of a watch loop (flows/watch_code.py), apart from the flow so that a command
can arm its SIGINT handler before Prefect is imported (Prefect reads its logging settings at
import, from the environment the command sets first)."""

from __future__ import annotations

import threading
from typing import Any

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

"""Child processes that end with this one however it ends, `kill -9` included (Linux).

The kernel's parent-death signal (prctl PR_SET_PDEATHSIG) is sent when the *thread* that spawned
the child ends, not the process. A child started from one of the service's request threads would
be signalled as that request ended; started from the main thread or from `on_lifetime_thread`'s
thread, which live as long as the process, it is signalled only when the process dies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_keeper: ThreadPoolExecutor | None = None
_keeper_lock = threading.Lock()
KEEPER_NAME = "ctx-child-spawner"


def die_with_this_process() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel send the child SIGTERM when the spawning thread ends
    (Linux only, else None): spawn from the main thread or through `on_lifetime_thread`."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:  # in the child, between fork and exec: no allocation-heavy work here
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above: nothing would tell us
            os._exit(1)

    return arm


def on_lifetime_thread(fn: Callable[[], T]) -> T:
    """`fn()` on a thread that lives as long as this process (the main thread when called from
    it, else one kept for the purpose), so that children it spawns with `die_with_this_process`
    are signalled when the process dies and not before. Calls are served one at a time."""
    global _keeper
    here = threading.current_thread()
    if here is threading.main_thread() or here.name.startswith(KEEPER_NAME):
        return fn()
    with _keeper_lock:
        if _keeper is None:
            # One worker that waits for work until the interpreter exits: its thread never ends
            # while the process runs.
            _keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix=KEEPER_NAME)
    return _keeper.submit(fn).result()

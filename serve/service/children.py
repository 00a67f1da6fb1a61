"""Child processes that end with this one however it ends, `kill -9` included (Linux).

The kernel's parent-death signal (prctl PR_SET_PDEATHSIG) is sent when the *thread* that spawned
the child ends, not the process. A child started from one of the service's request threads would
be signalled as that request ended; started from the main thread or from `on_lifetime_thread`'s
thread, which live as long as the process, it is signalled only when the process dies.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_keeper: ThreadPoolExecutor | None = None
_keeper_lock = threading.Lock()
KEEPER_NAME = "ctx-child-spawner"


# Arms the signal in the child and then runs the real command in its place (the setting survives
# exec). Armed in the child's own code, not in a preexec_fn: a preexec_fn makes subprocess fork
# instead of vfork, which runs LanceDB's fork handlers in the child ("lancedb fork support is
# experimental ... a small chance of deadlock", printed on every such spawn).
_LAUNCHER = ("import ctypes, os, signal, sys\n"
             "ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))\n"  # PR_SET_PDEATHSIG
             # The parent died before the line above: nothing would signal us.
             "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
             "os.execvp(sys.argv[2], sys.argv[2:])")


def dying_with_this_process(argv: Sequence[str]) -> list[str]:
    """`argv` run so that the kernel sends it SIGTERM when the spawning thread ends (Linux only;
    elsewhere `argv` as it is): spawn from the main thread or through `on_lifetime_thread`. The
    child keeps the pid it is started with (a small Python launcher execs `argv`)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *argv]


def on_lifetime_thread(fn: Callable[[], T]) -> T:
    """`fn()` on a thread that lives as long as this process (the main thread when called from
    it, else one kept for the purpose), so that children it spawns with `dying_with_this_process`
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

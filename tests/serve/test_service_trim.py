"""The service gives freed heap pages back to the system once it goes idle after work."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import weakref
from types import SimpleNamespace

import pytest

from ctxlake.serve.service import daemon
from ctxlake.tasks import heap


def _burn(seconds: float) -> None:
    """Use `seconds` of CPU in this process."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        sum(i * i for i in range(10_000))


class _Cycle:
    """Garbage only the cycle collector frees (it refers to itself), holding a buffer."""

    def __init__(self) -> None:
        self.me = self
        self.buffer = bytearray(8 << 20)


def test_idle_after_work_gives_freed_memory_back_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    monkeypatch.setattr(heap, "give_back_freed_memory", lambda: calls.append(time.monotonic()))
    monkeypatch.setattr(daemon, "HOUSEKEEPING_S", 0.2)
    # Idle here is under 30% of a core: other tests' threads in this process may still tick.
    monkeypatch.setattr(daemon, "IDLE_CPU_SHARE", 0.3)
    # Only what housekeeping touches: a whole Service would install its engine in this process
    # (the embedders of every later test would then be the service's shared ones).
    service = SimpleNamespace(stopping=threading.Event(), engine=SimpleNamespace(evict_idle=lambda: []),
                              watchers=SimpleNamespace(drop_missing=lambda: []), remember=lambda: None)
    keeper = threading.Thread(target=daemon.Service._housekeeping, args=(service,), daemon=True)
    keeper.start()
    gc.disable()  # no automatic collection meanwhile: only the trim's may free the cycle
    try:
        time.sleep(0.6)
        assert calls == []  # nothing done yet: nothing to give back
        cycle = _Cycle()
        garbage = weakref.ref(cycle)
        del cycle
        _burn(daemon.TRIM_AFTER_CPU_S + 0.2)  # busy: no trim while the work goes on
        busy_until = time.monotonic()
        deadline = busy_until + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(calls) == 1 and calls[0] >= busy_until  # after the work, once idle
        assert garbage() is None  # cyclic garbage collected before the pages go back
        time.sleep(1.0)
        assert len(calls) == 1  # idle on: no second trim without new work
    finally:
        gc.enable()
        service.stopping.set()
        keeper.join(5)


ARENAS = """
import ctypes, sys, threading
from ctxlake.tasks.heap import bound_heap
if sys.argv[1] == "bound" and not bound_heap():
    sys.exit("bound_heap() did not apply")
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
start = threading.Barrier(7)
def grab():
    start.wait()
    libc.malloc(1000)
threads = [threading.Thread(target=grab) for _ in range(6)]
[t.start() for t in threads]; start.wait(); [t.join() for t in threads]
libc.malloc_stats()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_the_service_heap_keeps_two_arenas_however_many_threads_allocate() -> None:
    """What the service calls at start: six threads allocating at once get at most two arenas
    (unbounded, glibc gives each its own, and each keeps what its thread freed)."""
    arenas = {}
    for mode in ("bound", "free"):
        done = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        arenas[mode] = sum(line.startswith("Arena ") for line in done.stderr.splitlines())
    assert 1 <= arenas["bound"] <= heap.MALLOC_ARENAS < arenas["free"], arenas

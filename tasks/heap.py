"""glibc's heap, kept small in processes that read or write a lot (glibc only; elsewhere nothing
changes). Freed memory stays with the allocator: in the arena of the thread that freed it (LanceDB's
runtime and the read threads each get one) and in pages glibc keeps for reuse. A long-lived
service and a long writer run both grew on that, not on live data."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from functools import cache

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt's parameters (glibc's malloc.h)
MALLOC_ARENAS = 2
HEAP_MMAP_BYTES = 1 << 20
# Lance's IVF shuffle (a vector index build) holds this many bytes of assigned vectors before it
# writes them out; its default is 128 MiB. Built alone over the 20,000-session history's ~0.9M
# vectors, the messages' index peaked +771 MB by default and +585 MB with 32 MiB, in the same time.
SHUFFLE_ENV, SHUFFLE_BATCH_BYTES = "LANCE_SHUFFLE_BATCH_BYTES", 32 << 20


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def bound_heap(mmap_bytes: int | None = HEAP_MMAP_BYTES) -> bool:
    """At most MALLOC_ARENAS arenas for this process's threads and, with `mmap_bytes`, blocks of
    that size and more in their own mappings, returned whole when freed (glibc otherwise raises
    that bound as big blocks are freed, up to 32 MB, and Arrow's buffers then stay in the heap).
    Call it before the process starts its threads. False where it does not apply."""
    libc = _libc()
    if libc is None:
        return False
    try:
        ok = bool(libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS))
        return ok and (mmap_bytes is None or bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes)))
    except AttributeError:  # a libc without mallopt (musl)
        return False


def bound_index_builds() -> None:
    """Smaller buffers for the vector index builds of this process, unless the user set their own.
    Lance reads them from the environment: call it before the process starts its threads."""
    os.environ.setdefault(SHUFFLE_ENV, str(SHUFFLE_BATCH_BYTES))


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (malloc_trim): after a big read, or between the
    groups of a long write."""
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):
            libc.malloc_trim(0)

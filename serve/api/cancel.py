"""Whether whoever asked for the work this thread does has gone away (a service client that quit).

The service marks a request's thread while it runs the command; a long read (`ctx sql`) checks
`abandoned()` where it waits and stops instead of running on for nobody.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_marks: dict[int, threading.Event] = {}


@contextmanager
def on_behalf(gone: threading.Event) -> Iterator[None]:
    """The work this thread does in the block is for a caller that has left once `gone` is set."""
    me = threading.get_ident()
    _marks[me] = gone
    try:
        yield
    finally:
        _marks.pop(me, None)


def abandoned() -> bool:
    gone = _marks.get(threading.get_ident())
    return gone is not None and gone.is_set()

"""Per-request stdout/stderr inside the service: proxies that dispatch on a context variable.

sys.stdout is one object for the whole process; requests run concurrently in threads. The proxy
installed once writes to the buffer of the request whose context is current, else to the real
stream (the service log), so two requests' outputs never mix.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO


class RequestStream(io.StringIO):
    """One request's stream; reports the client's terminal so colour decisions match its shell."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


_current: ContextVar[tuple[RequestStream, RequestStream] | None] = ContextVar("ctx_request_streams", default=None)


class _Dispatch(io.TextIOBase):
    def __init__(self, index: int, fallback: TextIO) -> None:
        self._index = index
        self._fallback = fallback

    def _target(self) -> TextIO:
        streams = _current.get()
        return streams[self._index] if streams is not None else self._fallback

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return self._target().isatty()

    def fileno(self) -> int:
        if _current.get() is not None:
            raise io.UnsupportedOperation("a request's stream has no file descriptor")
        return self._fallback.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


def install() -> None:
    """Replace sys.stdout/sys.stderr with the dispatching proxies (once, in the service)."""
    if not isinstance(sys.stdout, _Dispatch):
        sys.stdout = _Dispatch(0, sys.stdout)
    if not isinstance(sys.stderr, _Dispatch):
        sys.stderr = _Dispatch(1, sys.stderr)


@contextmanager
def captured(stdout_tty: bool, stderr_tty: bool) -> Iterator[tuple[RequestStream, RequestStream]]:
    streams = (RequestStream(stdout_tty), RequestStream(stderr_tty))
    token = _current.set(streams)
    try:
        yield streams
    finally:
        _current.reset(token)


def log(message: str) -> None:
    """One line in the service log (the real stderr; requests' streams are captured apart)."""
    stream = getattr(sys.stderr, "_fallback", sys.stderr)
    stream.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ctx-service[{os.getpid()}] {message}\n")
    stream.flush()

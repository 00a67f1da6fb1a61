"""Progress reporting from stages to whoever renders it (Rich bars in the CLI, nothing in tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class Reporter(Protocol):
    def start(self, stage: str, total: int | None, description: str = "") -> None: ...
    def advance(self, stage: str, n: int = 1) -> None: ...
    def finish(self, stage: str) -> None: ...
    def note(self, message: str) -> None: ...


class NullReporter:
    def start(self, stage: str, total: int | None, description: str = "") -> None:
        pass

    def advance(self, stage: str, n: int = 1) -> None:
        pass

    def finish(self, stage: str) -> None:
        pass

    def note(self, message: str) -> None:
        pass


# Stages run inside Prefect task runs, which do not take a renderer as a parameter (it would be
# recorded as an input); the entry point installs one here for the duration of a run instead.
_current: Reporter = NullReporter()


def reporter() -> Reporter:
    return _current


@contextlib.contextmanager
def use_reporter(new: Reporter) -> Iterator[Reporter]:
    global _current
    previous, _current = _current, new
    try:
        yield new
    finally:
        _current = previous

"""Progress reporting from stages to whoever renders it (Rich bars in the CLI, nothing in tests)."""

from __future__ import annotations

import contextlib
import json
import os
import time
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


# Set by the resident service for a command it runs for a client whose stderr is a terminal: the
# stages' progress goes to this file descriptor as JSON lines, and the service hands it on.
PROGRESS_FD_ENV = "CTX_PROGRESS_FD"
FD_REPORT_S = 0.2  # at most one line per stage this often while it advances (a stage may advance per file)


class FdReporter:
    """Progress as one JSON line per change ({"stage", "description", "total", "done", "finished"})
    written to a file descriptor the caller owns; advances are sent at most every FD_REPORT_S per
    stage. A reader that went away turns it silent; the work goes on. Notes are not sent: the
    command prints them in its own output."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._about: dict[str, tuple[str, int | None]] = {}  # stage -> (description, total)
        self._done: dict[str, int] = {}
        self._sent: dict[str, float] = {}

    def __enter__(self) -> FdReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _send(self, record: dict[str, object]) -> None:
        if self.fd < 0:
            return
        try:
            os.write(self.fd, (json.dumps(record) + "\n").encode())
        except OSError:
            self.fd = -1

    def _report(self, stage: str, finished: bool = False) -> None:
        description, total = self._about[stage]
        self._sent[stage] = time.monotonic()
        self._send({"stage": stage, "description": description, "total": total, "done": self._done[stage],
                    "finished": finished})

    def start(self, stage: str, total: int | None, description: str = "") -> None:
        self._about[stage], self._done[stage] = (description or stage, total), 0
        self._report(stage)

    def advance(self, stage: str, n: int = 1) -> None:
        if stage in self._about:
            self._done[stage] += n
            if time.monotonic() - self._sent[stage] >= FD_REPORT_S:
                self._report(stage)

    def finish(self, stage: str) -> None:
        if stage in self._about:
            self._report(stage, finished=True)

    def note(self, message: str) -> None:
        pass


def fd_token(fd: int) -> str:
    """What PROGRESS_FD_ENV holds for pipe end `fd`: its number and its inode, so that a process
    that got the variable without the descriptor (a grandchild, a child started meanwhile from
    the service's environment) never writes into whatever file has that number there."""
    return f"{fd}:{os.fstat(fd).st_ino}"


def fd_of(token: str) -> int | None:
    """The descriptor a fd_token names, when this process has that very pipe open."""
    import stat

    number, _, inode = token.partition(":")
    if not number.isdigit() or not inode.isdigit():
        return None
    try:
        st = os.fstat(int(number))
    except OSError:
        return None
    return int(number) if stat.S_ISFIFO(st.st_mode) and st.st_ino == int(inode) else None


def fd_from_env() -> int | None:
    """The progress pipe PROGRESS_FD_ENV names, when this process has it open."""
    return fd_of(os.environ.get(PROGRESS_FD_ENV, ""))

"""The lake's writer lock (tasks/lake.py WriterLock) when the disk is full as it is taken."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ctxlake.errors import LockBusyError
from ctxlake.tasks import lake
from ctxlake.tasks.lake import WriterLock


def test_a_full_disk_while_taking_the_lock_leaves_it_releasable(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner record failed to write (ENOSPC) after the flock was taken, before the lock kept
    its descriptor: the error escaped with the lock held for the life of the process, and a
    long-lived service then refused every later ingest with "another writer holds the lake: pid ?"."""
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lake.os, "write", full)
    first = WriterLock(tmp_path).acquire()
    monkeypatch.setattr(lake.os, "write", real_write)
    with pytest.raises(LockBusyError):  # held, as the run that took it goes on
        WriterLock(tmp_path).acquire()
    first.release()
    again = WriterLock(tmp_path).acquire()  # and free once that run ends
    assert again.owner()["pid"] == os.getpid()
    again.release()

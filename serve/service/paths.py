"""Where the service keeps its state under $CTX_HOME; standard library only (the thin client uses it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SERVICE_DIR = "service"


def ctx_home(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """Resolve the user dir exactly like schemas/roots.py default_home, without importing it."""
    source = os.environ if env is None else env
    if source.get("CTX_HOME"):
        return Path(source["CTX_HOME"]).expanduser().resolve()
    # platformdirs is a small pure-Python module (a few ms); using it keeps one resolution rule.
    from platformdirs import user_data_dir

    return Path(user_data_dir("ctxlake", appauthor=False))


class ServicePaths:
    """The files of one user's service: a 0700 folder holding a 0600 socket, locks, state and log.

    A plain class: `dataclasses` (with the `inspect` it imports) was a fifth of the thin client's
    start-up, which every `ctx` command served by the service pays."""

    __slots__ = ("home",)

    def __init__(self, home: Path) -> None:
        self.home = home

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServicePaths) and other.home == self.home

    def __hash__(self) -> int:
        return hash(self.home)

    def __repr__(self) -> str:
        return f"ServicePaths({self.home!r})"

    @property
    def dir(self) -> Path:
        return self.home / SERVICE_DIR

    @property
    def socket(self) -> Path:
        return self.dir / "ctx.sock"

    @property
    def lock(self) -> Path:
        """Held (flock) by the running service for its whole life: proof that it is alive."""
        return self.dir / "service.lock"

    @property
    def start_lock(self) -> Path:
        """Held by a `ctx up` while it starts a service, so that two at once start one."""
        return self.dir / "start.lock"

    @property
    def info(self) -> Path:
        return self.dir / "service.json"

    @property
    def log(self) -> Path:
        return self.dir / "service.log"

    @property
    def watched(self) -> Path:
        """The watched projects' roots, so that the next `ctx up` watches them again."""
        return self.dir / "watched.json"

    @property
    def prefect_server(self) -> Path:
        """The Prefect server the service started (pid, start time): found and stopped by the next
        `ctx up` or `ctx down` when the service died without stopping it (kill -9)."""
        return self.dir / "prefect-server.json"

    def ensure_dir(self) -> Path:
        """Create the folder 0700 (and tighten it if someone loosened it)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if sys.platform != "win32" and (self.dir.stat().st_mode & 0o777) != 0o700:
            os.chmod(self.dir, 0o700)
        return self.dir


def service_paths(env: dict[str, str] | os._Environ[str] | None = None) -> ServicePaths:
    return ServicePaths(ctx_home(env))


def write_private_json(path: Path, data: Any) -> None:
    """`data` as JSON at `path`, 0600, atomically (a reader sees the old file or the whole new one)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data))
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)

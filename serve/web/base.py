"""The web UI's shared pieces (serve stage; SESSIONS, MESSAGES, KNOWLEDGE through serve/api): UiContext, Schedules, request helpers.

What the project may see and how a request names it; the route modules import this one, it imports no route."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from ctxlake.errors import CtxError, InputError
from ctxlake.schemas.config import Settings, load_settings
from ctxlake.serve.web.jobs import Jobs
from ctxlake.tasks.lake import lake_failure

ANALYTICS_TOP = 12  # bars per ranked chart
WARM_DELAY_S = 2.0  # after a project's first page, before its Analytics figures are computed


class Schedules:
    """The service's scheduled flows (its orchestrator's Prefect server); absent outside the service."""

    def __init__(self, orchestrator_of: Callable[[], Any] = lambda: None) -> None:
        self.orchestrator_of = orchestrator_of  # the service starts its orchestrator after the UI

    @property
    def api_url(self) -> str | None:
        orchestrator = self.orchestrator_of()
        return getattr(orchestrator, "api_url", None) if orchestrator is not None else None

    def list(self) -> list[dict[str, Any]]:
        orchestrator = self.orchestrator_of()
        if orchestrator is None or self.api_url is None:
            return []
        return list(orchestrator.schedules())

    def change(self, name: str, action: str, every: str | None = None) -> None:
        from ctxlake.serve.service import schedules

        if self.api_url is None:
            raise InputError("schedules run in the service", hint="start it with `ctx up`")
        if action in ("pause", "resume"):
            schedules.pause_schedule(self.api_url, name, paused=action == "pause")
        elif action == "every":
            schedules.set_schedule(self.api_url, name, every=every)
        else:
            raise InputError(f"unknown schedule action {action!r}", hint="pause, resume or every")


@dataclass
class UiContext:
    """What the pages may see: the registered project roots (nothing else is served), one warm
    lake per project, the schedules, and the background jobs."""

    projects: Callable[[], list[str]]
    schedules: Schedules = field(default_factory=Schedules)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    mode: str = "service"  # or "standalone"
    jobs: Jobs = field(default_factory=Jobs)
    _memory: dict[str, tuple[tuple[Any, ...], Any]] = field(default_factory=dict)
    _settings: dict[str, tuple[Any, Settings]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _engine: Any = None
    _overview: tuple[Any, float, dict[str, Any]] | None = None
    _warmed: set[str] = field(default_factory=set)

    def roots(self) -> list[str]:
        return list(dict.fromkeys(self.projects()))

    def pick(self, request: Request) -> str | None:
        """The project named by ?project= (it must be registered), else the first one."""
        roots = self.roots()
        asked = request.query_params.get("project")
        if asked:
            if asked not in roots:
                raise InputError(f"not a registered project: {asked!r}",
                                 hint="register it with `ctx up --watch PATH` or `ctx run index` while the service runs")
            return asked
        return roots[0] if roots else None

    def settings(self, root: str) -> Settings:
        config = Path(root) / ".ctx" / "config.toml"
        try:
            stamp: Any = config.stat().st_mtime_ns
        except OSError:
            stamp = None
        with self._lock:
            hit = self._settings.get(root)
            if hit is not None and hit[0] == stamp:
                return hit[1]
        settings = load_settings(Path(root), env=self.env)
        with self._lock:
            self._settings[root] = (stamp, settings)
        return settings

    def engine(self) -> Any:
        from ctxlake.serve.service import engine

        if self._engine is None:
            self._engine = engine.active() or engine.EngineCache()
        return self._engine

    def lake(self, settings: Settings) -> Any:
        return self.engine().lake(settings)

    def warm_analytics(self, root: str, *, start: bool = True) -> threading.Timer | None:
        """Compute a project's Analytics figures on a thread when one of its other pages is first
        served, so that DuckDB's import and the first scans of the tables (0.2-0.7 s, once per
        process) are not paid by the Analytics page itself. Once per project and process; later
        visits recompute only what a write changed. `start=False` marks the project as warmed (the
        Analytics page computes them itself)."""
        with self._lock:
            if root in self._warmed:
                return None
            self._warmed.add(root)
        if not start:
            return None
        # A moment after the page: its own requests (the Overview's data) go first.
        thread = threading.Timer(WARM_DELAY_S, self._warm_analytics, args=(root,))
        thread.name, thread.daemon = "ctx-ui-warm", True
        thread.start()
        return thread

    def _warm_analytics(self, root: str) -> None:
        from ctxlake.serve.api.stats import lake_stats

        try:
            lake_stats(self.settings(root), top=ANALYTICS_TOP)
        except Exception:  # a warm-up only: the page reports the error when it is visited
            return

    def memory(self, settings: Settings) -> Any:
        from ctxlake.serve.api.memory_lake import MemoryLake

        key = str(settings.root)
        stamp = _memory_stamp(settings)  # an ingest rewrites these: reopen then (new tables may exist)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None and hit[0] == stamp and hit[1].settings is settings:
                return hit[1]
        engine = self.engine()
        # The model is loaded (once, shared with code search) when a search first needs it, not for
        # the Overview's counts or a session's messages.
        lake = MemoryLake(settings, load_embedder=lambda: engine.embedder(settings))
        with self._lock:
            self._memory[key] = (stamp, lake)
        return lake


def _memory_stamp(settings: Settings) -> tuple[Any, ...]:
    from ctxlake.tasks.lake import STATE_FILE
    from ctxlake.tasks.memory_state import MANIFEST_FILE

    out: list[Any] = []
    for path in (settings.memory_dir / STATE_FILE, settings.lake_dir / MANIFEST_FILE, settings.lake_dir / STATE_FILE):
        try:
            st = path.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


# -- helpers -------------------------------------------------------------------------------------

def _ctx(request: Request) -> UiContext:
    ctx: UiContext = request.app.state.ctx
    return ctx


def _known(exc: BaseException) -> CtxError | None:
    """ctxlake's own error for `exc`: itself, or the LakeError a full or forbidden disk or a damaged
    lake's Lance error stands for (the one line and hint the CLI prints); None for a bug."""
    if isinstance(exc, CtxError):
        return exc
    if isinstance(exc, (OSError, RuntimeError, ValueError)):
        return lake_failure(exc)
    return None


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _number(request: Request, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    """A whole-number query parameter clamped to [low, high]; a value that is no number is the
    caller's mistake (400 with its name), never a 500."""
    raw = (request.query_params.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name} must be a whole number, got {raw[:40]!r}") from None
    return max(low, value if high is None else min(value, high))

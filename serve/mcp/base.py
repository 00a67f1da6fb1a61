"""What the MCP server and its tool groups share: the options, the per-server state (lake,
docs reader, freshness cache), the read-only annotation and the domain-error wrapper. The server
(`server.py`) and the tool modules import this; it imports neither."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from ctxlake.errors import CtxError, LakeError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.serve.api.docs import DocsReader
from ctxlake.tasks.lake import lake_failure

if TYPE_CHECKING:
    from ctxlake.serve.api.code_lake import Lake
    from ctxlake.serve.api.memory_lake import MemoryLake
    from ctxlake.tasks.freshness import Freshness

P = ParamSpec("P")
R = TypeVar("R")

# Every query tool: reads the lake only, same answer for the same lake, touches nothing outside it.
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)
log = logging.getLogger("ctxlake.mcp")


@dataclass(frozen=True)
class ServeOptions:
    """How `ctx serve` was started (what the settings do not say)."""

    allow_index: bool = False  # expose index_codebase (starts `ctx run index` in a separate process)
    allow_agents: bool = False  # expose ask_codebase (spawns a CLI agent in a sandbox; writes no table)
    allow_writes: bool = False  # expose save_decision/save_error_solution/save_insight (knowledge files only)
    log_level: str = "WARNING"


class FreshnessCache:
    """The last freshness scan of the project (stat of every file: ~0.3 s on django here), redone
    only when needed: a file watcher marks it dirty on any change, and a dirty or (without a
    watcher) older-than-[mcp] stale_check_s scan is replaced on a background thread while callers
    get the previous one. stale_check_s = 0 scans on every call (exact, for tests).

    In the service, a project its watcher follows needs no watcher of its own per session (ten
    sessions were ten inotify walks of the tree): the scan is redone when that watcher's state
    moves, and costs a lookup then (serve/api/watched.py). A project it does not follow gets one
    cache, one watcher and one first scan for all the sessions open on it (`shared_freshness`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._last: tuple[float, Freshness] | None = None
        self._lock = threading.Lock()
        self._dirty = False
        self._refreshing = False
        self._watching = False
        self._stop = threading.Event()
        self._scanning = 0
        self._scanned = threading.Event()  # set once the first scan has finished
        self._followed: tuple[int, frozenset[str]] | None = None  # the service watcher's state at the last scan
        self._began = False
        self._users = 0  # sessions sharing this cache (shared_freshness)

    def get(self) -> Freshness:
        max_age = self.settings.mcp.stale_check_s
        with self._lock:
            first_running = self._last is None and self._scanning > 0
        if first_running and max_age > 0:
            # The warm-up is scanning already: wait for it rather than stat every file twice.
            self._scanned.wait(timeout=60)
        with self._lock:
            last = self._last
            if last is not None and max_age > 0:
                followed = _service_watch(self.settings.root)
                if followed is not None:
                    expired = followed != self._followed
                else:
                    expired = self._dirty or (not self._watching and time.monotonic() - last[0] > max_age)
                if expired and not self._refreshing:
                    self._refreshing = True
                    threading.Thread(target=self.rescan, name="ctx-freshness", daemon=True).start()
                return last[1]
        return self.rescan()

    def rescan(self) -> Freshness:
        """A new scan, remembered for the next callers."""
        from ctxlake.serve.api.watched import project_freshness

        with self._lock:
            self._dirty = False  # changes from here on mark the new scan dirty again
            self._followed = _service_watch(self.settings.root)
            self._scanning += 1
        try:
            fresh = project_freshness(self.settings)
            with self._lock:
                self._last = (time.monotonic(), fresh)
            self._scanned.set()
            return fresh
        finally:
            with self._lock:
                self._scanning -= 1
            self._refreshing = False

    def begin(self) -> None:
        """Watch the project and scan it once, on daemon threads; later calls do nothing.

        Watch first, so that no change slips in between the first scan and the watch."""
        with self._lock:
            if self._began:
                return
            self._began = True
        threading.Thread(target=self.watch, name="ctx-watch", daemon=True).start()
        threading.Thread(target=self.rescan, name="ctx-first-scan", daemon=True).start()

    def watch(self) -> None:
        """Mark the scan dirty on every change under the root (run on a daemon thread)."""
        try:
            from watchfiles import DefaultFilter, watch

            # The lake changes under an indexer's hands; that is not a change to the project.
            ignore = DefaultFilter(ignore_paths=[str(self.settings.ctx_dir)])
            self._watching = True
            for _ in watch(self.settings.root, watch_filter=ignore, debounce=200, stop_event=self._stop,
                           raise_interrupt=False, ignore_permission_denied=True):
                with self._lock:
                    self._dirty = True
        except Exception as exc:  # inotify limits, a vanished root: fall back to timed scans
            log.warning("file watcher stopped (%s); rescanning every %.0f s instead",
                        exc, self.settings.mcp.stale_check_s)
        finally:
            self._watching = False

    def stop(self) -> None:
        self._stop.set()


# One freshness cache per project and settings for the sessions of this process (the service hosts
# many), with the number of sessions using it; the last one to close stops its watcher.
_caches: dict[str, FreshnessCache] = {}
_caches_lock = threading.Lock()


def shared_freshness(settings: Settings) -> FreshnessCache:
    """The freshness cache of `settings`' project that this process's sessions share."""
    key = settings.model_dump_json()
    with _caches_lock:
        fresh = _caches.get(key)
        if fresh is None:
            fresh = _caches[key] = FreshnessCache(settings)
        fresh._users += 1
        return fresh


def release_freshness(fresh: FreshnessCache) -> None:
    """A session is done with its cache; the last one stops the watcher."""
    with _caches_lock:
        fresh._users -= 1
        if fresh._users > 0:
            return
        for key, cached in list(_caches.items()):
            if cached is fresh:
                del _caches[key]
    fresh.stop()


def _service_watch(root: Path) -> tuple[int, frozenset[str]] | None:
    """The service watcher's state of `root` (None: not watched); imported on first use, as the
    freshness check itself is."""
    from ctxlake.serve.api.watched import watch_state

    return watch_state(root)


class HeldMemory:
    """The conversation-memory reader a server's tools share (search_context, handoff_brief,
    tool_preferences, ...), opened on the first call and kept: opening one per call cost
    handoff_brief 37.7 ms. Opened again while the memory lake or the knowledge table does not exist
    yet, so a server started before the first `ctx run ingest` sees its result."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._held: MemoryLake | None = None
        self._lock = threading.Lock()

    def __call__(self) -> MemoryLake:
        # Imported here: the memory reader pulls in pyarrow, which start-up must not wait for.
        from ctxlake.serve.api.memory_lake import MemoryLake

        with self._lock:
            held = self._held
            if held is None or held.messages is None or held.knowledge is None:
                held = self._held = MemoryLake(self.settings)
            return held


class ServerState:
    """What every tool shares for one server: settings, the lake (opened once, in the
    background), the docs reader and the freshness cache."""

    def __init__(self, settings: Settings, options: ServeOptions) -> None:
        self.settings = settings
        self.options = options
        self.docs = DocsReader(settings.root, settings.docs, settings.mcp.max_response_chars)
        self.fresh = shared_freshness(settings)
        self._closed = False
        self._lake: Future[Lake] = Future()
        self._lake_lock = threading.Lock()
        self._started = False
        self.started_at = time.monotonic()
        self.memory = HeldMemory(settings)  # the conversation-memory reader every tool shares

    def start(self) -> None:
        """Begin opening the lake on a daemon thread (once); `lake()` waits for it."""
        with self._lake_lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._warm_up, name="ctx-open-lake", daemon=True).start()

    def _warm_up(self) -> None:
        watching = self.settings.mcp.stale_check_s > 0 and self.settings.lake_dir.is_dir()
        if watching and _service_watch(self.settings.root) is None:
            # The scan (stat calls, mostly outside the GIL) runs while lancedb imports.
            self.fresh.begin()
        self._open()
        if self._lake.exception() is None:
            from ctxlake.serve.api.code_lake import embedded_fraction
            from ctxlake.serve.api.ranked_lists import keyword_rows

            # Loads the FTS index and the vectors (held in memory: this server lives long) now
            # rather than in the first search.
            lake = self._lake.result()
            lake.keep_vectors()
            embedded_fraction(lake)
            keyword_rows(lake, "warm up", 1, None)

    def _open(self) -> None:
        try:
            from ctxlake.serve.service.engine import open_lake

            lake = open_lake(self.settings)  # the service's warm one when hosted there
        except BaseException as exc:  # handed to the first tool that asks, in its own thread
            self._lake.set_exception(exc)
        else:
            self._lake.set_result(lake)
            log.info("lake opened %.2f s after start", time.monotonic() - self.started_at)

    def lake(self) -> Lake:
        """The open lake. A project that was not indexed when the server started is looked at
        again on every call, so indexing while the server runs needs no restart."""
        self.start()
        with self._lake_lock:
            try:
                return self._lake.result()
            except (NotIndexedError, LakeError):
                retry: Future[Lake] = Future()
                self._lake = retry
                self._open()
                return retry.result()

    def query_embedder(self, lake: Lake) -> None:
        """Load the query embedder (the first semantic query's cost) and keep torch to one thread:
        one short query gains nothing from a second thread, and on a busy 2-core machine the
        threads' contention made a MiniLM query embedding ~5-10x slower (27 ms vs 250-600 ms)."""
        lake.embedder()
        if "torch" in sys.modules:
            import torch

            # Set on every call: torch keeps the count per thread (new threads inherit the last
            # value set), and the query runs on whichever worker thread took this request.
            torch.set_num_threads(1)

    def freshness(self) -> Freshness:
        return self.fresh.get()

    def rescan(self) -> Freshness:
        return self.fresh.rescan()

    def close(self) -> None:
        with self._lake_lock:
            if self._closed:
                return
            self._closed = True
        release_freshness(self.fresh)


def tool_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn ctxlake's domain errors, a full or forbidden disk and a damaged lake into MCP tool
    errors that carry the message and the hint the CLI prints (the SDK would hide an unexpected
    exception's text from the client)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CtxError as exc:
            raise ToolError(f"{exc.message}" + (f" (hint: {exc.hint})" if exc.hint else "")) from exc
        except (OSError, RuntimeError, ValueError) as exc:
            known = lake_failure(exc)
            if known is None:
                raise
            raise ToolError(f"{known.message} (hint: {known.hint})") from exc

    # The docstring is the tool's description: without the source's indentation on later lines.
    wrapper.__doc__ = inspect.cleandoc(fn.__doc__ or "")
    return wrapper


ToolGroup = Callable[[MCPServer, ServerState], None]


def response_size(result: Any) -> int:
    """Characters a tool answer puts on the wire: its structured content plus its JSON text mirror, which
    the SDK indents (two spaces a level: a deep answer's mirror is much longer than its content)."""
    import pydantic_core

    return len(pydantic_core.to_json(result)) + len(pydantic_core.to_json(result, indent=2))

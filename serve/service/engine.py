"""The warm engine: one open Lake per project and one embedder per model, shared by requests.

Outside the service (no cache installed) `open_lake` opens a fresh Lake, today's behaviour.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxlake.schemas.config import EmbedSettings, Settings
    from ctxlake.serve.api.code_lake import Lake
    from ctxlake.tasks.embedder_base import Embedder


def _state_stamp(lake_dir: Path) -> tuple[float, int] | None:
    """Changes whenever an index run commits (it rewrites the lake's state file)."""
    from ctxlake.tasks.lake import STATE_FILE

    try:
        st = (lake_dir / STATE_FILE).stat()
    except OSError:
        return None
    return st.st_mtime, st.st_size


class EngineCache:
    """Lakes by (root, settings); embedders by model id; idle lakes evicted after `idle_evict_s`."""

    def __init__(self, idle_evict_s: float = 1800.0) -> None:
        self.idle_evict_s = idle_evict_s
        self._lock = threading.Lock()
        self._lakes: dict[tuple[str, str], tuple[Any, Lake, float]] = {}
        self._embedders: dict[str, Embedder] = {}
        self._evict_s: dict[tuple[str, str], float] = {}  # per project: its [service] idle_evict_s

    def embedder(self, settings: Settings) -> Embedder:
        return self.embedder_for(settings.embed, settings.models_dir)

    def embedder_for(self, embed: EmbedSettings, models_dir: Path) -> Embedder:
        """One loaded embedder per model settings, shared by queries, watchers and flow runs."""
        from ctxlake.tasks.embedders import build_embedder

        key = f"{models_dir}|{embed.model_dump_json()}"
        with self._lock:
            found = self._embedders.get(key)
        if found is not None:
            return found
        made = build_embedder(embed, models_dir)  # local models serialise their own encoding
        with self._lock:
            return self._embedders.setdefault(key, made)

    def lake(self, settings: Settings) -> Lake:
        from ctxlake.serve.api.code_lake import Lake

        key = (str(settings.root), settings.model_dump_json())
        stamp = _state_stamp(settings.lake_dir)
        with self._lock:
            hit = self._lakes.get(key)
            if hit is not None and hit[0] == stamp:
                self._lakes[key] = (stamp, hit[1], time.monotonic())
                return hit[1]
        # A new index run committed (or first use): reopen, keeping the loaded model and the
        # vectors held in memory (only rows changed since are read again).
        lake = Lake(settings)
        lake.keep_vectors(like=hit[1] if hit is not None else None)
        try:
            lake._embedder = self.embedder(settings)
            lake._check_model(lake._embedder)
        except Exception:  # a model mismatch surfaces on the first semantic query, as in-process
            lake._embedder = None
        with self._lock:
            self._lakes[key] = (stamp, lake, time.monotonic())
            self._evict_s[key] = settings.service.idle_evict_s
        return lake

    def evict_idle(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            gone = [k for k, (_, _, used) in self._lakes.items()
                    if now - used > self._evict_s.get(k, self.idle_evict_s)]
            for key in gone:
                del self._lakes[key]
                self._evict_s.pop(key, None)
        return [root for root, _ in gone]

    def projects(self) -> list[str]:
        with self._lock:
            return sorted({root for root, _ in self._lakes})


_active: EngineCache | None = None


def install(cache: EngineCache) -> None:
    """Make `cache` this process's engine: lakes for the read side, models for every flow run too."""
    from ctxlake.tasks.embedders import share_embedders

    global _active
    _active = cache
    share_embedders(cache.embedder_for)
    _one_blas_thread()


def _one_blas_thread() -> None:
    """Keep numpy's BLAS to one thread in this process. The service answers many requests at once,
    and a second BLAS thread per query only spins: the matrix scan of a django query (held
    vectors) took 2.9 ms on two threads and 5.7 ms of CPU, against 5.4 ms on one, and a hybrid
    query's CPU fell from 40 to 26 ms with the limit."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def active() -> EngineCache | None:
    return _active


def open_lake(settings: Settings) -> Lake:
    """The project's Lake: the service's warm one when running inside it, else a fresh one."""
    if _active is not None:
        return _active.lake(settings)
    from ctxlake.serve.api.code_lake import Lake

    return Lake(settings)

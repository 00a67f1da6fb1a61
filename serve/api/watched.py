"""Freshness of a project as the read side sees it: a walk of its files, or, in the service, what
the project's watcher says. Light on purpose (no lancedb, none of the read layer): `ctx run index`
asks it before deciding to start a flow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.tasks import freshness
from ctxlake.tasks.lake import IndexState

# The resident service's watcher of a project reports (change count, paths seen but not yet
# applied). Every write under the root reaches the watcher, and the watcher applies what it saw
# before it clears `pending`; so while the count stands still the last check holds, and once a
# check found the project up to date, the next answers follow from the watcher alone: the pending
# paths are the stale ones, none pending is up to date again. That spares the walk of the whole
# tree (0.15-0.3 s on django, most of a served `ctx search` after each edit). None: not watched
# (or the watcher stopped): look at the files every time.
WatchState = Callable[[Path], "tuple[int, frozenset[str]] | None"]
_watch_state: WatchState = lambda root: None  # noqa: E731 - the default: nothing is watched
_checked: dict[str, tuple[int, freshness.Freshness]] = {}
# A search that arrives while the watcher applies an edit waits for it this long at most, so an
# agent that saves a file and searches at once finds what it wrote. A batch that waits for another
# writer (a forced re-index) is not waited for: the answer then says which files are stale.
SETTLE_S = 1.0
Settle = Callable[[Path, float], None]
_settle: Settle = lambda root, timeout_s: None  # noqa: E731


def use_watch_state(state: WatchState, settle: Settle | None = None) -> None:
    """Let freshness checks of watched projects follow their watcher (the service calls this)."""
    global _watch_state, _settle
    _watch_state = state
    _settle = settle or (lambda root, timeout_s: None)
    _checked.clear()


def settle(root: Path, timeout_s: float = SETTLE_S) -> None:
    """Wait (up to timeout_s) for the edit the service's watcher of root is applying, if any."""
    _settle(root, timeout_s)


def watch_state(root: Path) -> tuple[int, frozenset[str]] | None:
    """What the service's watcher of `root` has seen (see WatchState); None when not watched."""
    return _watch_state(root)


def project_freshness(settings: Settings) -> freshness.Freshness:
    """The one freshness check of the read side: the project's files now against the last index
    run (the MCP server caches its result; the CLI calls it per command; in the service, a watched
    project's answer follows its watcher, see above)."""
    # The index settings are part of the key: a changed include or ignore rule (in .ctx/, which
    # the watcher does not report) changes what a walk would find.
    key = f"{settings.root}\0{settings.index.model_dump_json()}"
    seen = _watch_state(settings.root)
    if seen is None:
        return freshness.check(settings.lake_dir, PROJECT_SOURCE, settings.root, settings.index)
    count, pending = seen
    hit = _checked.get(key)
    if hit is not None and hit[0] == count:
        return hit[1]
    if hit is not None and hit[1].up_to_date:
        if pending:  # a batch under way (its journal and unfinished state are the watcher's own)
            return freshness.Freshness(False, f"{len(pending)} file(s) changed since the last run",
                                       freshness.Diff([], sorted(pending), []))
        if _lake_settled(settings):
            _checked[key] = (count, hit[1])
            return hit[1]
    fresh = freshness.check(settings.lake_dir, PROJECT_SOURCE, settings.root, settings.index)
    # Kept only when taken at rest: a walk during a batch sees the watcher's own half-written run,
    # and in place of an up-to-date answer it would make every later one walk again.
    if not pending and _watch_state(settings.root) == seen:
        _checked[key] = (count, fresh)
    return fresh


def _lake_settled(settings: Settings) -> bool:
    """No run of another writer is half done (a forced re-index, an unfinished crash) and nothing
    waits for vectors: the cases where the watcher alone does not say how fresh the lake is."""
    state = IndexState.read(settings.lake_dir)
    return (state is not None and state.clean and not state.pending_vectors
            and PROJECT_SOURCE not in freshness.read_journal(settings.lake_dir))

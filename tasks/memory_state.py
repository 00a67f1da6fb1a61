"""Freshness of conversation memory (would `ctx run ingest` do anything?) and the run journal; no Prefect, no lancedb."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ctxlake.schemas.config import Settings
from ctxlake.tasks.lake import IndexState, write_atomic
from ctxlake.tasks.scrape import STATE_FILE, Plan, ScrapeState, plan
from ctxlake.tasks.scrape.base import stat_fingerprint
from ctxlake.tasks.upkeep import OPTIMIZE_ELSEWHERE_ENV

FOLDERS = {"decision": "decisions", "error": "errors", "insight": "insights"}
MANIFEST_FILE = "knowledge_state.json"  # in the project lake: what the last ingest stored
JOURNAL_FILE = "touched.json"  # sessions whose messages changed but whose summaries are not written yet


@dataclass
class IngestCheck:
    up_to_date: bool
    reason: str
    plan: Plan
    state: ScrapeState
    knowledge_changed: bool
    seconds: float
    state_key: tuple[int, int, int] | None = None  # the positions file's (inode, size, mtime) when read


def embed_key(settings: Settings) -> str:
    """The embedding settings as text (the API key is excluded): equal keys mean an equal model id."""
    return settings.embed.model_dump_json()


def configured_model_id(settings: Settings) -> str:
    """The model id the settings name; read from the last run when its settings were the same, so
    a no-op check does not import the embedders (numpy, ~0.2 s)."""
    state = IndexState.read(settings.memory_dir)
    if state is not None and state.last_run and state.last_run.get("embed_settings") == embed_key(settings):
        return state.model_id
    from ctxlake.tasks.embedders import make_embedder

    return make_embedder(settings.embed, settings.models_dir).model_id


# The saved positions of every log file (22 MB at 20,000 sessions: ~0.5 s to parse and build),
# kept in this process while their file is unchanged. The service checks before every ingest it
# is asked for and then runs it: a one-session ingest there read the file twice and walked the log
# folders twice, about 45% of its 4.2 s (py-spy). Checks only read a kept state; a run takes it
# (no one else sees it while its positions advance) and gives it back after its last save. A run
# that fails gives nothing back: the next reader loads the file.
_kept: dict[Path, tuple[tuple[int, int, int], ScrapeState]] = {}
_kept_lock = threading.Lock()
# The check a caller made just before starting a run in the same thread (`planned`), so the run
# can use its plan instead of walking the log folders again.
_handed = threading.local()


def _file_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _saved_positions(memory_dir: Path) -> tuple[ScrapeState, tuple[int, int, int] | None]:
    """The saved positions, for reading only (a check): the kept ones while the file is unchanged;
    with the file's key they were read at (None: no file yet)."""
    path = memory_dir / STATE_FILE
    key = _file_key(path)
    with _kept_lock:
        hit = _kept.get(path)
        if key is not None and hit is not None and hit[0] == key:
            return hit[1], key
    state = ScrapeState.load(memory_dir)
    if key is not None and key == _file_key(path):
        with _kept_lock:
            _kept[path] = (key, state)
    return state, key


def take_positions(memory_dir: Path, roots: dict[str, list[Path]]) -> tuple[ScrapeState, Plan | None]:
    """The saved positions for a run to advance, and the plan of the check this thread handed
    over (`planned`) if that check read these same positions for these roots."""
    path = memory_dir / STATE_FILE
    key = _file_key(path)
    with _kept_lock:
        hit = _kept.pop(path, None)
    handed: IngestCheck | None = getattr(_handed, "check", None)
    if handed is not None and handed.state_key == key and getattr(_handed, "roots", None) == _roots_key(roots):
        return handed.state, handed.plan
    if key is not None and hit is not None and hit[0] == key:
        return hit[1], None
    return ScrapeState.load(memory_dir), None


def keep_positions(memory_dir: Path, state: ScrapeState) -> None:
    """Give back the positions a run took, once it has saved them."""
    path = memory_dir / STATE_FILE
    key = _file_key(path)
    if key is not None:
        with _kept_lock:
            _kept[path] = (key, state)


@contextmanager
def planned(fresh: IngestCheck, roots: dict[str, list[Path]]) -> Iterator[None]:
    """Within this block, a run started by this thread may use `fresh`'s plan (see take_positions)."""
    _handed.check, _handed.roots = fresh, _roots_key(roots)
    try:
        yield
    finally:
        _handed.check = _handed.roots = None


def _roots_key(roots: dict[str, list[Path]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(sorted((name, tuple(str(p) for p in paths)) for name, paths in roots.items()))


def check(settings: Settings, roots: dict[str, list[Path]], model_id: str) -> IngestCheck:
    """Stat every store file and knowledge file against what the last run saved; open none."""
    started = time.perf_counter()
    scrape_state, key = _saved_positions(settings.memory_dir)
    found = plan(roots, scrape_state)
    knowledge = manifest_changed(settings.lake_dir, settings.knowledge_dir, model_id)
    state = IndexState.read(settings.memory_dir)
    if state is None:
        reason = "nothing ingested yet"
    elif not state.clean:
        reason = "the last run did not finish"
    elif state.model_id != model_id:
        reason = f"vectors were made with {state.model_id}, the configuration says {model_id}"
    elif found.changed_files:
        reason = f"{found.changed_files} log file(s) changed"
    elif knowledge:
        reason = "knowledge files changed"
    elif state.pending_vectors:
        reason = f"{state.pending_vectors} row(s) still to embed"
    elif state.unoptimized_rows and os.environ.get(OPTIMIZE_ELSEWHERE_ENV) != "1":
        reason = f"{state.unoptimized_rows} row(s) written in the service, whose compaction is left to a run like this"
    else:
        return IngestCheck(True, "up to date", found, scrape_state, False, time.perf_counter() - started, key)
    return IngestCheck(False, reason, found, scrape_state, knowledge, time.perf_counter() - started, key)


# -- the journal: sessions with committed messages whose summaries a crash may have left undone ----


def read_touched(memory_dir: Path) -> set[tuple[str, str]]:
    try:
        data = json.loads((memory_dir / JOURNAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return {(str(t), str(s)) for t, s in data} if isinstance(data, list) else set()


def write_touched(memory_dir: Path, touched: set[tuple[str, str]]) -> None:
    write_atomic(memory_dir / JOURNAL_FILE, json.dumps(sorted(touched)))


def clear_touched(memory_dir: Path) -> None:
    (memory_dir / JOURNAL_FILE).unlink(missing_ok=True)


# -- knowledge files: what the last ingest saw -------------------------------------------------


def knowledge_files(knowledge_dir: Path) -> list[tuple[str, Path]]:
    """(type, path) of every accepted record; the inbox holds proposals and is not ingested."""
    found = []
    for kind, folder in FOLDERS.items():
        base = knowledge_dir / folder
        if base.is_dir():
            found += [(kind, p) for p in sorted(base.glob("*.md")) if not p.name.startswith(".")]
    return found


def fingerprints(knowledge_dir: Path) -> dict[str, list[int]]:
    out = {}
    for _, path in knowledge_files(knowledge_dir):
        fp = stat_fingerprint(path)
        if fp is not None:
            out[str(path)] = list(fp)
    return out


def manifest_changed(lake_dir: Path, knowledge_dir: Path, model_id: str) -> bool:
    """True when the knowledge files (or the model) differ from what the last ingest stored."""
    try:
        saved = json.loads((lake_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return bool(knowledge_files(knowledge_dir))
    return saved.get("model_id") != model_id or saved.get("files") != fingerprints(knowledge_dir)


def save_manifest(lake_dir: Path, knowledge_dir: Path, model_id: str) -> None:
    write_atomic(lake_dir / MANIFEST_FILE, json.dumps({"model_id": model_id, "files": fingerprints(knowledge_dir)}))


# -- the project paths the messages table holds ----------------------------------------------------

PROJECTS_FILE = "projects.json"


def read_project_paths(memory_dir: Path) -> set[str] | None:
    """Every project_path the messages and sessions tables hold, as the ingests recorded them;
    None for a lake written before they did (or an unreadable file)."""
    try:
        data = json.loads((memory_dir / PROJECTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    paths = data.get("paths") if isinstance(data, dict) else None
    return {str(p) for p in paths} if isinstance(paths, list) else None


def write_project_paths(memory_dir: Path, paths: set[str]) -> None:
    write_atomic(memory_dir / PROJECTS_FILE, json.dumps({"paths": sorted(paths)}))


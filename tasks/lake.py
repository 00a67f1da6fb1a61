"""Opening the lake: LanceDB connections and tables, shared by the write and the read side (no Prefect)."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxlake.errors import LakeError, ModelMismatchError, NotIndexedError

if TYPE_CHECKING:
    import threading

    import lancedb
    from lancedb.table import Table

    from ctxlake.tasks.embedder_base import Embedder

FILES_TABLE = "files"
CHUNKS_TABLE = "chunks"
# The symbol graph's tables (written by tasks/graph_store.py). `references` is a reserved word in
# SQL: `ctx sql` could not name the table without quotes.
DEFINITIONS_TABLE = "definitions"
REFERENCES_TABLE = "refs"
IMPORTS_TABLE = "imports"
STATE_FILE = "state.json"
STATE_DAMAGED_HINT = "`ctx run index --force` rebuilds the lake and its state (or `ctx clean --yes`, then `ctx run index`)"
WRITER_LOCK_FILE = "writer.lock"


def _skip_unused_rest_client() -> None:
    """Register lancedb's generated REST client package without running its __init__.

    `import lancedb` pulls in `lance_namespace_urllib3_client`, whose __init__ imports ~200
    generated API modules (1.2 s of a 2.3 s import) that only remote namespaces use. Local tables
    need its `models` subpackage alone, which still imports normally on demand. This halves the
    start-up of every `ctx search`; if the layout ever changes we simply import as usual.
    (Loading the models lazily as well was measured too: no gain, lance_namespace touches most.)
    """
    name = "lance_namespace_urllib3_client"
    if name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    stub = types.ModuleType(name)
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__spec__ = spec
    stub.__file__ = spec.origin
    sys.modules[name] = stub


def import_lancedb() -> types.ModuleType:
    if "lancedb" not in sys.modules:
        _skip_unused_rest_client()
        # Lance's Rust side logs warnings (deprecations, "dataset will be created") to stderr;
        # keep the CLI's stderr for our own messages unless a user asks for them.
        os.environ.setdefault("LANCEDB_LOG", "error")
        os.environ.setdefault("LANCE_LOG", "error")  # the same for pylance (memory tables' compaction)
    import lancedb

    return lancedb


def connect(
    lake_dir: Path, *, create: bool = False, read_consistency: timedelta | None = None, what: str = "the lake"
) -> lancedb.DBConnection:
    """A connection to the lake folder; `create` makes it, else a missing lake is NotIndexedError.

    `read_consistency` makes long-lived readers pick up versions committed after they opened a
    table (lancedb otherwise keeps reading the version it opened). `what` names the folder in an
    error (the embedding cache is a LanceDB folder too).
    """
    if not lake_dir.is_dir():
        if not create:
            raise NotIndexedError(
                f"no index at {lake_dir}", hint="run `ctx run index` in the project first"
            )
        try:
            lake_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LakeError(f"cannot create {what} at {lake_dir}: {exc.strerror}") from exc
    return import_lancedb().connect(str(lake_dir), read_consistency_interval=read_consistency)


def table_names(db: lancedb.DBConnection) -> set[str]:
    return set(db.list_tables().tables)


def open_table(db: lancedb.DBConnection, name: str) -> Table | None:
    return db.open_table(name) if name in table_names(db) else None


@dataclass
class IndexState:
    """What the last run of a lake recorded; read without importing lancedb (`state.json`).

    `clean` is False from the moment a run starts writing until it has finished: a reader or the
    next run then knows a crash may have left work undone and does not trust the fast no-op path.
    """

    provider: str = ""
    model: str = ""
    model_id: str = ""
    dims: int = 0
    clean: bool = False
    last_run: dict[str, Any] | None = None  # the project's own last run (`ctx run index`, a watcher batch)
    source_runs: dict[str, dict[str, Any]] | None = None  # source -> its last run (`ctx add`, `ctx update`)
    roots: dict[str, str] | None = None  # source -> Merkle root hash at the last clean run
    pending_vectors: int = 0
    fts: str = ""  # the BM25 index options of the last run (store.FTS_TAG); empty before they were recorded
    unoptimized_rows: int = 0  # chunk rows written since the lake was last optimized

    @classmethod
    def read(cls, lake_dir: Path) -> IndexState | None:
        path = lake_dir / STATE_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LakeError(f"cannot read {path}: {exc}", hint=STATE_DAMAGED_HINT) from exc
        if not isinstance(data, dict):
            raise LakeError(f"cannot read {path}: not a JSON object", hint=STATE_DAMAGED_HINT)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @classmethod
    def read_or_none(cls, lake_dir: Path) -> IndexState | None:
        """The state, or None when state.json is missing or unreadable (`ctx run index --force`
        rebuilds the lake whatever it says)."""
        try:
            return cls.read(lake_dir)
        except LakeError:
            return None

    def write(self, lake_dir: Path) -> None:
        write_atomic(lake_dir / STATE_FILE, json.dumps(self.__dict__, indent=2, default=str))


def missing_tables(lake_dir: Path, graph: bool) -> list[str]:
    """The tables an indexed lake must hold that are not on disk (a deleted `chunks.lance`): a run
    cannot be a no-op then, and rebuilds them. Read from the folder, without importing LanceDB."""
    wanted = [FILES_TABLE, CHUNKS_TABLE, *((DEFINITIONS_TABLE, REFERENCES_TABLE, IMPORTS_TABLE) if graph else ())]
    return [name for name in wanted if not (lake_dir / f"{name}.lance").is_dir()]


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a temp file and rename, so a reader or a crash never sees half a file.

    The temp file is a new one (mkstemp: a link planted at any name cannot redirect the write),
    and it takes the mode the file had, or the one a plain write would give a new file: mkstemp's
    0600 made a user's `.gitignore`, AGENTS.md or knowledge record private after one write.
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    mode = file_mode(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        # A full or forbidden disk gets the hint every face gives it; anything else (a folder gone
        # or a file where it should be) is the folder's fault.
        hint = STORAGE_HINT if exc.errno in STORAGE_ERRNOS else (
            f"check that {path.parent} is a folder you can write to, then run the command again")
        raise LakeError(f"cannot write {path}: {exc.strerror or exc}", hint=hint) from exc
    finally:
        if tmp is not None:  # failed or interrupted: half a copy on a full disk holds the space to free
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def file_mode(path: Path) -> int:
    """`path`'s permission bits, or, for a file not there yet, what this process's umask gives a new one."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux says it without changing it (setting it, even for a moment, races other threads)
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_empty_folders(folder: Path, root: Path) -> None:
    """Remove `folder` and then its parents while they are empty, stopping at `root` (kept): what a
    generated file's removal leaves behind (`.cursor/`, `.claude/skills/NAME/`) goes with it."""
    root = root.resolve()
    folder = folder.resolve()
    while folder != root and folder.is_relative_to(root):
        try:
            folder.rmdir()  # only ever an empty folder
        except OSError:
            return
        folder = folder.parent


class WriterLock:
    """One writer per lake: an flock on `.ctx/lake/writer.lock` holding the owner's pid.

    The kernel drops an flock when its process dies, so a lock left by a killed indexer is free
    at once; the pid and start time written inside only make "busy" messages useful.
    """

    def __init__(self, lake_dir: Path, purpose: str = "ctx run index") -> None:
        self.path = lake_dir / WRITER_LOCK_FILE
        self.purpose = purpose
        self._fd: int | None = None
        self.took_over_from: int | None = None

    def owner(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8") or "{}")
            return data
        except (OSError, ValueError):
            return {}

    def acquire(self, wait_s: float = 0.0, cancel: threading.Event | None = None) -> WriterLock:
        """Take the lock, waiting up to `wait_s` (may be math.inf) for its holder; LockBusyError
        when that runs out or `cancel` is set meanwhile."""
        import fcntl
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LakeError(f"cannot open {self.path}: {exc.strerror}") from exc
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline or (cancel is not None and cancel.is_set()):
                    os.close(fd)
                    from ctxlake.errors import LockBusyError

                    owner = self.owner()
                    who = f"pid {owner.get('pid', '?')} ({owner.get('purpose', 'an indexer')}, since {owner.get('since', '?')})"
                    raise LockBusyError(
                        f"another writer holds the lake: {who}",
                        hint="wait for it to finish, or pass --wait SECONDS",
                    ) from None
                if cancel is not None:
                    cancel.wait(0.2)
                else:
                    time.sleep(0.2)
        previous = self.owner().get("pid")
        if isinstance(previous, int) and previous != os.getpid() and not pid_alive(previous):
            self.took_over_from = previous
        self._fd = fd  # held from here: release() must find it whatever fails below
        # The owner record only makes "busy" messages useful. A full disk must not fail the taking
        # (it left the descriptor, and the lock, held by a long-lived service for good): the run
        # goes on to report the disk itself.
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "purpose": self.purpose,
                                     "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode())
        except OSError:
            pass
        return self

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fd, self._fd = self._fd, None
            try:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def held_by_other(self) -> dict[str, Any] | None:
        """The owner's record if another live process holds the lock (used by `ctx status`)."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return self.owner() or {"pid": None}
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def __enter__(self) -> WriterLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def pid_alive(pid: int) -> bool:
    """Whether a process still runs; a zombie (exited, not yet reaped by its parent, as a killed
    child of a living service is for a moment) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# Where Lance's Rust side raised, appended to its messages (", <cargo home>/registry/src/.../x.rs:258:9",
# "/rustc/<hash>/library/core/src/ops/function.rs:250:5"): noise to a user, left out of what we show.
_RUST_LOCATION = re.compile(r",?\s*/\S+\.rs:\d+:\d+")
# What the machine lacks, as opposed to what a file lacks: errors a retry after fixing the cause
# cures, which must never count as a damaged table (moving a cache aside for a full disk loses it).
_RESOURCE_ERRNOS = frozenset([errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EMFILE,
                              errno.ENFILE, errno.ENOMEM])
_RESOURCE_WORDS = ("No space", "ermission denied", "Read-only file system", "Too many open files",
                   "Disk quota", "Cannot allocate memory", "os error 28", "os error 13", "os error 30")


def lance_message(exc: BaseException) -> str:
    """An error from LanceDB as one line a user can read: its first line, without Rust source locations."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _RUST_LOCATION.sub("", text)[:300]


def resource_error(exc: BaseException) -> bool:
    """Disk full, no permission, read-only, out of file handles: the machine's state, not damage."""
    if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
        return True
    cause = exc.__cause__
    return any(word in str(exc) for word in _RESOURCE_WORDS) or (cause is not None and resource_error(cause))


# How Lance says a table's files cannot be read: a truncated data file ("failed to fill whole
# buffer"), lost manifests ("Table 'chunks' was not found"), an index's files gone ("Not found:
# .../_indices/<uuid>/tokens.lance"). Matched on the text: Lance raises plain RuntimeError,
# ValueError and OSError.
_LANCE_MARKERS = ("lance error", "LanceError", "was not found", "Not found:", "not found:", "Dataset at path",
                  "corrupt", "failed to fill whole buffer")
_TABLE_IN_PATH = re.compile(r"/([A-Za-z0-9_]+)\.lance(?:/|\b)")
_TABLE_NAMED = re.compile(r"Table '([^']+)' was not found")


def lance_failure(exc: BaseException) -> LakeError | None:
    """A Lance error that says the lake's files are damaged -> one LakeError naming the table and
    how to rebuild it; None for anything else (a bug keeps its traceback). The single place the
    read side (CLI, MCP tools) turns Lance's errors into ours."""
    if isinstance(exc, LakeError) or not isinstance(exc, (RuntimeError, ValueError, OSError)):
        return None
    text = str(exc)
    if not any(marker in text for marker in _LANCE_MARKERS) or resource_error(exc):
        return None
    named = _TABLE_NAMED.search(text)
    in_path = [m for m in _TABLE_IN_PATH.findall(text) if m not in ("data", "_indices")]
    table = named.group(1) if named else (in_path[0] if in_path else None)
    if table is not None and table.startswith("emb_"):
        return LakeError(f"the embedding cache table {table} cannot be read: {lance_message(exc)}",
                         hint="the next `ctx run index` moves it aside; or delete it, it is rebuilt as files are embedded")
    what = "index files" if "/_indices/" in text else "table"
    where = f"the lake's {table} {what}" if table else "a table of the lake"
    return LakeError(f"{where} cannot be read: {lance_message(exc)}", hint=DAMAGED_HINT)


# What the machine's disk refuses, in the words every face shows (the CLI, the web UI).
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
STORAGE_HINT = "free space or fix permissions, then run the command again; the next run repairs a half-written lake"


def storage_errno(exc: BaseException) -> int | None:
    """The STORAGE_ERRNOS errno of the first OSError in `exc`'s chain, else None. Lance and Arrow
    wrap the errno in their own exceptions, and write_atomic in a LakeError, so the chain is searched."""
    found = _storage_oserror(exc)
    return found.errno if found is not None else None


def storage_failure(exc: BaseException) -> LakeError | None:
    """A full, read-only or forbidden disk under any layer (Lance, Arrow, Prefect) -> one LakeError
    naming it and the file; None for anything else."""
    found = _storage_oserror(exc)
    if found is None or found.errno is None:
        return None
    where = f": {found.filename}" if found.filename else ""
    return LakeError(f"storage error, {STORAGE_ERRNOS[found.errno]}{where}", hint=STORAGE_HINT)


def lake_failure(exc: BaseException) -> LakeError | None:
    """The LakeError an OSError, RuntimeError or ValueError from any layer stands for: a full or
    forbidden disk, else a damaged lake; None for anything else (a bug). The one rule the CLI, the
    MCP tools and the web UI share."""
    return storage_failure(exc) or lance_failure(exc)


# How Lance words the same errors in a RuntimeError's text (no errno attached), e.g.
# "lance error: LanceError(IO): No space left on device": a full disk while writing messages
# ended `ctx run ingest` in a 119-line traceback.
_STORAGE_TEXT = ((errno.ENOSPC, ("No space left on device", "os error 28")),
                 (errno.EDQUOT, ("Disk quota exceeded", "os error 122")),
                 (errno.EROFS, ("Read-only file system", "os error 30")),
                 (errno.EACCES, ("Permission denied", "os error 13")))


def _storage_oserror(exc: BaseException) -> OSError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current
        if isinstance(current, RuntimeError | ValueError):
            text = str(current)
            for code, words in _STORAGE_TEXT:
                if any(word in text for word in words):
                    return OSError(code, STORAGE_ERRNOS[code])
        current = current.__cause__ or current.__context__
    return None


WRITE_FAILED_HINT = "the previous index stays readable; fix the cause and re-run"
COLD_WRITE_FAILED_HINT = "nothing was indexed yet; fix the cause and re-run"
DAMAGED_HINT = "`ctx run index --force` rebuilds it"


@contextlib.contextmanager
def writing(what: str) -> Iterator[None]:
    """Turn an I/O failure while writing the lake (disk full, permission denied, a damaged file)
    into one LakeError that says what was being written. Lance reports I/O errors as OSError or
    as a RuntimeError carrying the OS message; anything else is a bug and propagates as is."""
    try:
        yield
    except LakeError:
        raise
    except (OSError, RuntimeError) as exc:
        text = str(exc)
        if isinstance(exc, RuntimeError) and not any(m in text for m in ("IO", "Io", "os error", "No space", "ermission")):
            raise
        reason = (exc.strerror if isinstance(exc, OSError) else None) or lance_message(exc)
        # A full disk leaves the tables as they were; a file Lance cannot read is damage, which
        # re-running does not cure.
        hint = WRITE_FAILED_HINT if resource_error(exc) else DAMAGED_HINT
        raise LakeError(f"cannot write {what}: {reason}", hint=hint) from exc


def check_model(state: IndexState | None, embedder: Embedder, force: bool) -> bool:
    """True when the lake must be rebuilt for another model (only allowed with force)."""
    if state is None or not state.model_id or state.model_id == embedder.model_id:
        return False
    if force:
        return True
    raise ModelMismatchError(
        f"index was built with {state.model_id}, config says {embedder.model_id}",
        hint="run `ctx run index --force` to rebuild it with the configured model",
    )


def reset_lake(lake_dir: Path) -> None:
    """Drop every table and snapshot of the lake (a model change invalidates all vectors)."""
    for child in lake_dir.iterdir() if lake_dir.exists() else ():
        if child.name == WRITER_LOCK_FILE:
            continue
        shutil.rmtree(child) if child.is_dir() else child.unlink()

"""Knowledge stage: .ctx/knowledge/{decisions,errors,insights}/*.md <-> KNOWLEDGE rows; writes with duplicate/supersede checks."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import xxhash
import yaml

from ctxlake.errors import InputError
from ctxlake.schemas.registry import dump_yaml, load_yaml
from ctxlake.schemas.roots import CTX_DIR
from ctxlake.schemas.tables import KNOWLEDGE, KNOWLEDGE_TYPES, with_vector_width
from ctxlake.tasks.lake import write_atomic
from ctxlake.tasks.memory_state import FOLDERS, knowledge_files
from ctxlake.tasks.memory_store import content_hash
from ctxlake.tasks.redact import redact_strings, redact_text
from ctxlake.tasks.safe_io import TooLarge, open_inside, project_path
from ctxlake.tasks.scrape.base import parse_ts
from ctxlake.tasks.stage import stage

if TYPE_CHECKING:
    from lancedb.table import Table

    from ctxlake.tasks.embed_cache import EmbeddingCache
    from ctxlake.tasks.embedder_base import Embedder

INBOX = "inbox"
SCALAR_KEYS = ("id", "type", "title", "created_at", "supersedes", "source_tool", "source_session")
FRONT = re.compile(r"\A---\s*\n(?P<front>.*?)\n---\s*\n?(?P<body>.*)\Z", re.S)
WriteStatus = Literal["created", "superseded", "duplicate"]
# What one record written by a person or an agent may hold (`ctx remember`, the MCP save_* tools, the UI):
# a record is read back whole by project_knowledge and the Knowledge page, so a 10 MB body would be a 10 MB
# answer. A title is a line; details go in the body; the rest is a short list.
TITLE_MAX_CHARS = 200
BODY_MAX_CHARS = 20_000
LIST_MAX_ITEMS = 50  # files, tags
ITEM_MAX_CHARS = 500  # one file path or tag; the source tool and session too
# A record file read (a hand-written one may be long: the UI shows it shortened); a bigger one, or an
# endless one, is skipped and named in the ingest's problems.
MAX_RECORD_BYTES = 16 << 20


@dataclass
class Record:
    """One knowledge file: front matter + markdown body."""

    id: str
    type: str
    title: str
    body: str
    created_at: datetime
    path: str  # relative to the project root
    supersedes: str | None = None
    source_tool: str | None = None
    source_session: str | None = None
    files: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return f"{self.title}\n\n{self.body}".strip()


def check_size(title: str, body: str, files: Sequence[str] = (), tags: Sequence[str] = (),
               source_tool: str | None = None, source_session: str | None = None) -> None:
    """InputError naming the first field over the limits above (its size and the limit)."""
    if len(title) > TITLE_MAX_CHARS:
        raise InputError(f"the title is {len(title):,} characters; at most {TITLE_MAX_CHARS} are allowed",
                         hint="keep the title to one line and put the details in the body")
    if len(body) > BODY_MAX_CHARS:
        raise InputError(f"the body is {len(body):,} characters; at most {BODY_MAX_CHARS:,} are allowed",
                         hint="record the gist and name the files that hold the rest")
    for name, values in (("files", files), ("tags", tags)):
        if len(values) > LIST_MAX_ITEMS:
            raise InputError(f"{len(values)} {name}; at most {LIST_MAX_ITEMS} are allowed")
        long = next((v for v in values if len(v) > ITEM_MAX_CHARS), None)
        if long is not None:
            raise InputError(f"one of the {name} is {len(long):,} characters; at most {ITEM_MAX_CHARS} are allowed")
    for name, value in (("source_tool", source_tool), ("source_session", source_session)):
        if value is not None and len(value) > ITEM_MAX_CHARS:
            raise InputError(f"{name} is {len(value):,} characters; at most {ITEM_MAX_CHARS} are allowed")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def plain_text(title: str, body: str) -> tuple[str, str]:
    """The title as one line without control characters (`ctx knowledge` printed a BEL or an escape
    sequence as it was), the body trimmed; in both, undecodable bytes of an argument or of stdin
    (lone surrogates) become U+FFFD: the embedder refused them with a TypeError traceback."""
    title, body = _without_surrogates(title), _without_surrogates(body)
    return " ".join(_CONTROL.sub(" ", title).split()), body.strip()


def _without_surrogates(value: str) -> str:
    try:  # an undecodable byte as Python escaped it (U+DC80-U+DCFF): one U+FFFD for it
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # any other lone surrogate
        raw = value.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


def project_refs(files: Sequence[str], tags: Sequence[str], root: Path,
                 base: Path | None = None) -> tuple[list[str], list[str]]:
    """Files as project-relative POSIX paths and tags as one-line words, each once; InputError for
    a file outside the project (`/etc/passwd`, `../../x`) or a tag with a line break: a record names
    this project's files, and its tags are listed one per line. A relative file is read from
    `base` when given (the CLI's current folder, like every path a shell user types), else from
    the root (agents and the UI name files by their project path)."""
    out = [project_path(f, root, base) for f in files]
    for t in tags:
        if not t.strip() or any(ord(c) < 32 for c in t):
            raise InputError(f"tag {t!r} is empty or holds a line break or control character",
                             hint="a tag is one short word or phrase")
    return list(dict.fromkeys(out)), list(dict.fromkeys(t.strip() for t in tags))


def record_id(kind: str, when: datetime, text: str) -> str:
    return f"{kind}-{when:%Y%m%d}-{xxhash.xxh3_64_hexdigest(text.encode())[:8]}"


def _read_record(path: Path, root: Path) -> str:
    """A record's text, read without leaving the project's knowledge folder (or, for a file
    elsewhere, its own folder): a clone's `decisions/x.md -> ~/.ssh/id_rsa` would otherwise be
    ingested and served to every agent, and a FIFO there hung the ingest."""
    base = root / CTX_DIR / "knowledge"
    if not path.is_relative_to(base):
        base = path.parent
    try:
        data = open_inside(base, path.relative_to(base).as_posix(), MAX_RECORD_BYTES, what="knowledge file")
    except TooLarge as exc:
        raise InputError(f"{path}: larger than {MAX_RECORD_BYTES // 1024} KiB; not read as a record") from exc
    except InputError as exc:  # a link out of the folder, a FIFO or device
        raise InputError(f"{path}: {exc.message}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text") from exc


# Records parsed before, by file and stat fingerprint. The MCP tools and the UI read every record
# file (and the inbox) on each call, and front matter costs about a millisecond a file to parse:
# project_knowledge with 42 inbox proposals took 46 ms of CPU a call in the service. A write
# (write_atomic) makes a new file, so the inode alone tells most changes; size and mtime the rest.
_PARSED: dict[tuple[str, str, str | None], tuple[tuple[int, int, int, int], Record]] = {}
PARSED_MAX = 4096


def parse_record(path: Path, root: Path, kind_hint: str | None = None) -> Record:
    """A knowledge markdown file -> Record (a copy: callers may change it); InputError says what is
    wrong with it."""
    key = (str(path), str(root), kind_hint)
    try:
        info = os.stat(path)
        stamp: tuple[int, int, int, int] | None = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    except OSError:
        stamp = None
    hit = _PARSED.get(key)
    if stamp is not None and hit is not None and hit[0] == stamp:
        return replace(hit[1], files=list(hit[1].files), tags=list(hit[1].tags))
    record = _parse_record(path, root, kind_hint)
    if stamp is not None:
        if len(_PARSED) >= PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = (stamp, replace(record, files=list(record.files), tags=list(record.tags)))
    return record


def _parse_record(path: Path, root: Path, kind_hint: str | None) -> Record:
    raw = _read_record(path, root)
    match = FRONT.match(raw)
    front: dict[str, Any] = {}
    body = raw
    if match:
        try:
            loaded = load_yaml(match.group("front")) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: front matter is not valid YAML ({str(exc).splitlines()[0]})") from exc
        if not isinstance(loaded, dict):
            raise InputError(f"{path}: front matter is not a mapping")
        front, body = loaded, match.group("body")
    for key in SCALAR_KEYS:  # str() of a list or mapping would make a nonsense id, title or link
        if isinstance(front.get(key), list | dict):
            raise InputError(f"{path}: {key} must be a single value, got a {type(front[key]).__name__}")
    kind = str(front.get("type") or kind_hint or "")
    if kind not in KNOWLEDGE_TYPES:
        raise InputError(f"{path}: type must be one of {', '.join(KNOWLEDGE_TYPES)}, got {kind!r}")
    body = body.strip()
    title = str(front.get("title") or "").strip()
    if not title:
        first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
        title = first.lstrip("#").strip() or path.stem
    created = front.get("created_at")
    when = created if isinstance(created, datetime) else parse_ts(str(created)) if created else None
    if when is None:
        when = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    elif when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return Record(
        id=str(front.get("id") or path.stem), type=kind, title=title, body=body, created_at=when,
        path=path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path),
        supersedes=str(front["supersedes"]) if front.get("supersedes") else None,
        source_tool=str(front["source_tool"]) if front.get("source_tool") else None,
        source_session=str(front["source_session"]) if front.get("source_session") else None,
        files=_string_list(front, "files", path), tags=_string_list(front, "tags", path),
    )


def _string_list(front: dict[str, Any], key: str, path: Path) -> list[str]:
    """A list field of the front matter; a lone string is a one-item list (`tags: ops` is written by hand)."""
    value = front.get(key)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InputError(f"{path}: {key} must be a list of strings, got {type(value).__name__} {value!r}"[:300])
    if any(isinstance(v, list | dict) for v in value):
        raise InputError(f"{path}: {key} must be a list of strings, one item is a list or mapping")
    return [str(v) for v in value if v is not None and v != ""]


def load_records(knowledge_dir: Path, root: Path) -> tuple[list[Record], list[str]]:
    """Every accepted record, and one problem line per file that could not be read (skipped)."""
    records, problems = [], []
    for kind, path in knowledge_files(knowledge_dir):
        try:
            records.append(parse_record(path, root, kind))
        except (InputError, OSError) as exc:
            problems.append(str(exc))
    return records, problems


def heads(records: Sequence[Record]) -> list[Record]:
    """Records no other record supersedes: the current state of each chain."""
    replaced = {r.supersedes for r in records if r.supersedes}
    return [r for r in records if r.id not in replaced]


def knowledge_table(records: Sequence[Record], dims: int) -> pa.Table:
    """Records -> KNOWLEDGE rows (superseded_by derived from the chains; vectors null)."""
    newer = {r.supersedes: r.id for r in sorted(records, key=lambda r: r.created_at) if r.supersedes}
    rows = [{
        "id": r.id, "type": r.type, "title": r.title, "body": r.body, "created_at": r.created_at,
        "supersedes": r.supersedes, "superseded_by": newer.get(r.id), "source_tool": r.source_tool,
        "source_session": r.source_session, "files": r.files or None, "tags": r.tags or None, "path": r.path,
        "text": r.text, "content_hash": content_hash(r.text), "vector": None,
    } for r in {r.id: r for r in records}.values()]
    return pa.Table.from_pylist(rows, schema=with_vector_width(KNOWLEDGE, dims))


@stage("ingest-knowledge")
def ingest_knowledge(table: Table, records: Sequence[Record], cache: EmbeddingCache) -> int:
    """Knowledge records -> the KNOWLEDGE table, replaced as a whole (the files are the truth); rows written."""
    from ctxlake.tasks.embed import fill_from_cache

    rows, _ = fill_from_cache(knowledge_table(records, cache.dims), cache)
    if rows.num_rows == 0:
        table.delete("true")
        return 0
    (table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
     .when_not_matched_by_source_delete().execute(rows, on_bad_vectors="null"))
    return rows.num_rows


# -- writing -------------------------------------------------------------------------------------


@dataclass
class WriteResult:
    status: WriteStatus
    id: str
    path: str | None  # the file written (None for a duplicate)
    similar_to: str | None = None  # the closest existing record of the same type
    similarity: float = 0.0


def vectors_for(texts: Sequence[str], cache: EmbeddingCache, embedder: Embedder) -> np.ndarray:
    """Unit vectors of texts, through the embedding cache."""
    hashes = [content_hash(t) for t in texts]
    found = cache.get_many(hashes)
    todo = [i for i, h in enumerate(hashes) if h not in found]
    if todo:
        fresh = embedder.embed_documents([texts[i] for i in todo])
        cache.put_many([hashes[i] for i in todo], fresh)
        for i, vec in zip(todo, fresh, strict=True):
            found[hashes[i]] = vec
    return np.stack([found[h] for h in hashes]) if hashes else np.zeros((0, cache.dims), dtype=np.float32)


def decide(text: str, existing: Sequence[Record], cache: EmbeddingCache, embedder: Embedder,
           duplicate_above: float, supersede_from: float) -> tuple[WriteStatus, Record | None, float]:
    """created / superseded / duplicate for a new text against existing records of its type."""
    # The new text is embedded even with nothing to compare: its vector waits in the cache for ingest.
    matrix = vectors_for([text, *(r.text for r in existing)], cache, embedder)
    return _closest(matrix[0], existing, matrix[1:], duplicate_above, supersede_from)


def _closest(vector: np.ndarray, existing: Sequence[Record], matrix: np.ndarray, duplicate_above: float,
             supersede_from: float) -> tuple[WriteStatus, Record | None, float]:
    if not existing:
        return "created", None, 0.0
    sims = matrix @ vector
    best = int(np.argmax(sims))
    score = float(sims[best])
    if score > duplicate_above:
        return "duplicate", existing[best], score
    if score >= supersede_from:
        return "superseded", existing[best], score
    return "created", existing[best], score


def render(record: Record) -> str:
    front: dict[str, Any] = {"id": record.id, "type": record.type, "title": record.title,
                             "created_at": record.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    for key in ("supersedes", "source_tool", "source_session"):
        if getattr(record, key):
            front[key] = getattr(record, key)
    if record.files:
        front["files"] = record.files
    if record.tags:
        front["tags"] = record.tags
    text = dump_yaml(front, sort_keys=False, allow_unicode=True).strip()
    return f"---\n{text}\n---\n\n{record.body.strip()}\n"


class ComparisonPool:
    """The records a new one is compared with (heads of the accepted records, plus the inbox for
    candidates), read and embedded once and kept current as records are written.

    One write_record call reads them itself; a run that writes many (ingest's extraction) passes
    one pool to all: reading and embedding every record again for each candidate made a cold
    ingest of 20,000 sessions spend most of its scrape phase parsing the inbox's YAML.
    """

    def __init__(self, knowledge_dir: Path, root: Path, inbox: bool) -> None:
        records, _ = load_records(knowledge_dir, root)
        self.inbox = inbox
        self._records = heads(records) + (_inbox(knowledge_dir, root) if inbox else [])
        self._by_kind: dict[str, tuple[list[Record], np.ndarray]] = {}

    def of(self, kind: str, cache: EmbeddingCache, embedder: Embedder) -> tuple[list[Record], np.ndarray]:
        if kind not in self._by_kind:
            records = [r for r in self._records if r.type == kind]
            self._by_kind[kind] = (records, vectors_for([r.text for r in records], cache, embedder))
        return self._by_kind[kind]

    def add(self, record: Record, vector: np.ndarray, replaces: Record | None) -> None:
        records, matrix = self._by_kind[record.type]
        if replaces is not None and not self.inbox:  # an accepted record is no longer a head
            keep = [i for i, r in enumerate(records) if r.id != replaces.id]
            records, matrix = [records[i] for i in keep], matrix[keep]
        self._by_kind[record.type] = ([*records, record], np.vstack([matrix, vector[None, :]]))


def write_record(
    knowledge_dir: Path, root: Path, kind: str, title: str, body: str, *, cache: EmbeddingCache, embedder: Embedder,
    duplicate_above: float, supersede_from: float, files: Sequence[str] = (), tags: Sequence[str] = (),
    source_tool: str | None = None, source_session: str | None = None, inbox: bool = False,
    when: datetime | None = None, pool: ComparisonPool | None = None, files_from: Path | None = None,
) -> WriteResult:
    """A new knowledge file (redacted), unless a record of the same type says the same thing:
    similarity > duplicate_above is a duplicate (nothing written), >= supersede_from supersedes it.
    `pool`: the records to compare with, shared by a run's writes (default: read them now).
    `files_from`: the folder relative `files` are read from (default: the root)."""
    if kind not in KNOWLEDGE_TYPES:
        raise InputError(f"unknown knowledge type {kind!r}", hint=f"one of {', '.join(KNOWLEDGE_TYPES)}")
    title, body = plain_text(title, body)
    if not inbox:  # extraction's candidates are cut to size where they are made
        check_size(title, body, files, tags, source_tool, source_session)
        files, tags = project_refs(files, tags, root, files_from)
    title, body = redact_text(title), redact_text(body)
    if not title:
        raise InputError("a knowledge record needs a title (its first line)")
    when = when or datetime.now(UTC)
    if pool is None or pool.inbox != inbox:
        pool = ComparisonPool(knowledge_dir, root, inbox)
    existing, matrix = pool.of(kind, cache, embedder)
    new = Record(id="", type=kind, title=title, body=body, created_at=when, path="",
                 files=list(dict.fromkeys(redact_strings(files))), tags=list(dict.fromkeys(redact_strings(tags))),
                 source_tool=source_tool, source_session=source_session)
    # The new text is embedded even with nothing to compare: its vector waits in the cache for ingest.
    vector = vectors_for([new.text], cache, embedder)[0]
    status, match, score = _closest(vector, existing, matrix, duplicate_above, supersede_from)
    if status == "duplicate":
        assert match is not None
        return WriteResult("duplicate", match.id, None, match.id, round(score, 4))
    new.id = record_id(kind, when, new.text)
    if status == "superseded" and match is not None:
        new.supersedes = match.id
    folder = knowledge_dir / (INBOX if inbox else FOLDERS[kind])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{new.id}.md"
    write_atomic(path, render(new))
    pool.add(new, vector, match if status == "superseded" else None)
    return WriteResult(status, new.id, path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path),
                       match.id if match else None, round(score, 4))


def _inbox(knowledge_dir: Path, root: Path) -> list[Record]:
    out = []
    for path in sorted((knowledge_dir / INBOX).glob("*.md")):
        try:
            out.append(parse_record(path, root))
        except (InputError, OSError):
            continue
    return out


def inbox_records(knowledge_dir: Path, root: Path) -> list[Record]:
    return _inbox(knowledge_dir, root)

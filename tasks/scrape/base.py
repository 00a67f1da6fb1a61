"""Scrape stage, shared parts: the Scraper protocol, saved positions, and record -> MESSAGES row helpers."""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

import xxhash

from ctxlake.tasks.scrape.fields import parse_ts as parse_ts  # re-exported: older importers
from ctxlake.tasks.scrape.safe_read import (
    OVERSIZE,
    SNIFF_BYTES,
    UTF8_BOM,
    ReadLimits,
    SkippedFile,
    json_loads,
    lines,
    load_json,
    open_regular,
    parse_line,
    read_bounded,
    size_text,
    sniff_utf16,
)
from ctxlake.tasks.secrets import mask_text

log = logging.getLogger(__name__)

FILE_COUNTS = "_malformed"  # FileState.extra key: this file's malformed records by reason
ENCODING = "_encoding"  # FileState.extra key: a JSONL file's detected UTF-16 flavour
# A file whose parser keeps failing is stepped over line by line at most this many times per run.
MAX_RESUMES = 100_000


@dataclass(slots=True)
class Msg:
    """One conversation record that carries content, as a scraper sees it (before redaction)."""

    tool: str
    session_id: str
    timestamp: datetime
    seq: int
    role: str  # user | assistant | tool | system
    kind: str  # text | tool_call | tool_result | compaction | error | summary | artifact
    text: str
    key: str  # the record's own id (or a stable hash of it when the format has none)
    source_file: str
    scope: str = ""  # "" when `key` is unique across sessions; else what makes it unique (the session)
    project_path: str = ""
    project_hint: str = ""  # a lossy project name (Gemini's path hash, Cursor's folder slug) resolved later
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cached: int | None = None
    model: str | None = None
    agent: str | None = None
    parent_id: str | None = None

    @property
    def id(self) -> str:
        return message_id(self.tool, self.scope, self.key)


def message_id(tool: str, scope: str, key: str) -> str:
    return xxhash.xxh3_128_hexdigest(f"{tool}\0{scope}\0{key}".encode())


@dataclass(slots=True)
class SessionMeta:
    """What a log says about a session rather than in it: its title, where it ran."""

    tool: str
    session_id: str
    title: str = ""
    title_rank: int = 0  # higher wins: a user's custom title beats an AI title beats a summary
    project_path: str = ""
    project_hint: str = ""

    def merge(self, other: SessionMeta) -> None:
        if other.title and other.title_rank >= self.title_rank:
            self.title, self.title_rank = other.title, other.title_rank
        self.project_path = other.project_path or self.project_path
        self.project_hint = other.project_hint or self.project_hint


@dataclass
class FileState:
    """A store file's saved position: enough to tell cheaply whether it changed, and where to resume.

    `fp` is the file's fingerprint when it was last read (size, mtime, inode; SQLite adds its
    -wal file's). JSONL: byte `offset` after the last complete line, valid while `inode` is the
    same and the file did not shrink. JSON documents: `digest` of the content (an mtime alone lies
    after a copy). `extra` carries a parser's running context: the session id and cwd a Codex
    rollout declared in its first line, cumulative token totals, a database's per-chat positions.
    """

    fp: list[int] = field(default_factory=list)
    inode: int = 0
    offset: int = 0
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Not saved: the end offset of the JSONL line being parsed, so a parser failure on it can
    # step past that one line and resume.
    reading: int = field(default=-1, compare=False)

    def to_json(self) -> list[Any]:
        return [self.fp, self.inode, self.offset, self.digest, self.extra]

    @classmethod
    def from_json(cls, data: list[Any]) -> FileState:
        fp, inode, offset, digest, extra = data
        return cls([int(x) for x in fp], int(inode), int(offset), str(digest), dict(extra))


Fingerprint = tuple[int, ...]


def stat_fingerprint(path: Path) -> Fingerprint | None:
    """(size, mtime_ns, inode) of a file, or None when it vanished."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass
class Counts:
    """What a scrape saw; unknown record types and malformed lines are counted, never fatal."""

    files: int = 0
    records: int = 0
    messages: int = 0
    ignored: int = 0  # known record types that carry no conversation content
    unknown: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)

    def add(self, other: Counts) -> None:
        self.files += other.files
        self.records += other.records
        self.messages += other.messages
        self.ignored += other.ignored
        for mine, theirs in ((self.unknown, other.unknown), (self.malformed, other.malformed)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v

    @property
    def n_unknown(self) -> int:
        return sum(self.unknown.values())

    @property
    def n_malformed(self) -> int:
        return sum(self.malformed.values())


INT64 = 2**63 - 1


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) or value is None else str(value)


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        n = int(value)
    except (OverflowError, ValueError):  # inf, nan
        return None
    return n if -INT64 <= n <= INT64 else None


def utf8_text(value: str) -> str:
    """`value` when it encodes as UTF-8; else with its lone surrogates replaced. A file name that is
    not UTF-8 reaches Python as surrogate escapes, which Arrow (and the row id's hash) cannot encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
    return value


# Fields that come from file and folder names (the rest comes from decoded JSON, which cannot
# hold lone surrogates).
PATH_FIELDS = ("source_file", "session_id", "scope", "key", "project_hint", "project_path")


def sanitize(msg: Msg) -> None:
    """Field types a drifted log put in a row are made to fit the MESSAGES schema (no value is
    dropped that has a faithful text form), so one odd record cannot fail the store of a batch."""
    for name in ("tool", "session_id", "role", "kind", "text", "key", "source_file", "scope", "project_path",
                 "project_hint"):
        value = getattr(msg, name)
        if not isinstance(value, str):
            setattr(msg, name, "" if value is None else str(value))
    for name in PATH_FIELDS:
        setattr(msg, name, utf8_text(getattr(msg, name)))
    for name in ("model", "agent", "parent_id"):  # optional ids: a non-text value is no id
        value = getattr(msg, name)
        setattr(msg, name, utf8_text(value) if isinstance(value, str) else None)
    for name in ("tokens_in", "tokens_out", "tokens_cached"):
        setattr(msg, name, _opt_int(getattr(msg, name)))
    if not isinstance(msg.seq, int) or isinstance(msg.seq, bool) or abs(msg.seq) > INT64:
        msg.seq = 0
    msg.files = [f if isinstance(f, str) else str(f) for f in msg.files if f is not None]
    msg.tool_calls = [{"id": _opt_str(c.get("id")), "name": str(c.get("name") or "unknown"),
                       "input": str(c.get("input") or ""),
                       "is_error": c.get("is_error") if isinstance(c.get("is_error"), bool) else None}
                      for c in msg.tool_calls if isinstance(c, dict)]


class ScrapeOutput:
    """Rows and session facts collected from one group of store files.

    A plain class, not a dataclass: Prefect walks dataclasses, lists and dicts passed between
    tasks looking for futures, and walking tens of thousands of rows cost more than scraping them.
    """

    def __init__(self, messages: list[Msg] | None = None,
                 meta: dict[tuple[str, str], SessionMeta] | None = None, limits: ReadLimits | None = None) -> None:
        self.messages: list[Msg] = messages if messages is not None else []
        self.meta: dict[tuple[str, str], SessionMeta] = meta if meta is not None else {}
        self.counts = Counts()
        self.warnings: list[str] = []  # files that could not be read
        self.problems: list[str] = []  # where the malformed records are (first 200)
        self.failed: set[str] = set()  # files not read: their position is not advanced
        self.limits = limits or ReadLimits()
        # Malformed counts of the file being read, kept in its saved position so that `ctx
        # status` can total what the logs present now hold (a re-read document replaces them).
        self.file_counts: dict[str, int] | None = None

    def cannot_read(self, path: Path, exc: Exception) -> None:
        self.failed.add(str(path))
        self.warnings.append(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})")

    def emit(self, msg: Msg) -> Msg:
        sanitize(msg)
        self.messages.append(msg)
        self.counts.messages += 1
        return msg

    def session(self, meta: SessionMeta) -> None:
        meta.session_id = utf8_text(meta.session_id)
        meta.project_path, meta.project_hint = utf8_text(meta.project_path), utf8_text(meta.project_hint)
        key = (meta.tool, meta.session_id)
        if key in self.meta:
            self.meta[key].merge(meta)
        else:
            self.meta[key] = meta

    def malformed(self, reason: str, where: str) -> None:
        self.counts.malformed[reason] = self.counts.malformed.get(reason, 0) + 1
        if self.file_counts is not None:
            self.file_counts[reason] = self.file_counts.get(reason, 0) + 1
        if len(self.problems) < 200:
            self.problems.append(f"{where}: {reason}")

    def skipped(self, path: Path, reason: str) -> None:
        """A store file deliberately not read: counted like a malformed record, and warned about."""
        self.malformed(f"file {reason}", str(path))
        self.warnings.append(f"{path}: skipped ({reason})")

    def parser_failed(self, exc: Exception, where: str) -> None:
        """A record that broke its parser in a way nobody foresaw: counted, one line logged."""
        reason = f"parser error ({type(exc).__name__})"
        self.malformed(reason, where)
        frames = traceback.extract_tb(exc.__traceback__)
        at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        # The exception's text may quote the record (a value of the wrong type): masked like the
        # rows are, since this line is logged and kept in the run report.
        line = mask_text(f"{where}: {reason}{at}: {str(exc)[:200]}")
        if len(self.warnings) < 200:
            self.warnings.append(line)
        log.warning("%s", line)

    def unknown(self, record_type: str) -> None:
        self.counts.unknown[record_type] = self.counts.unknown.get(record_type, 0) + 1

    def ignored(self) -> None:
        self.counts.ignored += 1


class Scraper(Protocol):
    """One agent tool's on-disk store. `name` keys the registry, settings and `--from NAME=PATH`;
    `tool` is what rows record (two stores of one tool, e.g. Cursor's transcripts and its IDE
    database, share it). `mutable` stores rewrite records in place (whole JSON documents, SQLite),
    so their rows are upserted; append-only logs keep the first copy of a record."""

    name: ClassVar[str]
    tool: ClassVar[str]
    mutable: ClassVar[bool]

    def default_roots(self, user_home: Path) -> list[Path]: ...

    def store_files(self, root: Path) -> list[Path]: ...

    def fingerprint(self, path: Path) -> Fingerprint | None: ...

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None: ...


def first_existing(root: Path, *subdirs: str) -> Path:
    """The first of root/<subdir> that is a folder, else root: `--from claude=~/.claude` and
    `--from claude=~/.claude/projects` both work."""
    for sub in subdirs:
        if (root / sub).is_dir():
            return root / sub
    return root


def walk_files(root: Path, suffixes: tuple[str, ...], skip_dirs: frozenset[str] = frozenset()) -> list[Path]:
    """Files under root with these suffixes, sorted (rollout names sort by time); symlinks are not followed."""
    if not root.is_dir():
        return []
    # Strings while walking, Paths at the end: pathlib's joins and comparisons were a third of a
    # no-op ingest at 20,000 session files. Sorted by parts, as Paths sort.
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        found.extend(os.path.join(dirpath, n) for n in filenames if n.endswith(suffixes))
    found.sort(key=lambda p: p.split(os.sep))
    return [Path(p) for p in found]


# -- reading -------------------------------------------------------------------------------------


def mtime_ts(path: Path) -> datetime:
    return datetime.fromtimestamp(os.stat(path).st_mtime, tz=UTC)


def loads(data: bytes | str) -> Any:
    """A JSON document in UTF-8, UTF-16 (BOM or not) or Latin-1; ValueError when not JSON."""
    return load_json(data) if isinstance(data, bytes) else json_loads(data)


def reset_if_replaced(path: Path, pos: FileState) -> None:
    """Forget the position (and parser context) of a file that shrank or is another file now.

    Called before a parser reads its context from `pos.extra`; the dict is cleared in place so
    references a parser already holds stay valid.
    """
    st = os.stat(path)
    if st.st_ino != pos.inode or st.st_size < pos.offset:
        pos.offset = 0
        counts = pos.extra.get(FILE_COUNTS)
        pos.extra.clear()
        if isinstance(counts, dict):  # the same dict: a reader may be counting into it
            counts.clear()
            pos.extra[FILE_COUNTS] = counts
    pos.inode = st.st_ino


def counts_of(pos: FileState) -> dict[str, int]:
    counts: dict[str, int] = pos.extra.setdefault(FILE_COUNTS, {})
    return counts


def scrape_each(files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput,
                read: Callable[[Path, FileState, ScrapeOutput], None]) -> None:
    """Read each store file from its saved position. Nothing in one file stops the others: a
    file that cannot be read is reported and skipped, a FIFO or oversize file is counted and
    skipped, and a record that breaks its parser is counted, stepped over, and reading resumes."""
    for path in files:
        pos = state.setdefault(str(path), FileState())
        guarded_read(path, pos, out, read)


def guarded_read(path: Path, pos: FileState, out: ScrapeOutput,
                 read: Callable[[Path, FileState, ScrapeOutput], None]) -> None:
    out.file_counts = counts_of(pos)
    try:
        for _ in range(MAX_RESUMES):
            pos.reading = -1
            try:
                read(path, pos, out)
            except SkippedFile as exc:
                out.skipped(path, exc.reason)
            except OSError as exc:
                out.cannot_read(path, exc)
                return
            except Exception as exc:  # a parser bug must not take ingestion down
                out.file_counts = counts_of(pos)  # a reset may have replaced them
                resume = pos.reading > pos.offset
                out.parser_failed(exc, at_byte(path, pos.offset) if resume else str(path))
                if resume:
                    pos.offset = pos.reading  # step over the one line that broke, read on
                    continue
            break
        out.counts.files += 1
    finally:
        out.file_counts = None
        if not pos.extra.get(FILE_COUNTS):
            pos.extra.pop(FILE_COUNTS, None)


def read_new_lines(path: Path, pos: FileState, limits: ReadLimits | None = None,
                   out: ScrapeOutput | None = None) -> Iterator[tuple[int, bytes]]:
    """Complete lines appended since `pos` as (byte offset, line); advances `pos.offset`.

    A file that shrank or was replaced (another inode) is read again from the start: record ids
    make re-reading harmless. A last line without its newline is left for the next run unless it
    already parses (the tool may simply not end its file with one). A line over the line bound
    is skipped and counted (with `out`); a UTF-8 BOM is skipped, UTF-16 is decoded.
    """
    limits = limits or ReadLimits()
    reset_if_replaced(path, pos)
    if pos.offset == 0:
        with open_regular(path, limits) as head_fh:
            head = head_fh.read(SNIFF_BYTES)
        if head.startswith(UTF8_BOM):
            pos.offset = 3
        encoding = sniff_utf16(head)
        if encoding is not None:
            pos.extra[ENCODING] = encoding
    encoding = pos.extra.get(ENCODING)
    for offset, end, line in lines(path, pos.offset, limits, encoding if isinstance(encoding, str) else None):
        if line is OVERSIZE:
            if out is not None:
                out.counts.records += 1
                out.malformed(f"line over {size_text(limits.max_line_bytes)}", at_byte(path, offset))
            pos.offset = end
            continue
        if not line.endswith(b"\n"):
            value, _ = parse_line(line)
            if value is None:
                break
        pos.reading = end
        yield offset, line
        pos.offset = end


def json_lines(path: Path, pos: FileState, out: ScrapeOutput) -> Iterator[tuple[int, dict[str, Any]]]:
    """New JSON objects of a JSONL file with their byte offsets; bad lines are counted and skipped."""
    for offset, line in read_new_lines(path, pos, out.limits, out):
        if not line.strip():
            continue
        out.counts.records += 1
        record, reason = parse_line(line)
        if reason:
            out.malformed(reason, at_byte(path, offset))
            continue
        if not isinstance(record, dict):
            out.malformed("not a JSON object", at_byte(path, offset))
            continue
        yield offset, record


def read_document(path: Path, pos: FileState, limits: ReadLimits | None = None) -> bytes | None:
    """A whole JSON document's bytes, or None when its content hash equals the saved one.
    New content replaces the file's malformed counts (they are counted again as it is parsed)."""
    data = read_bounded(path, limits or ReadLimits())
    digest = xxhash.xxh3_64_hexdigest(data)
    if digest == pos.digest:
        return None
    pos.digest = digest
    counts_of(pos).clear()
    return data


def at_byte(path: Path, offset: int) -> str:
    """Where a JSONL record starts, for a problem line: a byte offset (a run that resumes mid-file does
    not know line numbers), written so that it does not read as `path:line`."""
    return f"{path} at byte {offset}"


def guard(out: ScrapeOutput, where: str, fn: Callable[..., None], *args: Any) -> None:
    """fn(*args) for one record of a document; a failure is counted against that record only."""
    try:
        fn(*args)
    except SkippedFile:
        raise
    except Exception as exc:
        out.parser_failed(exc, where)


class JsonlScraper:
    """Base for append-only JSONL stores: each changed file is read from its saved offset."""

    name: ClassVar[str]
    tool: ClassVar[str]
    mutable: ClassVar[bool] = False
    suffixes: ClassVar[tuple[str, ...]] = (".jsonl",)

    def default_roots(self, user_home: Path) -> list[Path]:
        raise NotImplementedError

    def store_dir(self, root: Path) -> Path:
        return root

    def store_files(self, root: Path) -> list[Path]:
        return walk_files(self.store_dir(root), self.suffixes)

    def fingerprint(self, path: Path) -> Fingerprint | None:
        return stat_fingerprint(path)

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None:
        def read(path: Path, pos: FileState, out: ScrapeOutput) -> None:
            reset_if_replaced(path, pos)
            self.scrape_file(path, pos, out)

        scrape_each(files, state, out, read)

    def scrape_file(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        raise NotImplementedError


ScraperFactory = Callable[[], Scraper]

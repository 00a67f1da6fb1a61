"""The local docs reader: lists and reads the configured documentation folders, never a path outside them.

Paths come from agents, so every one is checked before the file system sees it: relative only,
no `..` component, inside a configured folder, an allowed extension, and (after symlinks are
resolved) still inside that folder. The folders themselves are configuration ([docs] paths),
never tool input. Shared with get_file_context, which applies the same rules to the project root.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ctxlake.errors import ConfigError, InputError
from ctxlake.schemas.config import DocsSettings
from ctxlake.serve.api.tool_models import (
    DocContent,
    DocEntry,
    DocsIndex,
    decode_cursor,
    encode_cursor,
)
from ctxlake.tasks import safe_io
from ctxlake.tasks.secrets import mask_text

DOCS_PAGE = 200
_DRIVE = re.compile(r"^[A-Za-z]:")
# The project's own top-level documents, listed by name next to the docs folders' files.
_ROOT_DOC = re.compile(r"^(README|CHANGES|CHANGELOG|CONTRIBUTING)(\.[A-Za-z0-9]+)?$", re.I)


def clean_relative(path: str, what: str = "path") -> str:
    """A user-given path as a normalised relative posix path; InputError for anything that could
    leave its base folder (absolute, home-relative, drive letters, `..`, NUL bytes)."""
    if not isinstance(path, str) or not path.strip():
        raise InputError(f"empty {what}")
    if "\0" in path:
        raise InputError(f"{what} contains a NUL byte")
    # Backslashes separate folders on Windows and hide traversal (..\..\x): treat them as slashes.
    text = path.strip().replace("\\", "/")
    if text.startswith(("/", "~")) or _DRIVE.match(text):
        raise InputError(f"absolute {what} not allowed: {path!r}",
                         hint="give a path relative to the project (e.g. docs/guide.md)")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InputError(f"path traversal not allowed: {path!r} ('..' leaves the folder)",
                         hint="give a path inside the folder without '..'")
    if not parts:
        raise InputError(f"empty {what}: {path!r}")
    return "/".join(parts)


def resolve_inside(base: Path, rel: str, what: str = "path") -> Path:
    """`base/rel` with symlinks resolved; InputError when that lands outside `base`."""
    base_real = base.resolve()
    try:
        target = (base_real / rel).resolve()
    except RuntimeError:  # Python 3.11 raises this for a symlink loop
        raise InputError(f"{what} {rel!r} is a symlink loop") from None
    if target != base_real and base_real not in target.parents:
        raise InputError(f"{what} {rel!r} resolves outside {base.name}/ (a symlink points out)",
                         hint="only files inside the folder can be read")
    return target


@dataclass(frozen=True)
class DocsSource:
    name: str  # how paths of this folder start in the listing
    folder: Path


def docs_sources(root: Path, docs: DocsSettings) -> list[DocsSource]:
    """The configured docs folders, each named by its path relative to the root (or its folder
    name when configured outside the project)."""
    out: list[DocsSource] = []
    for entry in docs.paths:
        raw = Path(entry).expanduser()
        if raw.is_absolute():
            folder, name = raw, raw.name
        else:
            if entry.strip() and not [part for part in entry.strip().replace("\\", "/").split("/") if part not in ("", ".")]:
                # The project itself: its top-level documents are listed already (ROOT_DOCS), and
                # the whole tree is what `ctx search` is for.
                raise ConfigError(f"[docs] paths: {entry!r} is the project itself, not a docs folder",
                                  hint="its top-level documents (README, CHANGELOG, ...) are always listed; "
                                       "name the folders that hold documentation, e.g. docs")
            try:
                name = clean_relative(entry, "docs folder")
            except InputError as exc:
                raise ConfigError(f"[docs] paths: {exc.message}",
                                  hint="name folders inside the project, or absolute folders") from exc
            folder = root / name
        if any(s.name == name for s in out):
            raise ConfigError(f"[docs] paths: two folders are both named {name!r}")
        out.append(DocsSource(name, folder))
    return out


ROOT_DOCS = "."  # the docs source of the top-level files (README, CHANGES, CONTRIBUTING ...)


class DocsReader:
    """Lists and reads the documents of the configured docs folders in bounded pieces."""

    def __init__(self, root: Path, docs: DocsSettings, max_chars: int = 60_000, lister: str = "docs_index") -> None:
        """`lister`: what lists the documents, in the face's words (the MCP tool, or `ctx docs`) for the hints."""
        self.settings = docs
        self.lister = lister
        self.root = root
        self.sources = docs_sources(root, docs)
        self.extensions = {e.lower() if e.startswith(".") else "." + e.lower() for e in docs.extensions}
        # A chunk's text stays well inside the response bound (the JSON mirror roughly doubles it).
        self.max_chunk_chars = max(2_000, max_chars // 2)

    # -- listing ---------------------------------------------------------------------------------

    def _allowed(self, name: str) -> bool:
        return Path(name).suffix.lower() in self.extensions

    def _walk(self, source: DocsSource) -> list[DocEntry]:
        base = source.folder.resolve()
        entries: list[DocEntry] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            # Hidden folders hold build caches (.vuepress/.cache, .docusaurus), not documents.
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith(".") or not self._allowed(name):
                    continue
                full = Path(dirpath) / name
                rel = full.relative_to(base).as_posix()
                try:
                    real = full.resolve()
                    if real != base and base not in real.parents:
                        continue  # a symlink pointing out of the folder is not a document of it
                    st = real.stat()
                except (OSError, RuntimeError):
                    continue  # vanished, a dangling link, or a link loop
                modified = datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat(timespec="seconds")
                entries.append(DocEntry(path=f"{source.name}/{rel}", name=name,
                                        sizeBytes=st.st_size, modifiedAt=modified))
        return sorted(entries, key=lambda e: e.path)

    def _is_root_doc(self, name: str) -> bool:
        match = _ROOT_DOC.match(name)
        return match is not None and (not match.group(2) or self._allowed(name))

    def _root_docs(self) -> list[DocEntry]:
        """README*, CHANGES*, CHANGELOG*, CONTRIBUTING* at the project root (regular files, or links
        that stay inside the root and are not hidden), opened as a read would open them."""
        entries: list[DocEntry] = []
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            return entries
        for name in names:
            if not self._is_root_doc(name):
                continue
            try:
                fd = safe_io.open_fd_inside(self.root, name)
            except (OSError, InputError):
                continue  # a link out, a FIFO, vanished: not a document
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            modified = datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat(timespec="seconds")
            entries.append(DocEntry(path=name, name=name, sizeBytes=st.st_size, modifiedAt=modified))
        return entries

    def index(self, source: str | None = None, cursor: str | None = None) -> DocsIndex:
        """The documents of one docs folder (or all), a page at a time."""
        names = [s.name for s in self.sources]
        chosen = self.sources
        wanted = None if source is None else (source.strip().strip("/") or ".")
        # '.' is the top-level files alone (README, CHANGES ...): no folder of them.
        top_level = wanted in (None, ROOT_DOCS)
        if wanted is not None:
            chosen = [s for s in self.sources if s.name == wanted]
            if not chosen and wanted != ROOT_DOCS:
                raise InputError(f"unknown docs source {source!r}",
                                 hint=f"configured docs folders: {', '.join(names) or 'none'}; "
                                      f"'{ROOT_DOCS}' = the top-level files")
        warnings: list[str] = []
        if not self.sources and wanted is None:
            warnings.append("no docs folder is configured: set [docs] paths in .ctx/config.toml")
        documents: list[DocEntry] = self._root_docs() if top_level else []
        for src in chosen:
            if not src.folder.is_dir():
                warnings.append(f"docs folder {src.name!r} does not exist ({src.folder}); "
                                "set [docs] paths in .ctx/config.toml")
                continue
            documents.extend(self._walk(src))
        key = source or ""
        offset = decode_cursor(cursor, "docs", key) if cursor else 0
        page = documents[offset : offset + DOCS_PAGE]
        end = offset + len(page)
        return DocsIndex(
            sources=names, documents=page, total=len(documents), warnings=warnings,
            next_cursor=encode_cursor("docs", end, key) if end < len(documents) else None,
        )

    # -- reading ---------------------------------------------------------------------------------

    def locate(self, path: str) -> tuple[str, Path]:
        """The clean listing path and the real file behind a user-given docs path."""
        clean, _src, _rel, target = self._locate(path)
        return clean, target

    def _locate(self, path: str) -> tuple[str, DocsSource, str, Path]:
        clean = clean_relative(path)
        # The longest folder name first, so docs/api wins over docs when both are configured.
        for src in sorted(self.sources, key=lambda s: -len(s.name)):
            prefix = src.name + "/"
            if clean.startswith(prefix):
                rel = clean[len(prefix):]
                break
        else:
            names = ", ".join(f"{s.name}/" for s in self.sources) or "none configured"
            raise InputError(f"{path!r} is not inside a docs folder ({names})",
                             hint=f"use a path from {self.lister}")
        if any(part.startswith(".") for part in rel.split("/")):
            raise InputError(f"hidden files are not served: {path!r}", hint=f"use a path from {self.lister}")
        allowed = ", ".join(sorted(self.extensions))
        if not self._allowed(rel):
            raise InputError(f"file type not allowed: {path!r}", hint=f"the docs reader reads {allowed}")
        target = resolve_inside(src.folder, rel)
        if not self._allowed(target.name):
            raise InputError(f"file type not allowed: {path!r} links to {target.name!r}",
                             hint=f"the docs reader reads {allowed}")
        if not target.exists():  # not is_file(): a FIFO or device is refused by the read, clearly
            known = [d.path for d in self._walk(src)] if src.folder.is_dir() else []
            close = difflib.get_close_matches(clean, known, n=3, cutoff=0.6)
            raise InputError(f"no such document: {clean!r}",
                             hint=f"did you mean {', '.join(close)}?" if close else f"{self.lister} lists the documents")
        return clean, src, rel, target

    def _chunks(self, lines: list[str]) -> list[tuple[int, int]]:
        """Line ranges [start, end) of at most chunk_lines lines and about max_chunk_chars
        characters each; cut by characters too, so minified or generated docs stay bounded."""
        bounds: list[tuple[int, int]] = []
        start, chars = 0, 0
        for i, line in enumerate(lines):
            if i > start and (i - start >= self.settings.chunk_lines or chars + len(line) > self.max_chunk_chars):
                bounds.append((start, i))
                start, chars = i, 0
            chars += len(line)
        bounds.append((start, len(lines)))
        return bounds

    def content(self, path: str, chunk: int = 1) -> DocContent:
        """One chunk of a document: at most chunk_lines lines, with where it sits in the file."""
        clean = clean_relative(path)
        if "/" not in clean and self._is_root_doc(clean):
            folder, rel = self.root, clean  # README.md and friends at the project root
        else:
            clean, src, rel, _target = self._locate(path)
            folder = src.folder
        # The checks above give clear messages; the read itself walks the path again with
        # O_NOFOLLOW from the folder's descriptor, so a swap since cannot lead outside.
        limit = self.settings.max_file_bytes
        try:
            data = safe_io.open_inside(folder, rel, limit)
        except safe_io.TooLarge as exc:
            raise InputError(f"{clean!r} is {exc.size:,} bytes, over the docs reader's limit of {limit:,}",
                             hint="raise [docs] max_file_bytes") from None
        except (FileNotFoundError, NotADirectoryError):
            raise InputError(f"no such document: {clean!r}", hint=f"{self.lister} lists the documents") from None
        if b"\0" in data[:8192]:
            raise InputError(f"{clean!r} is not a text file")
        warnings: list[str] = []
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            warnings.append("the file is not valid UTF-8: undecodable bytes are shown as U+FFFD")
        text = mask_text(text, clean)  # docs are read from disk: masked like the index masks them
        lines = text.splitlines(keepends=True)
        bounds = self._chunks(lines) if lines else [(0, 0)]
        if chunk < 1 or chunk > len(bounds):
            raise InputError(f"chunk {chunk} is out of range: {clean!r} has {len(bounds)} chunk(s)",
                             hint=f"ask for chunk 1..{len(bounds)}")
        start, end = bounds[chunk - 1]
        body = "".join(lines[start:end])
        if len(body) > self.max_chunk_chars:
            body = body[: self.max_chunk_chars]
            warnings.append(f"line {start + 1} is longer than {self.max_chunk_chars:,} characters: "
                            "the rest of it is cut")
        return DocContent(
            path=clean, chunk=chunk, totalChunks=len(bounds), totalLines=len(lines),
            startLine=start + 1 if lines else 0, endLine=end, content=body, warnings=warnings,
        )

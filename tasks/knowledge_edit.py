"""Knowledge stage, edits: revise a record (a new file that supersedes it) or delete its file; .ctx/knowledge/*.md only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlake.errors import InputError
from ctxlake.tasks.knowledge import (
    Record,
    WriteResult,
    check_size,
    decide,
    heads,
    load_records,
    plain_text,
    project_refs,
    record_id,
    render,
)
from ctxlake.tasks.lake import write_atomic
from ctxlake.tasks.memory_state import FOLDERS
from ctxlake.tasks.redact import redact_strings, redact_text

if TYPE_CHECKING:
    from ctxlake.tasks.embed_cache import EmbeddingCache
    from ctxlake.tasks.embedder_base import Embedder


def find_record(knowledge_dir: Path, root: Path, record: str) -> Record:
    """The current record with this id; InputError when there is none (or it was superseded)."""
    records, _ = load_records(knowledge_dir, root)
    for r in records:
        if r.id == record:
            if r not in heads(records):
                raise InputError(f"knowledge record {record!r} was superseded; edit its newest version")
            return r
    raise InputError(f"no knowledge record {record!r}", hint="`ctx knowledge` lists them")


def revise_record(
    knowledge_dir: Path, root: Path, record: str, title: str, body: str, *, cache: EmbeddingCache,
    embedder: Embedder, duplicate_above: float, files: Sequence[str] | None = None,
    tags: Sequence[str] | None = None, when: datetime | None = None,
) -> WriteResult:
    """An edit is a new version: a file that supersedes `record` (the chain keeps the history).

    Refused as a duplicate when another current record of the type says the same thing; the
    record being edited is not compared with itself.
    """
    old = find_record(knowledge_dir, root, record)
    title, body = plain_text(title, body)
    check_size(title, body, files or (), tags or ())
    if files is not None or tags is not None:
        new_files, new_tags = project_refs(files or (), tags or (), root)
        files = new_files if files is not None else None
        tags = new_tags if tags is not None else None
    title, body = redact_text(title), redact_text(body)
    if not title:
        raise InputError("a knowledge record needs a title")
    if title == old.title and body == old.body.strip() and files is None and tags is None:
        raise InputError("nothing changed: the title and body are the same as the record's")
    when = when or datetime.now(UTC)
    records, _ = load_records(knowledge_dir, root)
    pool = [r for r in heads(records) if r.type == old.type and r.id != old.id]
    new = replace(old, id="", title=title, body=body, created_at=when, path="", supersedes=old.id,
                  files=list(dict.fromkeys(redact_strings(old.files if files is None else files))),
                  tags=list(dict.fromkeys(redact_strings(old.tags if tags is None else tags))))
    status, match, score = decide(new.text, pool, cache, embedder, duplicate_above, 2.0)
    if status == "duplicate" and match is not None:
        return WriteResult("duplicate", match.id, None, match.id, round(score, 4))
    new.id = record_id(old.type, when, new.text)
    folder = knowledge_dir / FOLDERS[old.type]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{new.id}.md"
    write_atomic(path, render(new))
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    return WriteResult("superseded", new.id, rel, old.id, round(score, 4))


def delete_record(knowledge_dir: Path, root: Path, record: str) -> str:
    """Delete a current record's file; its path relative to the project root. The version it
    superseded, if any, becomes current again (the file is the record)."""
    found = find_record(knowledge_dir, root, record)
    path = (root / found.path).resolve()
    base = knowledge_dir.resolve()
    if base not in path.parents or path.is_symlink():
        raise InputError(f"refusing to delete {found.path!r}: not a file inside {knowledge_dir}")
    path.unlink()
    return found.path

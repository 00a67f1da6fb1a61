"""related_files: the files that change together with a file, from the lake's COCHANGE table (git history)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ctxlake.errors import InputError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import COCHANGE_TABLE, PROJECT_SOURCE
from ctxlake.tasks.cochange import newest_weight
from ctxlake.tasks.lake import connect, open_table

MAX_RELATED = 50


class RelatedFile(BaseModel):
    path: str = Field(description="a file changed in the same commits, relative to the source root")
    strength: float = Field(description="co-change strength 0..1: 1 - 0.5 ** n, n the shared commits with newer "
                                        "ones weighing more (a commit a year old counts half)")
    commits: int = Field(description="commits that changed both files")
    last_change: str = Field(description="date of the newest such commit (UTC, YYYY-MM-DD)")


class RelatedFiles(BaseModel):
    path: str
    source: str
    related: list[RelatedFile]
    note: str | None = Field(None, description="why the list may be empty or partial")


def related_files(settings: Settings, path: str, limit: int = 10, source: str = PROJECT_SOURCE) -> RelatedFiles:
    """A file -> the files most often changed with it in this source's git history (newest weighing most)."""
    if not 1 <= limit <= MAX_RELATED:
        raise InputError(f"limit must be between 1 and {MAX_RELATED}, got {limit}")
    path = path.strip().removeprefix("./")
    if not path or path.startswith("/") or ".." in path.split("/"):
        raise InputError(f"not a path inside the project: {path!r}", hint="give it relative to the project root")
    if not settings.lake_dir.is_dir():
        raise NotIndexedError(f"no index at {settings.lake_dir}", hint="run `ctx run index` in the project first")
    table = open_table(connect(settings.lake_dir), COCHANGE_TABLE)
    top = newest_weight(settings.lake_dir, source)
    if table is None or top is None:
        return RelatedFiles(path=path, source=source, related=[],
                            note="no git history indexed: the project is not a git work tree, or not indexed since")
    quoted_source = source.replace("'", "''")
    quoted_path = path.replace("'", "''")
    rows = (table.search().where(f"source = '{quoted_source}' AND path = '{quoted_path}'")
            .select(["other", "weight", "commits", "last_change"]).limit(None).to_arrow().to_pylist())
    rows.sort(key=lambda r: (-r["weight"], r["other"]))
    related = [RelatedFile(path=r["other"], strength=round(1.0 - 0.5 ** (r["weight"] / top), 4), commits=r["commits"],
                           last_change=r["last_change"].strftime("%Y-%m-%d")) for r in rows[:limit]]
    note = None if related else f"{path} changed with no other file in the commits read (or is not in git)"
    return RelatedFiles(path=path, source=source, related=related, note=note)

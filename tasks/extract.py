"""Extract stage: session segments -> knowledge candidates (an error followed by its fix, "we decided" lines) in .ctx/knowledge/inbox/."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlake.tasks.compact import decision_sentences
from ctxlake.tasks.knowledge import ComparisonPool, WriteResult, write_record
from ctxlake.tasks.lake import write_atomic
from ctxlake.tasks.sessionize import Segment
from ctxlake.tasks.stage import stage

if TYPE_CHECKING:
    from ctxlake.tasks.embed_cache import EmbeddingCache
    from ctxlake.tasks.embedder_base import Embedder

PROPOSED_FILE = "proposed.json"  # candidates proposed once are not proposed again after a review
ERROR_LINES = 12
FIX_CHARS = 800


@dataclass
class Candidate:
    kind: str
    title: str
    body: str
    when: datetime
    source_tool: str
    source_session: str
    files: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.source_session}:{self.title}"


def _first_line(text: str, limit: int = 120) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def candidates(seg: Segment) -> list[Candidate]:
    """Rule-based proposals from one segment: decision lines, and errors a later success fixed."""
    found: list[Candidate] = []
    rows = seg.rows
    for row in rows:
        if row["role"] in ("user", "assistant") and row["kind"] == "text":
            for sentence in decision_sentences(row["text"]):
                found.append(Candidate("decision", _first_line(sentence), f"{sentence}\n\n(said by the {row['role']} in {seg.ref})",
                                       row["timestamp"], seg.tool, seg.ref, list(row["files"] or [])))
    for i, row in enumerate(rows):
        failed = [c for c in row["tool_calls"] or [] if c.get("is_error")] if row["role"] == "tool" else []
        if not failed or not row["text"].strip():
            continue
        name = failed[0].get("name") or "tool"
        fixed_at = next((j for j in range(i + 1, len(rows)) if rows[j]["role"] == "tool" and any(
            c.get("is_error") is False and (c.get("name") == name or name == "unknown") for c in rows[j]["tool_calls"] or [])), None)
        if fixed_at is None:
            continue
        explain = next((r for r in rows[fixed_at + 1:] if r["role"] == "assistant" and r["kind"] == "text" and r["text"].strip()), None)
        attempt = next((r for r in reversed(rows[i + 1: fixed_at]) if r["role"] == "assistant"), None)
        error_text = "\n".join(row["text"].strip().splitlines()[:ERROR_LINES])
        fix = []
        if attempt is not None:
            fix += [f"- `{c.get('name')}`: {c.get('input')}" for c in attempt["tool_calls"] or [] if c.get("input")]
            if attempt["text"].strip():
                fix.append(attempt["text"].strip()[:FIX_CHARS])
        if explain is not None:
            fix.append(explain["text"].strip()[:FIX_CHARS])
        if not fix:
            continue
        body = f"## Error\n\n```\n{error_text}\n```\n\n## Fix\n\n" + "\n\n".join(fix) + f"\n\n(from {seg.ref})"
        files = list(dict.fromkeys(f for r in rows[i: fixed_at + 1] for f in r["files"] or []))
        found.append(Candidate("error", f"{name}: {_first_line(row['text'])}", body, row["timestamp"], seg.tool, seg.ref, files))
    return found


@stage("extract")
def extract_candidates(segments: Sequence[Segment], knowledge_dir: Path, root: Path, lake_dir: Path,
                       cache: EmbeddingCache, embedder: Embedder, duplicate_above: float,
                       supersede_from: float) -> list[WriteResult]:
    """This project's session segments -> candidate files in .ctx/knowledge/inbox/ (duplicates skipped)."""
    proposed_path = lake_dir / PROPOSED_FILE
    try:
        proposed: set[str] = set(json.loads(proposed_path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        proposed = set()
    results: list[WriteResult] = []
    pool: ComparisonPool | None = None  # read on the first new candidate, then kept current
    for seg in segments:
        for cand in candidates(seg):
            if cand.key in proposed:
                continue
            proposed.add(cand.key)
            pool = pool or ComparisonPool(knowledge_dir, root, inbox=True)
            results.append(write_record(
                knowledge_dir, root, cand.kind, cand.title, cand.body, cache=cache, embedder=embedder,
                duplicate_above=duplicate_above, supersede_from=supersede_from, files=cand.files,
                tags=["extracted"], source_tool=cand.source_tool, source_session=cand.source_session,
                inbox=True, when=cand.when, pool=pool,
            ))
    if results:
        lake_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(proposed_path, json.dumps(sorted(proposed)))
    return results


"""Knowledge files: front matter, duplicate/supersede thresholds with the fake embedder, redaction, extraction into the inbox."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ctxlake.errors import InputError
from ctxlake.tasks.embed_cache import EmbeddingCache
from ctxlake.tasks.embedders import FakeEmbedder
from ctxlake.tasks.extract import extract_candidates
from ctxlake.tasks.knowledge import (
    ComparisonPool,
    heads,
    ingest_knowledge,
    knowledge_table,
    load_records,
    write_record,
)
from ctxlake.tasks.memory_state import manifest_changed, save_manifest
from ctxlake.tasks.memory_store import open_knowledge
from ctxlake.tasks.sessionize import Segment

TITLE = "Use httpx for HTTP calls"
BODY = ("The uploader streams large files with httpx; requests buffered them in memory and timed out on big "
        "uploads to the storage service.")
# Measured with the fake embedder (see the asserts on `similarity`): a few extra words stay above
# 0.95, a changed detail lands between 0.85 and 0.95, another topic far below.
NEAR_COPY = BODY[:-1] + " and the backup service."
REVISED = ("The uploader streams large files with httpx and a 60 second timeout; requests buffered them in memory "
           "and timed out on big uploads to the storage service.")
OTHER = ("Store sessions in LanceDB", "One table per kind of record, merged by id; DuckDB reads them for analytics.")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / ".ctx" / "knowledge").mkdir(parents=True)
    return root


@pytest.fixture
def kit(tmp_path: Path) -> dict[str, Any]:
    embedder = FakeEmbedder()
    cache = EmbeddingCache(tmp_path / "home" / "embeddings", embedder.model_id, embedder.dims)
    return {"cache": cache, "embedder": embedder, "duplicate_above": 0.95, "supersede_from": 0.85}


def write(project: Path, kit: dict[str, Any], kind: str, title: str, body: str, **kw: Any) -> Any:
    return write_record(project / ".ctx" / "knowledge", project, kind, title, body, **kit, **kw)


def test_created_duplicate_superseded(project: Path, kit: dict[str, Any]) -> None:
    first = write(project, kit, "decision", TITLE, BODY, files=["uploader.py"], tags=["http"],
                  source_tool="claude", source_session="claude:sess-a", when=datetime(2026, 3, 2, tzinfo=UTC))
    assert first.status == "created" and first.path == f".ctx/knowledge/decisions/{first.id}.md"
    text = (project / first.path).read_text()
    front = yaml.safe_load(text.split("---")[1])
    assert front == {"id": first.id, "type": "decision", "title": TITLE, "created_at": "2026-03-02T00:00:00Z",
                     "source_tool": "claude", "source_session": "claude:sess-a", "files": ["uploader.py"], "tags": ["http"]}
    assert text.rstrip().endswith(BODY)

    dup = write(project, kit, "decision", TITLE, NEAR_COPY)
    assert dup.status == "duplicate" and dup.id == first.id and dup.path is None and dup.similarity > 0.95
    assert len(list((project / ".ctx/knowledge/decisions").glob("*.md"))) == 1

    newer = write(project, kit, "decision", TITLE, REVISED)
    assert newer.status == "superseded" and 0.85 <= newer.similarity <= 0.95 and newer.similar_to == first.id
    assert yaml.safe_load((project / newer.path).read_text().split("---")[1])["supersedes"] == first.id

    # The chain's head is what new writes are compared with.
    again = write(project, kit, "decision", TITLE, REVISED)
    assert again.status == "duplicate" and again.id == newer.id
    other = write(project, kit, "decision", *OTHER)
    assert other.status == "created" and other.similarity < 0.85
    # Types do not compete: the same words as an insight are new.
    assert write(project, kit, "insight", TITLE, BODY).status == "created"

    records, problems = load_records(project / ".ctx" / "knowledge", project)
    assert problems == []
    assert {r.id for r in heads(records)} == {newer.id, other.id, *[r.id for r in records if r.type == "insight"]}
    table = knowledge_table(records, 64).to_pylist()
    assert {r["id"]: r["superseded_by"] for r in table}[first.id] == newer.id


@pytest.mark.parametrize("inbox", [False, True])
def test_a_shared_pool_decides_as_fresh_reads_do(project: Path, kit: dict[str, Any], inbox: bool) -> None:
    """One pool across a run's writes (ingest's extraction) gives each write the answer it would
    get by reading the knowledge folder again: records written earlier in the run count."""
    knowledge = project / ".ctx" / "knowledge"
    pool = ComparisonPool(knowledge, project, inbox=inbox)
    steps = [("decision", TITLE, BODY), ("decision", TITLE, NEAR_COPY), ("decision", TITLE, REVISED),
             ("decision", TITLE, REVISED), ("decision", *OTHER), ("insight", TITLE, BODY)]
    shared = [write(project, kit, *step, inbox=inbox, pool=pool).status for step in steps]
    fresh_root = project.parent / "fresh"
    (fresh_root / ".ctx" / "knowledge").mkdir(parents=True)
    fresh = [write(fresh_root, kit, *step, inbox=inbox).status for step in steps]
    assert shared == fresh
    # Among accepted records a superseded one leaves the pool for its chain's new head; in the
    # inbox every candidate stays.
    assert shared[:3] == ["created", "duplicate", "superseded"]


def test_thresholds_come_from_settings(project: Path, kit: dict[str, Any]) -> None:
    write(project, kit, "error", TITLE, BODY)
    strict = {**kit, "duplicate_above": 0.999, "supersede_from": 0.99}
    assert write_record(project / ".ctx" / "knowledge", project, "error", TITLE, NEAR_COPY, **strict).status == "created"


def test_secrets_never_reach_knowledge_files(project: Path, kit: dict[str, Any]) -> None:
    token = "ghp_" + "Q" * 36
    result = write(project, kit, "error", "Push rejected", f"Fixed by export GITHUB_TOKEN={token} before git push")
    text = (project / result.path).read_text()
    assert token not in text and "GITHUB_TOKEN=[REDACTED:" in text


def test_bad_files_are_reported_and_skipped(project: Path, kit: dict[str, Any]) -> None:
    folder = project / ".ctx" / "knowledge" / "insights"
    folder.mkdir(parents=True)
    (folder / "good.md").write_text("---\ntitle: Caches are per model\n---\nThe embedding cache is keyed by model id.\n")
    (folder / "plain.md").write_text("# Tests need a Prefect server\n\nOne per session.\n")
    (folder / "broken.md").write_text("---\ntitle: [unclosed\n---\nbody\n")
    (folder / "wrongtype.md").write_text("---\ntype: rumor\n---\nbody\n")
    (folder / "binary.md").write_bytes(b"\xff\xfe\x00garbage")
    records, problems = load_records(project / ".ctx" / "knowledge", project)
    assert sorted((r.id, r.title) for r in records) == [("good", "Caches are per model"), ("plain", "Tests need a Prefect server")]
    assert len(problems) == 3
    assert any("broken.md: front matter is not valid YAML" in p for p in problems)
    assert any("rumor" in p for p in problems) and any("not UTF-8" in p for p in problems)


def test_records_are_parsed_again_only_when_their_file_changes(
        project: Path, kit: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The MCP tools and the UI read every record file on each call (project_knowledge with 42
    inbox proposals: 46 ms of CPU a call); an unchanged file is not read and parsed again."""
    import os

    from ctxlake.tasks import knowledge

    write(project, kit, "insight", TITLE, BODY)
    write(project, kit, "decision", *OTHER)
    folder = project / ".ctx" / "knowledge"
    knowledge._PARSED.clear()  # the writes above compared against what they parsed
    read: list[str] = []
    real = knowledge._read_record
    monkeypatch.setattr(knowledge, "_read_record", lambda path, root: read.append(path.name) or real(path, root))
    first, _ = load_records(folder, project)
    assert len(read) == 2
    first[0].tags.append("changed by a caller")  # what a caller does to its copy stays there
    again, _ = load_records(folder, project)
    assert len(read) == 2 and again[0].tags == [] and [r.title for r in again] == [r.title for r in first]
    edited = folder / first[0].path.split("knowledge/", 1)[1]
    edited.write_text(edited.read_text().replace(first[0].body, "Rewritten by hand."))
    third, _ = load_records(folder, project)
    assert len(read) == 3 and any(r.body == "Rewritten by hand." for r in third)
    # A file swapped for a link out of the folder is refused, whatever was read from that name before.
    secret = tmp_path / "secret.md"
    secret.write_text("---\ntitle: stolen\n---\nPRIVATE\n")
    edited.unlink()
    os.symlink(secret, edited)
    fourth, problems = load_records(folder, project)
    assert all("PRIVATE" not in r.body for r in fourth) and any(edited.name in p for p in problems)


def test_ingest_replaces_the_table_and_the_manifest_notices_edits(project: Path, kit: dict[str, Any], tmp_path: Path) -> None:
    knowledge_dir, lake = project / ".ctx" / "knowledge", project / ".ctx" / "lake"
    write(project, kit, "decision", TITLE, BODY)
    other = write(project, kit, "insight", *OTHER)
    table = open_knowledge(lake, 64)
    assert manifest_changed(lake, knowledge_dir, "fake:hash:64")
    records, _ = load_records(knowledge_dir, project)
    assert ingest_knowledge.fn(table, records, kit["cache"]) == 2
    save_manifest(lake, knowledge_dir, "fake:hash:64")
    assert not manifest_changed(lake, knowledge_dir, "fake:hash:64")
    assert manifest_changed(lake, knowledge_dir, "another:model")
    (project / other.path).unlink()
    assert manifest_changed(lake, knowledge_dir, "fake:hash:64")
    records, _ = load_records(knowledge_dir, project)
    ingest_knowledge.fn(table, records, kit["cache"])
    assert table.search().select(["type"]).to_arrow().column("type").to_pylist() == ["decision"]
    # Vectors come from the cache the writes filled: nothing is embedded twice.
    assert table.count_rows("vector IS NOT NULL") == 1


def seg_rows() -> list[dict[str, Any]]:
    t = datetime(2026, 3, 2, 9, tzinfo=UTC)

    def row(role: str, kind: str, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"role": role, "kind": kind, "text": text, "tool_calls": calls or [], "files": ["/p/uploader.py"],
                "timestamp": t, "agent": None}

    return [
        row("user", "text", "Uploads of 2 GB files time out"),
        row("assistant", "tool_call", "", [{"name": "Bash", "input": "pytest tests/test_upload.py", "is_error": None}]),
        row("tool", "tool_result", "FAILED test_big - TimeoutError: read timed out", [{"name": "Bash", "input": "", "is_error": True}]),
        row("assistant", "text", "Streaming the body with httpx instead.", [{"name": "Edit", "input": "/p/uploader.py", "is_error": None}]),
        row("tool", "tool_result", "1 passed", [{"name": "Bash", "input": "", "is_error": False}]),
        row("assistant", "text", "The upload now streams in 1 MB chunks, so the timeout no longer triggers.\nWe decided to use httpx for all HTTP calls."),
    ]


def test_extraction_proposes_error_fixes_and_decisions_once(project: Path, kit: dict[str, Any]) -> None:
    seg = Segment("claude", "sess-a", 1, seg_rows(), project_path=str(project))
    knowledge_dir, lake = project / ".ctx" / "knowledge", project / ".ctx" / "lake"
    args = dict(cache=kit["cache"], embedder=kit["embedder"], duplicate_above=0.95, supersede_from=0.85)
    results = extract_candidates.fn([seg], knowledge_dir, project, lake, **args)
    assert sorted(r.status for r in results) == ["created", "created"]
    inbox = {p.read_text().split("---")[1]: p.read_text() for p in (knowledge_dir / "inbox").glob("*.md")}
    fronts = [yaml.safe_load(f) for f in inbox]
    assert sorted(f["type"] for f in fronts) == ["decision", "error"]
    error_text = next(t for t in inbox.values() if "type: error" in t)
    assert "TimeoutError" in error_text and "Streaming the body with httpx" in error_text and "1 MB chunks" in error_text
    assert all(f["source_session"] == "claude:sess-a" and f["tags"] == ["extracted"] for f in fronts)
    # Not ingested until reviewed, and not proposed again on the next run.
    assert load_records(knowledge_dir, project)[0] == []
    assert extract_candidates.fn([seg], knowledge_dir, project, lake, **args) == []
    assert len(list((knowledge_dir / "inbox").glob("*.md"))) == 2


def test_hand_written_lists_are_read_and_wrong_types_are_reported(project: Path, kit: dict[str, Any]) -> None:
    folder = project / ".ctx" / "knowledge" / "decisions"
    folder.mkdir(parents=True)
    (folder / "scalar.md").write_text("---\ntitle: Deploys\ntags: ops\nfiles: deploy.sh\n---\nbody\n")
    (folder / "listed.md").write_text("---\ntitle: Listed\ntags: [a, '', b]\nfiles:\n- src/app.py\n---\nbody\n")
    (folder / "number.md").write_text("---\nid: decision-x\ntype: decision\ntitle: tagged badly\ntags: 7\n---\nbody\n")
    (folder / "mapping.md").write_text("---\ntitle: mapped\nfiles: {a: 1}\n---\nbody\n")
    (folder / "nested.md").write_text("---\ntitle: nested\ntags: [[a]]\n---\nbody\n")
    (folder / "listid.md").write_text("---\nid: [a, b]\ntitle: list id\n---\nbody\n")
    (folder / "unclosed.md").write_text("---\nid: [unclosed\n---\nbody\n")
    records, problems = load_records(project / ".ctx" / "knowledge", project)
    by_id = {r.id: r for r in records}
    assert sorted(by_id) == ["listed", "scalar"]
    assert (by_id["scalar"].tags, by_id["scalar"].files) == (["ops"], ["deploy.sh"])  # not ["o", "p", "s"]
    assert (by_id["listed"].tags, by_id["listed"].files) == (["a", "b"], ["src/app.py"])
    assert len(problems) == 5
    for name, words in [("number.md", "tags must be a list"), ("mapping.md", "files must be a list"),
                        ("nested.md", "tags must be a list"), ("listid.md", "id must be a single value"),
                        ("unclosed.md", "not valid YAML")]:
        assert any(name in p and words in p for p in problems), (name, problems)
    # The writers read the same files: a bad neighbour does not stop a new record.
    assert write(project, kit, "decision", *OTHER).status == "created"


def test_a_record_names_project_files_and_one_line_tags(project: Path, kit: dict[str, Any]) -> None:
    for files, tags, words in [(["/etc/passwd"], [], "outside the project"),
                               (["../../outside"], [], "outside the project"),
                               (["src/../../x"], [], "outside the project"),
                               (["deploy.sh"], ["ops\ninjected: yes"], "line break"),
                               (["deploy.sh"], ["  "], "empty")]:
        with pytest.raises(InputError, match=words):
            write(project, kit, "decision", TITLE, BODY, files=files, tags=tags)
    assert not (project / ".ctx" / "knowledge" / "decisions").exists()  # nothing was written
    done = write(project, kit, "decision", TITLE, BODY, tags=[" ops "],
                 files=[str(project / "src" / "app.py"), "./src/app.py", "docs/../deploy.sh"])
    front = yaml.safe_load((project / done.path).read_text().split("---")[1])
    assert (front["files"], front["tags"]) == (["src/app.py", "deploy.sh"], ["ops"])

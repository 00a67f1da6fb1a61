"""serve/api functions added for the web UI: knowledge revise/delete through the knowledge files,
and the effective settings with where each value came from (secrets never shown)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxlake.errors import InputError
from ctxlake.schemas.config import load_settings
from ctxlake.serve.api.context_search import project_knowledge, remember
from ctxlake.serve.api.knowledge_edit import delete, revise
from ctxlake.serve.api.memory_lake import MemoryLake
from ctxlake.serve.api.overview import MASK, effective_settings


@pytest.fixture
def project(make_repo: Callable[..., Path], fake_embedder: Any) -> Path:
    repo = make_repo({"a.py": "x = 1\n"})
    (repo / ".ctx").mkdir()
    return repo


def test_an_edit_is_a_new_version_that_supersedes_and_delete_restores_the_older(project: Path) -> None:
    settings = load_settings(project)
    first = remember(settings, "decision", "Use Postgres for the ledger", "ACID matters")
    other = remember(settings, "decision", "Deploy on Fridays never", "risk")
    edited = revise(settings, first.id, "Use Postgres 16 for the ledger", "ACID matters; 16 for MERGE")
    assert edited.status == "superseded" and edited.similar_to == first.id and edited.path
    current = {r.id: r for r in project_knowledge(MemoryLake(settings), limit=50).records}
    assert edited.id in current and first.id not in current
    assert current[edited.id].supersedes == first.id
    with pytest.raises(InputError, match="superseded"):
        revise(settings, first.id, "again", "")
    # Editing a record into a copy of another one is refused, nothing written.
    before = sorted((project / ".ctx" / "knowledge").rglob("*.md"))
    dup = revise(settings, edited.id, "Deploy on Fridays never", "risk")
    assert dup.status == "duplicate" and dup.similar_to == other.id
    assert sorted((project / ".ctx" / "knowledge").rglob("*.md")) == before
    with pytest.raises(InputError, match="nothing changed"):
        revise(settings, edited.id, "Use Postgres 16 for the ledger", "ACID matters; 16 for MERGE")
    assert delete(settings, edited.id).endswith(f"{edited.id}.md")
    current = {r.id for r in project_knowledge(MemoryLake(settings), limit=50).records}
    assert first.id in current and edited.id not in current
    with pytest.raises(InputError, match="no knowledge record"):
        delete(settings, "decision-20260101-deadbeef")


def test_effective_settings_say_where_each_value_came_from(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / ".ctx" / "config.toml").write_text("[search]\nlimit = 7\n[ui]\nport = 9911\n")
    monkeypatch.setenv("CTX_SEARCH_MODE", "keyword")
    monkeypatch.setenv("CTX_EMBED_PROVIDER", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-" + "a" * 40)
    settings = load_settings(project)
    values = {(v.section, v.key): v for v in effective_settings(settings)}
    assert (values["search", "limit"].value, values["search", "limit"].origin) == (7, "file")
    assert values["ui", "port"].origin == "file" and values["ui", "port"].value == 9911
    assert (values["search", "mode"].value, values["search", "mode"].origin) == ("keyword", "env")
    assert values["search", "mode"].detail == "CTX_SEARCH_MODE"
    assert values["search", "rrf_k"].origin == "default"
    assert values["embed", "api_key"].value == MASK and values["embed", "api_key"].hidden
    # Only secret names are hidden, not every name with "token" or "secret" in it.
    assert values["embed", "max_tokens"].value == settings.embed.max_tokens and not values["embed", "max_tokens"].hidden
    assert values["agents", "prompt_tokens"].value == settings.agents.prompt_tokens
    assert values["index", "secret_files"].value == settings.index.secret_files
    assert values["memory", "llm_api_key"].hidden and values["memory", "llm_api_key"].value is None  # not set
    assert "sk-test" not in repr([v.model_dump() for v in values.values()])
    flagged = effective_settings(settings, flags={"search": {"limit": 3}})
    assert next(v for v in flagged if (v.section, v.key) == ("search", "limit")).origin == "flag"

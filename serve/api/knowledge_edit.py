"""Write side of knowledge for the faces: revise and delete a record (.ctx/knowledge/ files), like `remember`."""

from __future__ import annotations

from collections.abc import Sequence

from ctxlake.schemas.config import Settings
from ctxlake.serve.api.memory_models import RememberResult


def revise(settings: Settings, record: str, title: str, body: str, tags: Sequence[str] | None = None) -> RememberResult:
    """A new version of `record` that supersedes it; `duplicate` (nothing written) when another record says the same."""
    from ctxlake.tasks.embed_cache import EmbeddingCache
    from ctxlake.tasks.embedders import make_embedder
    from ctxlake.tasks.knowledge_edit import revise_record

    embedder = make_embedder(settings.embed, settings.models_dir)
    cache = EmbeddingCache(settings.cache_dir, embedder.model_id, embedder.dims)
    result = revise_record(settings.knowledge_dir, settings.root, record, title, body, cache=cache, embedder=embedder,
                           duplicate_above=settings.memory.duplicate_threshold, tags=tags)
    return RememberResult(status=result.status, id=result.id, path=result.path, similar_to=result.similar_to,
                          similarity=result.similarity)


def delete(settings: Settings, record: str) -> str:
    """Delete a current record's file; returns its path (the index drops it at the next `ctx run ingest`)."""
    from ctxlake.tasks.knowledge_edit import delete_record

    return delete_record(settings.knowledge_dir, settings.root, record)

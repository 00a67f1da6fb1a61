"""Embedding profiles: a model name -> the query/document prefixes it was trained with (EmbedSettings defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from ctxlake.schemas.config import EmbedSettings


@dataclass(frozen=True)
class Prefixes:
    query: str
    document: str = ""


# Retrieval models are trained with instructions in front of queries (and some of documents);
# leaving them out costs them recall. Keys are lower-cased model names, matched on the name's
# last path component too, so a local copy `~/models/CodeRankEmbed` finds its entry.
KNOWN_PREFIXES: dict[str, Prefixes] = {
    "nomic-ai/coderankembed": Prefixes("Represent this query for searching relevant code: "),
    "nomic-ai/nomic-embed-code": Prefixes("Represent this query for searching relevant code: "),
    "nomic-ai/nomic-embed-text-v1": Prefixes("search_query: ", "search_document: "),
    "nomic-ai/nomic-embed-text-v1.5": Prefixes("search_query: ", "search_document: "),
    "baai/bge-small-en-v1.5": Prefixes("Represent this sentence for searching relevant passages: "),
    "baai/bge-base-en-v1.5": Prefixes("Represent this sentence for searching relevant passages: "),
    "baai/bge-large-en-v1.5": Prefixes("Represent this sentence for searching relevant passages: "),
    "intfloat/e5-small-v2": Prefixes("query: ", "passage: "),
    "intfloat/e5-base-v2": Prefixes("query: ", "passage: "),
    "intfloat/e5-large-v2": Prefixes("query: ", "passage: "),
    "intfloat/multilingual-e5-small": Prefixes("query: ", "passage: "),
    "intfloat/multilingual-e5-base": Prefixes("query: ", "passage: "),
    "snowflake/snowflake-arctic-embed-m-v1.5": Prefixes("Represent this sentence for searching relevant passages: "),
    "mixedbread-ai/mxbai-embed-large-v1": Prefixes("Represent this sentence for searching relevant passages: "),
    # Trained without instructions: listed so that a lookup says so rather than guessing.
    "jinaai/jina-embeddings-v2-base-code": Prefixes(""),
    "sentence-transformers/all-minilm-l6-v2": Prefixes(""),
}


def known_prefixes(model: str) -> Prefixes | None:
    name = model.strip().rstrip("/").lower()
    if name in KNOWN_PREFIXES:
        return KNOWN_PREFIXES[name]
    last = name.rsplit("/", 1)[-1]
    matches = [p for key, p in KNOWN_PREFIXES.items() if key.rsplit("/", 1)[-1] == last]
    return matches[0] if len(matches) == 1 else None


def with_profile_defaults(embed: EmbedSettings) -> EmbedSettings:
    """The settings with the model's known prefixes filled in, unless the user set either one."""
    if embed.query_prefix or embed.document_prefix:
        return embed
    found = known_prefixes(embed.model)
    if found is None or not (found.query or found.document):
        return embed
    return embed.model_copy(update={"query_prefix": found.query, "document_prefix": found.document})

"""Embedding profiles: known models get the query/document prefixes they were trained with."""

from __future__ import annotations

from pathlib import Path

from ctxlake.schemas.config import EmbedSettings
from ctxlake.tasks.profiles import known_prefixes, with_profile_defaults


def test_known_models_get_their_prefixes() -> None:
    code = with_profile_defaults(EmbedSettings(model="nomic-ai/CodeRankEmbed"))
    assert code.query_prefix == "Represent this query for searching relevant code: " and code.document_prefix == ""
    e5 = with_profile_defaults(EmbedSettings(model="intfloat/e5-base-v2"))
    assert (e5.query_prefix, e5.document_prefix) == ("query: ", "passage: ")
    # A local copy is found by its folder name.
    assert known_prefixes(str(Path("~/models/CodeRankEmbed"))) == known_prefixes("nomic-ai/CodeRankEmbed")


def test_user_prefixes_and_unknown_models_are_left_alone() -> None:
    mine = EmbedSettings(model="intfloat/e5-base-v2", query_prefix="q: ")
    assert with_profile_defaults(mine) is mine
    unknown = EmbedSettings(model="someone/some-model")
    assert with_profile_defaults(unknown) is unknown
    plain = EmbedSettings(model="jinaai/jina-embeddings-v2-base-code")
    assert with_profile_defaults(plain).query_prefix == ""


def test_document_prefix_reaches_the_model_id(tmp_path: Path) -> None:
    """The cache key changes with the document prefix, so e5 vectors never mix with unprefixed ones."""
    from ctxlake.tasks.embedder_base import _prefix_tag

    e5 = with_profile_defaults(EmbedSettings(model="intfloat/e5-base-v2"))
    assert _prefix_tag(e5) != "" and _prefix_tag(EmbedSettings(model="someone/x")) == ""

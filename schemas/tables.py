"""Arrow schemas of the lake's tables, each declared once with its key and version."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"


def _meta(key: str, doc: str) -> dict[bytes, bytes]:
    return {b"key": key.encode(), b"version": SCHEMA_VERSION.encode(), b"doc": doc.encode()}


# The Merkle manifest as a table: one row per indexed file of a source.
FILES = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),  # posix, relative to the source root
        pa.field("size", pa.int64(), nullable=False),
        pa.field("mtime_ns", pa.int64(), nullable=False),
        pa.field("hash", pa.string(), nullable=False),  # xxh3-128 hex of the bytes
        pa.field("lang", pa.string()),
        pa.field("n_chunks", pa.int32(), nullable=False),
        pa.field("indexed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ],
    metadata=_meta("source,path", "indexed files (the Merkle manifest)"),
)

# One row per chunk. `vector` is null until the embedder reaches the chunk, so a cold index is
# keyword-searchable before it is fully embedded. Its width is fixed per lake: see chunks_schema().
CHUNKS = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # hash(source, path, ordinal, content_hash)
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("lang", pa.string()),
        pa.field("kind", pa.string(), nullable=False),  # function | method | class | section | lines ...
        pa.field("symbol", pa.string()),  # qualified name, e.g. Flask.register_blueprint
        pa.field("start_line", pa.int32(), nullable=False),  # 1-based, inclusive
        pa.field("end_line", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("terms", pa.string(), nullable=False),  # path, symbol and split identifiers, for BM25
        pa.field("content_hash", pa.string(), nullable=False),  # xxh3-128 hex of text
        pa.field("vector", pa.list_(pa.float32())),
    ],
    metadata=_meta("id", "code and doc chunks with their vectors"),
)

# The content-addressed embedding cache, shared by every project of a user.
EMBEDDINGS = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("vector", pa.list_(pa.float32()), nullable=False),
    ],
    metadata=_meta("model_id,content_hash", "embedding cache: (model, content) -> vector"),
)


def with_vector_width(schema: pa.Schema, dims: int) -> pa.Schema:
    """The same schema with `vector` as a fixed-size list, as vector search requires."""
    i = schema.get_field_index("vector")
    old = schema.field(i)
    return schema.set(i, pa.field("vector", pa.list_(pa.float32(), dims), nullable=old.nullable))


def chunks_schema(dims: int) -> pa.Schema:
    return with_vector_width(CHUNKS, dims)


def embeddings_schema(dims: int) -> pa.Schema:
    return with_vector_width(EMBEDDINGS, dims)


CHUNK_KEY_COLUMNS = ["id", "source", "path", "content_hash"]

# Every file a scan saw (indexed or skipped), the fast-path snapshot of the Merkle tree. It lives
# in an Arrow IPC file beside the Lance tables so the "anything changed?" check needs pyarrow only.
MANIFEST = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("mtime_ns", pa.int64(), nullable=False),
        pa.field("hash", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # indexed | binary | too_large | unreadable
    ],
    metadata=_meta("path", "Merkle snapshot of one source's files"),
)

PROJECT_SOURCE = "project"  # the `source` of the project's own files; other sources are named by `ctx add`

# One row per source added with `ctx add`: what was fetched and how the last sync went. The
# declarations themselves (name, origin, ref, paths) live in .ctx/sources.toml, committed with the
# project; this table is their lake-side state and goes away with the lake.
SOURCES = pa.schema(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("type", pa.string(), nullable=False),  # git | local | web
        pa.field("origin", pa.string(), nullable=False),  # URL or absolute folder
        pa.field("ref", pa.string()),  # as asked: branch, tag or commit; null = default branch
        pa.field("ref_kind", pa.string()),  # branch | tag | commit | default (git only)
        pa.field("resolved", pa.string()),  # git: commit sha; web: digest of the saved pages
        pa.field("paths", pa.list_(pa.string()), nullable=False),
        pa.field("excludes", pa.list_(pa.string()), nullable=False),
        pa.field("root", pa.string(), nullable=False),  # the folder that was indexed
        pa.field("added_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),  # last sync that got content
        pa.field("status", pa.string(), nullable=False),  # ok | partial | failed
        pa.field("message", pa.string()),  # why failed or partial
    ],
    metadata=_meta("name", "sources added with `ctx add`: origin, resolved version, last sync"),
)

"""Arrow schemas of the lake's tables, each declared once with its key and version."""

from __future__ import annotations

import pyarrow as pa

# Re-exported: the tables' users import it from here.
from ctxlake.schemas.names import PROJECT_SOURCE as PROJECT_SOURCE

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
        pa.field("status", pa.string(), nullable=False),  # indexed | binary | too_large | unreadable | ... (tasks/merkle.py)
    ],
    metadata=_meta("path", "Merkle snapshot of one source's files"),
)

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

# -- conversation memory -------------------------------------------------------------------------
# Messages and sessions live in a user-wide lake (Settings.memory_dir): one agent tool's logs span
# many projects, so every row carries the project it belongs to and queries filter on it.

TOOL_CALL = pa.struct(
    [
        pa.field("id", pa.string()),  # the tool's call id, when it has one
        pa.field("name", pa.string()),
        pa.field("input", pa.string()),  # a one-line summary of the arguments, redacted
        pa.field("is_error", pa.bool_()),  # null: the outcome is not in this row
    ]
)

# One row per conversation record that carries content: a user prompt, an assistant reply or tool
# call, a tool result, a compaction marker, an API error. Text is redacted before it is stored.
MESSAGES = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # xxh3(tool, scope, the record's own id): resumed/forked copies collide
        pa.field("tool", pa.string(), nullable=False),  # claude | codex | gemini | cursor | copilot | opencode | antigravity
        pa.field("session_id", pa.string(), nullable=False),  # the tool's own session id
        pa.field("project_path", pa.string(), nullable=False),  # from the record's cwd; "" when unknown
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),  # order within the source file, for equal timestamps
        pa.field("role", pa.string(), nullable=False),  # user | assistant | tool | system
        pa.field("kind", pa.string(), nullable=False),  # text | tool_call | tool_result | compaction | error | summary | artifact
        pa.field("text", pa.string(), nullable=False),
        pa.field("terms", pa.string(), nullable=False),  # tool names and inputs, file paths: searchable beside text
        pa.field("tool_calls", pa.list_(TOOL_CALL)),
        pa.field("files", pa.list_(pa.string())),  # paths the record reads, writes or mentions
        pa.field("tokens_in", pa.int64()),  # de-duplicated: counted on one row per model response
        pa.field("tokens_out", pa.int64()),
        pa.field("tokens_cached", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("agent", pa.string()),  # subagent id for sidechain transcripts; null on the main thread
        pa.field("parent_id", pa.string()),  # the tool's parent record id (rewinds branch from it)
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),  # xxh3-128 hex of text (embedding cache key)
        pa.field("vector", pa.list_(pa.float32())),
    ],
    metadata=_meta("id", "agent conversation messages, redacted"),
)

NAME_COUNT = pa.struct([pa.field("name", pa.string()), pa.field("count", pa.int32())])

# One row per session segment: a tool's session split further where the conversation paused for
# longer than memory.gap_minutes. `text` is the rule-based summary that gets embedded and searched.
SESSIONS = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # the session ref: tool:session_id, then #2, #3 for later segments
        pa.field("tool", pa.string(), nullable=False),
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("segment", pa.int32(), nullable=False),  # 1-based
        pa.field("project_path", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("ended_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("n_messages", pa.int32(), nullable=False),
        pa.field("n_user", pa.int32(), nullable=False),
        pa.field("n_assistant", pa.int32(), nullable=False),
        pa.field("tokens_in", pa.int64(), nullable=False),
        pa.field("tokens_out", pa.int64(), nullable=False),
        pa.field("files", pa.list_(pa.string())),
        pa.field("tool_counts", pa.list_(NAME_COUNT)),
        pa.field("errors", pa.list_(pa.string())),
        pa.field("commits", pa.list_(pa.string())),  # "sha subject" of the project's commits in the window
        pa.field("first_messages", pa.list_(pa.string())),  # "role: text" of the first N user/assistant messages
        pa.field("last_messages", pa.list_(pa.string())),
        pa.field("open_tasks", pa.list_(pa.string())),
        pa.field("decisions", pa.list_(pa.string())),
        pa.field("llm_summary", pa.string()),  # optional LLM compaction; null when off or failed
        pa.field("text", pa.string(), nullable=False),  # the summary that is embedded and FTS-indexed
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("vector", pa.list_(pa.float32())),
    ],
    metadata=_meta("id", "conversation sessions with their rule-based compaction"),
)

# Knowledge records of one project, ingested from .ctx/knowledge/{decisions,errors,insights}/*.md
# (the files are the truth; this table is rebuilt from them) into the project's own lake.
KNOWLEDGE = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # from the file's front matter
        pa.field("type", pa.string(), nullable=False),  # decision | error | insight
        pa.field("title", pa.string(), nullable=False),
        pa.field("body", pa.string(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("supersedes", pa.string()),  # id of the record this one replaces
        pa.field("superseded_by", pa.string()),  # derived: the newer record that replaces this one
        pa.field("source_tool", pa.string()),
        pa.field("source_session", pa.string()),
        pa.field("files", pa.list_(pa.string())),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("path", pa.string(), nullable=False),  # the markdown file, relative to the project root
        pa.field("text", pa.string(), nullable=False),  # title + body, embedded and FTS-indexed
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("vector", pa.list_(pa.float32())),
    ],
    metadata=_meta("id", "project knowledge: decisions, error solutions, insights"),
)

KNOWLEDGE_TYPES = ("decision", "error", "insight")


# One row per index run (a `ctx run index`, a watcher batch): what the lake held when it ended,
# so analytics can draw the index's size over time. Appended only; small.
INDEX_RUNS = pa.schema(
    [
        pa.field("finished_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("files", pa.int64(), nullable=False),  # indexed files of every source, after the run
        pa.field("chunks", pa.int64(), nullable=False),
        pa.field("embedded", pa.int64(), nullable=False),  # chunks with a vector
        pa.field("lake_bytes", pa.int64(), nullable=False),  # the lake folder on disk
        pa.field("added", pa.int32(), nullable=False),
        pa.field("modified", pa.int32(), nullable=False),
        pa.field("removed", pa.int32(), nullable=False),
        pa.field("seconds", pa.float64(), nullable=False),
    ],
    metadata=_meta("finished_at,source", "one row per index run: the lake's size over time"),
)
INDEX_RUNS_TABLE = "index_runs"

# Pairs of files changed in the same commits of a source's git history (both directions stored).
# `weight` sums 2 ** ((commit time - t0) / half-life) over those commits: newer commits weigh more,
# and new commits add to it without re-reading old ones (readers divide by the newest commit's term).
COCHANGE = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("other", pa.string(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("commits", pa.int32(), nullable=False),  # commits that changed both
        pa.field("last_change", pa.timestamp("us", tz="UTC"), nullable=False),  # the newest of them
    ],
    metadata=_meta("source,path,other", "files changed together in git history (recency-weighted)"),
)
COCHANGE_TABLE = "cochange"

# The symbol graph (tasks/graph.py), replaced per file with the chunks: definitions, the names
# each file uses, and what it imports. Rows of a file are keyed by (source, path).
DEFINITIONS = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("qualname", pa.string(), nullable=False),  # e.g. Flask.register_blueprint
        pa.field("name", pa.string(), nullable=False),  # the last part of qualname
        pa.field("kind", pa.string(), nullable=False),  # function | method | class | struct ...
        pa.field("start_line", pa.int32(), nullable=False),  # 1-based, inclusive
        pa.field("end_line", pa.int32(), nullable=False),
        pa.field("signature", pa.string(), nullable=False),  # the definition's first line
        pa.field("doc", pa.string()),  # first line of its docstring or doc comment
        pa.field("parent", pa.string()),  # qualname of the enclosing definition
    ],
    metadata=_meta("source,path,qualname,start_line", "symbol definitions per file"),
)

REFERENCES = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("line", pa.int32(), nullable=False),  # 1-based
        pa.field("name", pa.string(), nullable=False),  # the identifier as written
        pa.field("enclosing", pa.string()),  # qualname of the definition it sits in
        pa.field("kind", pa.string(), nullable=False),  # call | attribute | name | import
    ],
    metadata=_meta("source,path,line,name", "identifier uses per file"),
)

IMPORTS = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("module", pa.string(), nullable=False),  # as written: os.path, ./util, <stdio.h>
        pa.field("resolved", pa.string()),  # the indexed file it names, or null
    ],
    metadata=_meta("source,path,module", "imports per file, resolved to files where possible"),
)

REFERENCE_KINDS = ("call", "attribute", "name", "import")

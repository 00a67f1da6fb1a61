"""The one typed settings object, and how it is loaded (schemas stage; no tables): CLI flag > env CTX_* > .ctx/config.toml > default."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ctxlake.errors import ConfigError
from ctxlake.schemas.roots import CONFIG_FILE, CTX_DIR, check_ctx_links, default_home

# Where each HTTP embedding provider's key comes from.
API_KEY_ENV = {"openai": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}
ENV_PREFIX = "CTX_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class IndexSettings(_Section):
    include: list[str] = Field(default_factory=list, description="globs to index; empty = every text file")
    exclude: list[str] = Field(default_factory=list, description="globs to skip, on top of .gitignore")
    max_file_bytes: int = Field(2_000_000, ge=1, description="larger files are skipped and counted")
    respect_gitignore: bool = True
    chunk_lines: int = Field(60, ge=5, description="line-window size for files without a grammar")
    chunk_overlap: int = Field(10, ge=0)
    max_chunk_lines: int = Field(150, ge=10, description="longer symbols are split")
    min_chunk_lines: int = Field(4, ge=1, description="shorter adjacent symbols are merged")
    secret_files: Literal["skip", "mask"] = Field(
        "skip", description="files that are secrets by name (.env*, *.pem, *.key, id_rsa*, credentials...): "
                            "skip = not indexed, counted; mask = indexed with every assigned value masked")
    graph: bool = Field(True, description="build the symbol graph (definitions, refs, imports) for ctx "
                                          "def/refs/related/outline; off: those tables are emptied")
    # Filled at load time, never from config.toml: ctxlake's own data folders (embedding cache,
    # clones, the trust store), skipped wherever they sit in an indexed tree.
    skip_dirs: list[str] = Field(default_factory=list, exclude=True)


class EmbedSettings(_Section):
    provider: str = Field("local", description="local | openai | gemini (or a registered provider)")
    # static by measurement (README, Retrieval quality): as good as MiniLM in hybrid search on the
    # dev set, and django embeds in under a minute instead of ~30 on two cores.
    model: str = Field("static", description="profile (static, minilm) or a model name/path")
    device: str = Field("auto", description="auto | cpu | cuda | mps")
    batch_size: int | Literal["auto"] = Field(
        "auto", description="texts per model batch; auto = 64 on CPU, on a GPU picked once from its free "
                            "memory and the model's size (the run report shows the pick)")
    precision: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="GPU only: float16/bfloat16 run the model in half precision (faster; vectors "
                               "differ slightly, so they get their own cache); a CPU always uses float32")
    max_tokens: int = Field(256, ge=16, description="inputs are truncated to this many tokens")
    query_prefix: str = Field("", description="text put before each query; empty = the model's known default")
    document_prefix: str = Field("", description="text put before each chunk; empty = the model's known default")
    trust_remote_code: bool = Field(
        False, description="let a sentence-transformers model run its own code (CodeRankEmbed, jina-code need it)")
    base_url: str | None = Field(None, description="HTTP providers: override the endpoint")
    dimensions: int | None = Field(None, description="HTTP providers that can shorten vectors")
    # Never written to config.toml: filled from OPENAI_API_KEY / GEMINI_API_KEY at load time.
    api_key: SecretStr | None = Field(None, exclude=True, repr=False)


class SearchSettings(_Section):
    mode: Literal["hybrid", "keyword", "semantic", "fuzzy"] = "hybrid"
    limit: int = Field(10, ge=1, le=200)
    bm25_weight: float = Field(0.7, ge=0.0, le=1.0, description="keyword share of the hybrid fusion")
    rrf_k: int = Field(60, ge=1)


class WatchSettings(_Section):
    debounce_ms: int = Field(500, ge=10)


class DocsSettings(_Section):
    paths: list[str] = Field(
        default_factory=lambda: ["docs"],
        description="documentation folders the MCP docs reader serves, relative to the project root",
    )
    extensions: list[str] = Field(
        default_factory=lambda: [".md", ".markdown", ".mdx", ".rst", ".txt"],
        description="file types the docs reader lists and reads; anything else is refused",
    )
    chunk_lines: int = Field(500, ge=20, le=500, description="docs_content returns at most this many lines")
    max_file_bytes: int = Field(5_000_000, ge=1, description="larger docs are listed but not read")


class McpSettings(_Section):
    port: int = Field(8765, ge=1, le=65535, description="`ctx serve --http` port (always on 127.0.0.1)")
    stale_check_s: float = Field(
        2.0, ge=0.0,
        description="when no file watcher runs: how long a freshness scan is reused (0 = scan on every call)",
    )
    max_response_chars: int = Field(
        60_000, ge=4_000, description="a tool answer is trimmed or paged to stay under this size"
    )

# What DuckDB reads as a memory size: 2GB, 512MiB, 0.5 GB, or a share of the machine's memory, 25%.
_MEMORY_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|[KMGT]i?B)\s*$", re.IGNORECASE)


class SqlSettings(_Section):
    """`ctx sql`: bounds for one statement, wherever it runs (the terminal or the service)."""

    timeout_s: float = Field(60.0, gt=0, description="a statement still running after this long is stopped")
    max_rows: int = Field(100_000, ge=1, description="rows kept from a result, whatever --limit asks")
    # DuckDB's own default is 80% of the machine's memory, and it spills to the current folder past it.
    memory_limit: str = Field(
        "25%", description="most memory DuckDB may take for a statement (2GB, 512MiB, or a share of the "
                           "machine's memory: 25%); a statement that needs more stops, nothing spills to disk")
    threads: int | Literal["auto"] = Field(
        "auto", description="DuckDB's worker threads for a statement; auto = half the CPU cores, at least 1")

    @field_validator("memory_limit")
    @classmethod
    def _memory_size(cls, value: str) -> str:
        found = _MEMORY_SIZE.match(value)
        if found is None or float(found.group(1)) <= 0 or (found.group(2) == "%" and float(found.group(1)) > 100):
            raise ValueError(f"{value!r} is no memory size: write one like 2GB or 512MiB, or a share of the "
                             "machine's memory up to 100%, like 25%")
        return value.strip()

    @field_validator("threads")
    @classmethod
    def _some_threads(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{value} threads: at least 1 (or auto)")
        return value


class ServiceSettings(_Section):
    autostart: bool = Field(
        False, description="a `ctx` command starts the service (`ctx up`) when it is not running"
    )
    idle_evict_s: float = Field(
        1800.0, ge=0.0, description="the service drops a project's open lake after this long unused"
    )
    schedules: bool = Field(
        True, description="the service starts a persistent Prefect server and serves the scheduled flows"
    )


class UiSettings(_Section):
    """The web UI the service serves on 127.0.0.1 (`ctx ui`)."""

    enabled: bool = Field(True, description="the service serves the web UI")
    # Not `ctx serve --http`'s 8765: with the service up, that command would find its port taken.
    port: int = Field(8766, ge=0, le=65535, description="preferred port (a free one is taken when it is busy; 0 = any)")


class SourcesSettings(_Section):
    max_files: int = Field(50_000, ge=1, description="a git source with more files (after --paths) is refused")
    max_bytes: int = Field(1_000_000_000, ge=1, description="a checked-out git source larger than this is refused")
    git_timeout_s: int = Field(900, ge=5, description="longest a git clone or fetch may run")
    web_max_pages: int = Field(500, ge=1, description="pages fetched per web source")
    web_max_page_bytes: int = Field(5_000_000, ge=1, description="a larger page is skipped and reported")
    web_max_total_bytes: int = Field(200_000_000, ge=1, description="a web source stops growing past this")
    web_concurrency: int = Field(8, ge=1, le=64, description="pages fetched at once")
    web_timeout_s: float = Field(30.0, gt=0, description="longest one page (or robots.txt) may take to arrive")
    web_include_optional: bool = Field(True, description="also fetch the links of an llms.txt 'Optional' section")
    web_user_agent: str = Field("ctxlake/0.1 (docs indexer; respects robots.txt)", description="sent with every request")


ASK_PROMPT = "Read {prompt_file} and answer the question in it, citing file paths under ./sources."
CHAT_PROMPT = "Read {prompt_file}: it describes the sources under ./sources. Then help me with them."


class AgentsSettings(_Section):
    default_agent: str = Field("claude-code", description="agent `ctx ask` and `ctx chat` run without --agent")
    timeout_s: int = Field(600, ge=1, description="`ctx ask` stops the agent after this long")
    max_output_bytes: int = Field(1_000_000, ge=1024, description="stdout/stderr kept per stream; the rest is dropped")
    prompt_tokens: int = Field(6000, ge=200, description="budget for the search hits written into prompt.md")
    hits: int = Field(20, ge=0, le=200, description="search hits considered for prompt.md")
    sandbox_dir: Path | None = Field(None, description="where ctx-<uuid>/ folders are made; default: the system temp dir")
    pass_env: list[str] = Field(
        default_factory=list,
        description="more environment variables an agent gets (names or globs, e.g. AWS_*); "
                    "by default only the basics, agents' own keys, proxies and CA bundles")
    # Split like a shell would (no shell runs); {prompt_file} and {mcp_config} are filled in.
    commands: dict[str, str] = Field(
        default_factory=lambda: {
            "claude-code": f'claude -p "{ASK_PROMPT}" --mcp-config {{mcp_config}} --strict-mcp-config',
            "gemini": f'gemini -p "{ASK_PROMPT}"',
            "opencode": f'opencode run "{ASK_PROMPT}"',
            "codex": f'codex exec --skip-git-repo-check -c mcp_servers={{}} "{ASK_PROMPT}"',
        },
        description="`ctx ask` command per agent",
    )
    chat_commands: dict[str, str] = Field(
        default_factory=lambda: {
            "claude-code": f'claude --mcp-config {{mcp_config}} --strict-mcp-config "{CHAT_PROMPT}"',
            "gemini": f'gemini -i "{CHAT_PROMPT}"',
            "opencode": f'opencode --prompt "{CHAT_PROMPT}"',
            "codex": f'codex -c mcp_servers={{}} "{CHAT_PROMPT}"',
        },
        description="`ctx chat` command per agent (runs in the terminal)",
    )

    @field_validator("sandbox_dir", mode="before")
    @classmethod
    def _empty_is_default(cls, value: Any) -> Any:
        return None if value in ("", None) else value

    @field_validator("commands", "chat_commands", mode="before")
    @classmethod
    def _add_to_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        # A [agents.commands] table in config.toml adds or replaces agents; the others stay.
        if not isinstance(value, dict):
            return value
        default = cls.model_fields[str(info.field_name)].get_default(call_default_factory=True)
        return {**default, **value}


class MemorySettings(_Section):
    """Conversation memory: where each agent tool keeps its logs, and how they are compacted."""

    roots: dict[str, str] = Field(
        default_factory=dict, description="store folder per scraper, e.g. { claude = \"~/backup/claude\" }")
    tools: list[str] = Field(default_factory=list, description="scrapers to run; empty = every registered one")
    gap_minutes: int = Field(30, ge=1, description="a pause longer than this starts a new session")
    compact_messages: int = Field(3, ge=1, le=20, description="first/last N messages kept in a session summary")
    max_text_chars: int = Field(20_000, ge=200, description="longer message texts are cut (tool output mostly)")
    max_file_mb: int = Field(1024, ge=1, description="log files larger than this are skipped and counted")
    max_line_mb: int = Field(64, ge=1, description="JSONL lines longer than this are skipped and counted")
    embed_messages: bool = Field(True, description="embed user/assistant messages (summaries and knowledge always are)")
    extract: bool = Field(True, description="propose knowledge candidates into .ctx/knowledge/inbox/")
    duplicate_threshold: float = Field(0.95, ge=0.0, le=1.0, description="similarity above which a knowledge write is a duplicate")
    supersede_threshold: float = Field(0.85, ge=0.0, le=1.0, description="similarity above which it supersedes the record")
    llm: Literal["off", "command", "ollama", "openai"] = Field("off", description="optional LLM compaction")
    llm_command: str = Field("", description="for llm = command: e.g. \"claude -p\" (prompt on stdin)")
    llm_url: str = Field("", description="for ollama / openai: the endpoint's base URL")
    llm_model: str = ""
    llm_timeout_s: float = Field(120.0, gt=0)
    # Never written to config.toml: filled from OPENAI_API_KEY at load time when llm = openai.
    llm_api_key: SecretStr | None = Field(None, exclude=True, repr=False)


class EvalSettings(_Section):
    mirrors: list[str] = Field(
        default_factory=list,
        description="folders holding git mirrors for `ctx eval` (owner+name/repo); never fetched",
    )
    include: list[str] = Field(default_factory=lambda: ["*.py"], description="the corpus `ctx eval` indexes")


def check_cron(value: str) -> str:
    """A five-field cron string, or ValueError saying why not (cronsim is what Prefect itself uses)."""
    from datetime import datetime

    from cronsim import CronSim, CronSimError

    if len(value.split()) != 5:
        raise ValueError(f"cron {value!r} needs 5 fields (minute hour day month weekday), got {len(value.split())}")
    try:
        CronSim(value, datetime(2026, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"invalid cron {value!r}: {exc}") from exc
    return value


class ScheduleSettings(_Section):
    """Defaults of the service's scheduled flows (`ctx up`); `ctx schedule set` changes the live ones."""

    # At least a minute and at most a year, as `ctx schedule set` (serve/service/schedules.py
    # MIN_EVERY_S, MAX_EVERY_S): each run is a process, and a longer one is a pause.
    ingest_every_s: float = Field(300.0, ge=60.0, le=366 * 86400.0, description="ingest_conversations interval")
    logs_debounce_s: float = Field(2.0, ge=0.0, description="agent log file events within this window (from the first) make one ingest run")
    sync_cron: str = Field("0 3 * * *", description="sync_sources: daily cron")
    index_every_s: float = Field(3600.0, ge=60.0, le=366 * 86400.0,
                                 description="index_code consistency run per registered project")
    max_failures: int = Field(3, ge=1, description="a deployment failing this many runs in a row is paused")
    max_parallel_runs: int = Field(2, ge=1, description="flow runs the service runs at once (each is a process)")

    @field_validator("sync_cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        return check_cron(value)


# Comms a distributed.Client can open (inproc is left out: it only reaches its own process).
DASK_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


class RunSettings(_Section):
    """Where the heavy index stages (chunk, graph, embed) run; the lake's one writer is always the flow."""

    executor: Literal["local", "dask"] = Field(
        "local", description="local = in the flow's process; dask = on the Dask cluster at dask_address")
    dask_address: str = Field(
        "local:2",
        description='for executor = "dask": a running scheduler (tcp://host:8786) or "local:N" for a '
                    "LocalCluster of N worker processes on this machine",
    )

    @field_validator("dask_address")
    @classmethod
    def _address(cls, value: str) -> str:
        value = value.strip()
        if value.startswith("local:"):
            count = value.removeprefix("local:")
            if not count.isdigit() or not 1 <= int(count) <= 256:
                raise ValueError(f'{value!r}: "local:N" needs a worker count N from 1 to 256')
            return value
        scheme, sep, rest = value.partition("://")
        if not sep:
            scheme, rest = "tcp", value
        host, colon, port = rest.rpartition(":")
        if scheme not in DASK_SCHEMES or not colon or not host or not port.isdigit():
            raise ValueError(f'{value!r} is neither "local:N" nor a scheduler address like tcp://host:8786 '
                             f"(schemes: {', '.join(DASK_SCHEMES)})")
        return f"{scheme}://{rest}"


class Settings(_Section):
    """Everything a command needs, resolved once at the entry point and passed down."""

    root: Path = Field(description="the project root (the folder holding .ctx/)")
    home: Path = Field(description="user-wide data: embedding cache, clones, distilled models")
    index: IndexSettings = Field(default_factory=IndexSettings)
    embed: EmbedSettings = Field(default_factory=EmbedSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    watch: WatchSettings = Field(default_factory=WatchSettings)
    docs: DocsSettings = Field(default_factory=DocsSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    sources: SourcesSettings = Field(default_factory=SourcesSettings)
    agents: AgentsSettings = Field(default_factory=AgentsSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    ui: UiSettings = Field(default_factory=UiSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    sql: SqlSettings = Field(default_factory=SqlSettings)

    @property
    def ctx_dir(self) -> Path:
        return self.root / CTX_DIR

    @property
    def lake_dir(self) -> Path:
        return self.ctx_dir / "lake"

    @property
    def config_path(self) -> Path:
        return self.ctx_dir / CONFIG_FILE

    @property
    def cache_dir(self) -> Path:
        return self.home / "embeddings"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def memory_dir(self) -> Path:
        """The user-wide conversation lake (messages, sessions of every project)."""
        return self.home / "memory"

    @property
    def knowledge_dir(self) -> Path:
        return self.ctx_dir / "knowledge"


SECTIONS: dict[str, type[_Section]] = {
    "index": IndexSettings,
    "embed": EmbedSettings,
    "search": SearchSettings,
    "watch": WatchSettings,
    "docs": DocsSettings,
    "mcp": McpSettings,
    "service": ServiceSettings,
    "sources": SourcesSettings,
    "agents": AgentsSettings,
    "memory": MemorySettings,
    "eval": EvalSettings,
    "schedule": ScheduleSettings,
    "ui": UiSettings,
    "run": RunSettings,
    "sql": SqlSettings,
}

MAX_CONFIG_BYTES = 1 << 20  # a config.toml is a few KiB; a link to /dev/zero or a huge file is not one


def read_config_bytes(path: Path) -> bytes:
    """A config.toml's bytes: a regular file (a link to one is followed), at most MAX_CONFIG_BYTES,
    opened without blocking (a FIFO there stopped every command)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb", buffering=0) as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path} is not a regular file", hint="make it a TOML file, or delete it for the defaults")
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_CONFIG_BYTES // 1024} KiB; not read as settings",
                          hint="a config.toml holds a few settings: trim it, or delete it for the defaults")
    return data


def _parse_toml(path: Path, content: bytes) -> dict[str, Any]:
    try:
        return tomllib.loads(content.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse {path}: {exc}") from exc


def read_project_config(root: Path, home: Path) -> dict[str, Any]:
    """The project's config.toml, less the command settings its content is not trusted for."""
    return _read_project_config(root, home)[0]


def _read_project_config(root: Path, home: Path) -> tuple[dict[str, Any], bool]:
    """(the filtered config, whether its content is trusted). Read once as bytes: the content
    parsed is the content whose hash is checked."""
    from ctxlake.schemas import trust

    path = root / CTX_DIR / CONFIG_FILE
    if not os.path.lexists(path):
        return {}, False
    content = read_config_bytes(path)
    data = trust.filter_untrusted(_parse_toml(path, content), path, content, home)
    return data, trust.is_trusted(path, content, home)


def _env_layer(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """CTX_<SECTION>_<FIELD>=value, e.g. CTX_EMBED_MODEL=static; lists are comma-separated."""
    layer: dict[str, dict[str, Any]] = {}
    for name, section in SECTIONS.items():
        for field, info in section.model_fields.items():
            key = f"{ENV_PREFIX}{name.upper()}_{field.upper()}"
            if key in env:
                value: Any = env[key]
                if info.annotation == list[str]:
                    value = [v.strip() for v in value.split(",") if v.strip()]
                elif info.annotation == dict[str, str]:  # KEY=VALUE,KEY=VALUE
                    value = dict(kv.split("=", 1) for kv in value.split(",") if "=" in kv)
                layer.setdefault(name, {})[field] = value
    return layer


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_settings(
    root: Path,
    overrides: dict[str, dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
) -> Settings:
    """Settings for the project at `root`: flags > CTX_* environment > .ctx/config.toml > defaults."""
    env = dict(os.environ) if env is None else env
    config_path = root / CTX_DIR / CONFIG_FILE
    check_ctx_links(root)
    from_file, trusted = _read_project_config(root, default_home(env))
    unknown = sorted(set(from_file) - set(SECTIONS))
    loose = [key for key in unknown if not isinstance(from_file[key], dict)]
    if loose:
        raise ConfigError(
            f"setting(s) {', '.join(loose)} outside any [section] in {config_path}",
            hint="uncomment the setting's [section] line too",
        )
    if unknown:
        raise ConfigError(
            f"unknown section(s) {', '.join(unknown)} in {config_path}",
            hint=f"known sections: {', '.join(SECTIONS)}",
        )
    env_layer = _env_layer(env)
    data = _merge(_merge(from_file, env_layer), overrides or {})
    if not any("paths" in layer.get("docs", {}) for layer in (env_layer, overrides or {})):
        # Docs folders from the file (or the default `docs`, which a clone can make a symlink)
        # stay inside the project unless the file is trusted; the user's own env and flags are not gated.
        from ctxlake.schemas import trust

        paths = data.get("docs", {}).get("paths", DocsSettings.model_fields["paths"].get_default(call_default_factory=True))
        if isinstance(paths, list):
            kept = trust.filter_docs_paths([str(p) for p in paths], root, config_path, trusted)
            if kept != paths:
                data = _merge(data, {"docs": {"paths": kept}})
    provider = str(data.get("embed", {}).get("provider", "local"))
    key_env = API_KEY_ENV.get(provider)
    if key_env and env.get(key_env):
        data = _merge(data, {"embed": {"api_key": env[key_env]}})
    if str(data.get("memory", {}).get("llm", "off")) == "openai" and env.get("OPENAI_API_KEY"):
        data = _merge(data, {"memory": {"llm_api_key": env["OPENAI_API_KEY"]}})
    home = default_home(env)
    from platformdirs import user_data_dir

    # Wherever an indexed tree holds them (an index of ~, a project that contains CTX_HOME): never
    # the embedding cache's Lance files, the clones or the trust store.
    skip = sorted({str(home), str(Path(user_data_dir("ctxlake", appauthor=False)).resolve())})
    data = _merge(data, {"index": {"skip_dirs": skip}})
    try:
        return Settings(root=root.resolve(), home=home, **data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(
            f"invalid settings ({problems})",
            hint=f"looked in CLI flags, {ENV_PREFIX}* environment variables and {config_path}",
        ) from exc


def default_config_toml() -> str:
    """The commented config written on first run: every setting with its default and meaning."""
    lines = [
        "# ctxlake project settings. Precedence: CLI flags > CTX_<SECTION>_<KEY> env > this file.",
        "# Every line below is commented out and shows the default. To change a setting, uncomment",
        "# it with its [section] line, or append your own [section] tables at the end: headers are",
        "# commented too, so a table added below is never declared twice.",
    ]
    for name, section in SECTIONS.items():
        lines += ["", f"# [{name}]"]
        for field, info in section.model_fields.items():
            if info.exclude:
                continue
            default = info.get_default(call_default_factory=True)
            if info.description:
                lines.append(f"# {info.description}")
            lines.append(f"# {field} = {_toml_value(default)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if value is None:
        return '""  # unset'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)

"""The one typed settings object, and how it is loaded: CLI flag > env CTX_* > .ctx/config.toml > default."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from ctxlake.errors import ConfigError, InputError

CTX_DIR = ".ctx"
# Where each HTTP embedding provider's key comes from.
API_KEY_ENV = {"openai": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}
CONFIG_FILE = "config.toml"
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


class EmbedSettings(_Section):
    provider: str = Field("local", description="local | openai | gemini (or a registered provider)")
    model: str = Field("minilm", description="profile (minilm, static) or a model name/path")
    device: str = Field("auto", description="auto | cpu | cuda | mps")
    batch_size: int = Field(64, ge=1)
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


class EvalSettings(_Section):
    mirrors: list[str] = Field(
        default_factory=list,
        description="folders holding git mirrors for `ctx eval` (owner+name/repo); never fetched",
    )
    include: list[str] = Field(default_factory=lambda: ["*.py"], description="the corpus `ctx eval` indexes")


class Settings(_Section):
    """Everything a command needs, resolved once at the entry point and passed down."""

    root: Path = Field(description="the project root (the folder holding .ctx/)")
    home: Path = Field(description="user-wide data: embedding cache, clones, distilled models")
    index: IndexSettings = Field(default_factory=IndexSettings)
    embed: EmbedSettings = Field(default_factory=EmbedSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    watch: WatchSettings = Field(default_factory=WatchSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

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


SECTIONS: dict[str, type[_Section]] = {
    "index": IndexSettings,
    "embed": EmbedSettings,
    "search": SearchSettings,
    "watch": WatchSettings,
    "eval": EvalSettings,
}


def default_home(env: dict[str, str] | None = None) -> Path:
    source = os.environ if env is None else env
    if source.get("CTX_HOME"):
        return Path(source["CTX_HOME"]).expanduser().resolve()
    from platformdirs import user_data_dir

    return Path(user_data_dir("ctxlake", appauthor=False))


def find_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds a .ctx/ folder, like git finds .git."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / CTX_DIR).is_dir():
            return folder
    return None


def git_toplevel(start: Path) -> Path | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(start), "rev-parse", "--show-toplevel"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else None


def resolve_root(path: Path | None, *, for_write: bool) -> Path:
    """The project root for a command.

    An explicit path is the root itself. Otherwise: the nearest ancestor with .ctx/, else (when
    the command creates an index) the enclosing git work tree, else the current folder.
    """
    if path is not None:
        if not path.exists():
            raise InputError(f"path does not exist: {path}")
        if not path.is_dir():
            raise InputError(f"not a folder: {path}", hint="ctx indexes folders")
        found = find_root(path)
        return found if (found is not None and not for_write) else path.resolve()
    cwd = Path.cwd()
    found = find_root(cwd)
    if found is not None:
        return found
    if for_write:
        return git_toplevel(cwd) or cwd.resolve()
    raise ConfigError(
        f"no ctxlake index in {cwd} or any parent folder (looked for {CTX_DIR}/)",
        hint="run `ctx run index` in the project first",
    )


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse {path}: {exc}") from exc


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
    from_file = _read_toml(config_path)
    unknown = sorted(set(from_file) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"unknown section(s) {', '.join(unknown)} in {config_path}",
            hint=f"known sections: {', '.join(SECTIONS)}",
        )
    data = _merge(_merge(from_file, _env_layer(env)), overrides or {})
    provider = str(data.get("embed", {}).get("provider", "local"))
    key_env = API_KEY_ENV.get(provider)
    if key_env and env.get(key_env):
        data = _merge(data, {"embed": {"api_key": env[key_env]}})
    try:
        return Settings(root=root.resolve(), home=default_home(env), **data)
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
        "# Every line below is commented out and shows the default.",
    ]
    for name, section in SECTIONS.items():
        lines += ["", f"[{name}]"]
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
    return str(value)

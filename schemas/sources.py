"""Source declarations: the model of one `ctx add`, and .ctx/sources.toml, the registry that holds them."""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ctxlake.errors import ConfigError, InputError
from ctxlake.schemas.config import IndexSettings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import CTX_DIR

SOURCES_FILE = "sources.toml"
# A source name becomes a folder name (sandbox links, snapshot files): one safe path component.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SourceType = Literal["git", "local", "web"]
# What `ctx add-docs` indexes of a folder or repository: documentation, not code.
DOC_GLOBS = ["*.md", "*.mdx", "*.markdown", "*.rst", "*.txt", "*.adoc", "*.asciidoc", "*.org"]

_HEADER = """\
# Sources this project searches besides its own files: `ctx add`, `ctx add-docs`, `ctx remove`.
# Commit this file; a teammate's `ctx update` fetches and indexes the same sources.
"""


def validate_name(name: str) -> str:
    """A source name that is safe as one path component and not the project's own."""
    if name == PROJECT_SOURCE:
        raise InputError(f"{PROJECT_SOURCE!r} is the project's own source name", hint="pick another name")
    if not NAME_RE.match(name) or name in (".", ".."):
        raise InputError(
            f"invalid source name {name!r}",
            hint="use letters, digits, '.', '_' or '-' (up to 64, starting with a letter or digit)",
        )
    return name


def clean_path(path: str) -> str:
    """A --paths entry as a relative posix path inside the source; nothing may point outside."""
    raw = path.strip().replace("\\", "/")
    if not raw or raw.startswith("/") or re.match(r"^[A-Za-z]:", raw):
        raise InputError(f"--paths entries are relative to the source root, got {path!r}")
    parts = [p for p in PurePosixPath(raw).parts if p not in (".", "")]
    if not parts or ".." in parts:
        raise InputError(f"--paths entry {path!r} leaves the source root")
    if parts[0][0] in "!#":
        raise InputError(f"--paths entry {path!r} cannot start with {parts[0][0]!r}")
    return "/".join(parts)


def _no_credentials(origin: str) -> None:
    """Refuse a URL that carries a password, or any user name over http(s) (a token often goes
    there): the origin is stored in .ctx/sources.toml, which is committed, and shown by `ctx list`,
    `ctx sql` and the prompt `ctx ask` writes. ssh's `ssh://git@host/...` names no secret."""
    if "://" not in origin:
        return
    try:
        parts = urlsplit(origin)
        user, password = parts.username, parts.password
    except ValueError:
        return
    if password is not None or (user and parts.scheme.lower() in ("http", "https")):
        shown = f"{parts.scheme}://***@{parts.hostname or ''}{parts.path}"
        raise InputError(f"origin {shown} holds credentials, which would be stored in .ctx/sources.toml "
                         "(committed with the project) and shown by `ctx list`",
                         hint="drop them from the URL: git finds them in a credential helper, ~/.netrc or "
                              "an ssh key")


class SourceSpec(BaseModel):
    """One declared source: where it comes from and which part of it is indexed."""

    model_config = ConfigDict(extra="forbid")

    name: str
    type: SourceType
    origin: str = Field(description="git URL, absolute folder, or web URL (llms.txt or a docs page)")
    ref: str | None = Field(None, description="git branch, tag or full commit sha; none = default branch")
    paths: list[str] = Field(default_factory=list, description="only these folders/files of the source")
    exclude: list[str] = Field(default_factory=list, description="globs to skip, on top of .gitignore")
    docs: bool = Field(False, description="added with add-docs: only documentation files are indexed")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name(value)

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(clean_path(p) for p in value))

    @field_validator("origin")
    @classmethod
    def _origin(cls, value: str) -> str:
        # git's `transport::address` hands the address to a remote helper: `ext::` runs it as a
        # command (allowed where the user's git config allows it), so a cloned sources.toml could
        # run anything. No source needs one; a leading dash would reach git as an option.
        if GIT_HELPER_RE.match(value.strip()):
            raise InputError(f"origin {value!r} goes through a git remote helper ({value.split('::', 1)[0]}::), "
                             "which can run commands: not accepted",
                             hint="use an https://, ssh://, git@host:path or file:// origin, or a folder")
        if value.strip().startswith("-"):
            raise InputError(f"invalid origin {value!r}: it would reach git as an option")
        _no_credentials(value.strip())
        return value

    @model_validator(mode="after")
    def _web_is_http(self) -> SourceSpec:
        # Anything else reached the fetcher and came back as "robots.txt unreachable: UnsupportedProtocol".
        if self.type == "web" and urlsplit(self.origin.strip()).scheme.lower() not in ("http", "https"):
            raise InputError(f"a web source needs an http:// or https:// URL, not {self.origin!r}",
                             hint="a folder is added as it is (`ctx add NAME PATH`), a repository by its git URL")
        return self

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        # A ref reaches git as an argument: refuse what git would read as an option.
        if value.startswith("-") or any(c.isspace() for c in value) or ".." in value:
            raise InputError(f"invalid --ref {value!r}")
        return value

    def index_settings(self, base: IndexSettings) -> IndexSettings:
        """The project's index settings narrowed to this source: its paths, doc globs, excludes.

        The project's own include/exclude globs describe the project's tree, not a library's,
        so they do not apply here; size limits and chunking do.
        """
        # Anchored patterns ("/docs/**"): a bare folder name as an include glob is matched
        # against file names only, so "docs" alone would include nothing.
        if self.paths and self.docs:
            include = [f"/{p}/**/{g}" for p in self.paths for g in DOC_GLOBS]
            include += [f"/{p}" for p in self.paths if any(PurePosixPath(p).match(g) for g in DOC_GLOBS)]
        elif self.paths:
            include = [pattern for p in self.paths for pattern in (f"/{p}", f"/{p}/**")]
        elif self.docs:
            include = list(DOC_GLOBS)
        else:
            include = []
        return base.model_copy(update={"include": include, "exclude": list(self.exclude)})


# git's `<transport>::<address>` syntax (ext::, fd::, any remote-<transport> helper).
GIT_HELPER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
# A git origin that names a remote (scheme://..., or scp-like host:path); anything else is a path here.
_REMOTE_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[^/]+:)", re.IGNORECASE)


def _origin_on_disk(spec: SourceSpec) -> str | None:
    """The origin as a path on this machine, as written (None for a remote or web source)."""
    if spec.type == "web":
        return None
    if spec.type == "git":
        if spec.origin[:7].lower() == "file://":
            # file://localhost/abs is /abs (RFC 8089), not a folder "localhost" in the project.
            parts = urlsplit(spec.origin)
            return unquote(parts.path if parts.netloc.lower() == "localhost" else spec.origin[7:])
        if _REMOTE_RE.match(spec.origin):
            return None
    return spec.origin


def origin_path(spec: SourceSpec, root: Path) -> Path | None:
    """The folder a local source indexes, or the repository a git source clones from this machine
    (a path or file://), resolved: `~` is the user's home, a relative origin is relative to the
    project root (the folder holding .ctx/), never to the current folder. None for remote sources."""
    text = _origin_on_disk(spec)
    return None if text is None else (root / Path(text).expanduser()).resolve()


def reads_outside(spec: SourceSpec, root: Path) -> Path | None:
    """The path outside the project a source would read on this machine, or None. Such a source
    declared in a cloned sources.toml is read only once the user trusts it (schemas/trust.py)."""
    text = _origin_on_disk(spec)
    if text is None:
        return None
    path = (root / Path(text).expanduser()).resolve()
    real_root = root.resolve()
    # git resolves a relative remote from its clone's folder, not from here: always outside.
    relative_git = spec.type == "git" and not Path(text).expanduser().is_absolute()
    if not relative_git and (path == real_root or real_root in path.parents):
        return None
    return path


def registry_path(root: Path) -> Path:
    return root / CTX_DIR / SOURCES_FILE


def is_trusted(spec: SourceSpec, root: Path, home: Path) -> bool:
    """Whether the project's sources.toml may make ctx read what `spec` reads: anything inside the
    project or remote, and outside folders the user added or trusted (`ctx add`, `ctx trust`)."""
    from ctxlake.schemas import trust

    return reads_outside(spec, root) is None or trust.source_trusted(
        registry_path(root), spec.name, spec.type, spec.origin, home)


def untrusted_sources(root: Path, home: Path) -> list[SourceSpec]:
    """The declared sources that read outside the project and are not trusted."""
    return [spec for spec in load_registry(root).values() if not is_trusted(spec, root, home)]


def trust_sources(root: Path, home: Path, specs: list[SourceSpec]) -> None:
    """Trust these sources, as declared now, to read outside the project (those that do)."""
    from ctxlake.schemas import trust

    chosen = [(s.name, s.type, s.origin) for s in specs if reads_outside(s, root) is not None]
    if chosen:
        trust.trust_sources(registry_path(root), home, chosen)


def load_registry(root: Path) -> dict[str, SourceSpec]:
    """The sources declared in `<root>/.ctx/sources.toml`, by name (empty when there is none)."""
    path = registry_path(root)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    table = data.get("sources", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [sources] must be a table of sources")
    out: dict[str, SourceSpec] = {}
    for name, body in table.items():
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: sources.{name} must be a table")
        try:
            out[name] = SourceSpec(name=name, **body)
        except (ValidationError, InputError) as exc:
            raise ConfigError(f"{path}: invalid source {name!r}: {_problem(exc)}") from exc
    return out


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return str(exc)


def save_source(root: Path, spec: SourceSpec) -> None:
    """Add or replace one source in sources.toml, keeping the rest of the file and its comments."""
    doc = _load_document(root)
    import tomlkit

    sources = doc.setdefault("sources", tomlkit.table(is_super_table=True))
    entry = tomlkit.table()
    body: dict[str, Any] = spec.model_dump(exclude={"name"}, exclude_defaults=True)
    body.setdefault("type", spec.type)
    body.setdefault("origin", spec.origin)
    for key in ("type", "origin", "ref", "paths", "exclude", "docs"):
        if key in body:
            entry[key] = body[key]
    sources[spec.name] = entry
    _write(registry_path(root), tomlkit.dumps(doc))


def drop_source(root: Path, name: str) -> bool:
    """Remove one source from sources.toml; False when it was not declared there."""
    path = registry_path(root)
    if not path.exists():
        return False
    doc = _load_document(root)
    sources = doc.get("sources")
    if not isinstance(sources, dict) or name not in sources:
        return False
    import tomlkit

    del sources[name]
    _write(path, tomlkit.dumps(doc))
    return True


def _load_document(root: Path) -> Any:
    import tomlkit

    path = registry_path(root)
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        doc = tomlkit.document()
        for line in _HEADER.splitlines():
            doc.add(tomlkit.comment(line.removeprefix("# ")))
        return doc
    except Exception as exc:  # tomlkit raises its own parse errors
        raise ConfigError(f"cannot parse {path}: {exc}") from exc


def _write(path: Path, text: str) -> None:
    # Same temp-and-rename as the lake's writes (schemas cannot import tasks/).
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc

"""The config registry's item: one skill, command, agent or rule, as written in `.ctx/registry/<kind>s/<name>.md`.

A registry file is markdown with YAML front matter (`name`, `description`, plus the fields of its kind);
the body is the skill's instructions, the command's prompt, the agent's system prompt or the rule's text.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ctxlake.errors import InputError

Kind = Literal["skill", "command", "agent", "rule"]
KINDS: tuple[Kind, ...] = ("skill", "command", "agent", "rule")
# Folder under .ctx/registry/ of each kind.
KIND_DIRS: dict[Kind, str] = {"skill": "skills", "command": "commands", "agent": "agents", "rule": "rules"}
REGISTRY_DIR = "registry"
# \Z, not $: "$" also matches before a final line break, and "ab\n" became a file name.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")
MAX_ITEM_BYTES = 256 * 1024


def check_name(name: str) -> str:
    """A registry name becomes a file name in several tools' folders: lower-case letters, digits, - and _ only."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InputError(f"invalid registry name {name!r}",
                         hint="use 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter or digit")
    return name


class ConfigItem(BaseModel):
    """One portable config item. Fields a kind does not use stay at their defaults and are not written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    name: str
    description: str = ""
    body: str = ""
    argument_hint: str | None = None  # command
    tools: list[str] = Field(default_factory=list)  # agent
    model: str | None = None  # agent
    globs: list[str] = Field(default_factory=list)  # rule
    always_apply: bool = False  # rule

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_name(v)
        except InputError as exc:
            raise ValueError(exc.message) from exc

    @field_validator("description")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return " ".join(v.split())

    def front_matter(self) -> dict[str, Any]:
        """The front matter of the registry file (snake_case keys, only the fields of this kind)."""
        fm: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.kind == "command" and self.argument_hint:
            fm["argument-hint"] = self.argument_hint
        if self.kind == "agent":
            if self.tools:
                fm["tools"] = list(self.tools)
            if self.model:
                fm["model"] = self.model
        if self.kind == "rule":
            if self.globs:
                fm["globs"] = list(self.globs)
            fm["always_apply"] = self.always_apply
        return fm

    def to_markdown(self) -> str:
        return render_front_matter(self.front_matter()) + normalize_body(self.body)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def normalize_body(body: str) -> str:
    """Bodies are compared after this: trailing spaces and blank edges removed, one final newline."""
    lines = [line.rstrip() for line in body.replace("\r\n", "\n").split("\n")]
    text = "\n".join(lines).strip("\n")
    return text + "\n" if text else ""


def render_front_matter(fm: dict[str, Any]) -> str:
    return "---\n" + dump_yaml(fm, sort_keys=False, allow_unicode=True, width=1000) + "---\n"


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors' aliases: front matter never needs them, and a 341-byte file of nested
    aliases (a "billion laughs") expanded without end when a value was turned into text."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(None, None, "aliases (*name) are not allowed here", event.start_mark)
        return super().compose_node(parent, index)


class _PlainDumper(yaml.SafeDumper):
    """Writes a value met twice (the same list under two keys) in full twice: load_yaml refuses aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any, **options: Any) -> str:
    return yaml.dump(data, Dumper=_PlainDumper, **options)


def load_yaml(text: str) -> Any:
    """`text` parsed as YAML (safe types, no aliases); yaml.YAMLError when it is not."""
    return yaml.load(text, Loader=_NoAliases)  # a SafeLoader: safe types only


def split_front_matter(text: str, label: str) -> tuple[dict[str, Any], str]:
    """(front matter, body) of a markdown file; a file without front matter has an empty one."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n")
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---", 3)
    if end < 0:
        raise InputError(f"{label}: front matter is not closed by '---'")
    raw = text[4:end]
    rest = text[end + 4:]
    rest = rest[1:] if rest.startswith("\n") else rest
    try:
        data = load_yaml(raw) if raw.strip() else {}
    except yaml.YAMLError as exc:
        raise InputError(f"{label}: front matter is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{label}: front matter must be a mapping")
    return data, rest


def _str_list(value: Any, label: str, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise InputError(f"{label}: '{key}' must be a string or a list of strings")


def parse_item(kind: Kind, text: str, label: str, default_name: str | None = None) -> ConfigItem:
    """Parse a registry file; `label` names it in errors."""
    fm, body = split_front_matter(text, label)
    known = {"name", "description", "argument-hint", "tools", "model", "globs", "always_apply"}
    unknown = sorted(set(fm) - known)
    if unknown:
        raise InputError(f"{label}: unknown front matter key(s) {', '.join(unknown)}",
                         hint=f"a {kind} takes: {', '.join(sorted(ConfigItem(kind=kind, name='x').front_matter()))}"
                         " and the optional fields of its kind")
    name = fm.get("name", default_name)
    if name is None:
        raise InputError(f"{label}: front matter has no 'name'")
    always = fm.get("always_apply", False)
    if not isinstance(always, bool):
        raise InputError(f"{label}: 'always_apply' must be true or false")
    try:
        return ConfigItem(
            kind=kind, name=str(name), description=str(fm.get("description") or ""), body=normalize_body(body),
            argument_hint=(str(fm["argument-hint"]) if fm.get("argument-hint") else None),
            tools=_str_list(fm.get("tools"), label, "tools"),
            model=(str(fm["model"]) if fm.get("model") else None),
            globs=_str_list(fm.get("globs"), label, "globs"), always_apply=always,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"{label}: {first.get('loc', ('?',))[0]}: {first['msg']}") from exc

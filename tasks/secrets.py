"""Secrets stage: text (a file's, a message's, a knowledge record's) -> the same text with each secret value
replaced by `[REDACTED:kind]`, before it is chunked, hashed, embedded or stored; and which files are
secrets by their name alone (skipped by the code scan unless the config opts in)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxlake.tasks.secret_rules import Span

MASK_PREFIX = "[REDACTED:"
MARK = MASK_PREFIX + "{}]"

# Languages whose source code assigns variables: there a bare value after `password =` is an
# expression (`password = form.cleaned_data[...]`), so only literals and random-looking values
# count. Everywhere else (.env, YAML, INI, shell, Markdown, conversation text) a bare value is a value.
_CODE_LANG_NAMES = ("python javascript typescript tsx go rust java c cpp csharp ruby php kotlin swift scala lua "
                    "dart elixir haskell ocaml r julia perl")
CODE_LANGS = frozenset(_CODE_LANG_NAMES.split())

# Files that are secrets by name: skipped by the code scan ([index] secret_files = "skip").
SECRET_FILE_GLOBS = (
    ".env", ".env.*", "*.env", ".envrc", ".flaskenv.local",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.keystore", "*.jks", "*.ppk", "*.kdbx", "*.asc",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    "credentials", "credentials.json", "credentials.yml", "credentials.yaml", "credentials.toml",
    "credentials.xml", "credentials.csv", "credentials.ini", ".git-credentials", "*.credentials",
    ".npmrc", ".pypirc", ".netrc", "_netrc", ".pgpass", ".dockercfg", "secrets.yml", "secrets.yaml",
    "secrets.json", "secrets.toml", "*.tfvars", "*.tfstate", "*.tfstate.backup", "service-account*.json",
)
# Committed on purpose and meant to be read: templates of a secret file, and public keys.
NOT_SECRET_FILE_GLOBS = (".env.example", ".env.sample", ".env.template", ".env.dist", ".env.defaults",
                         "*.env.example", "*.pub", "*.pub.asc")


# One regex per list: a scan asks for every file of the tree (fnmatch per glob cost 0.2 s on django).
_SECRET_NAME = re.compile("|".join(fnmatch.translate(g) for g in SECRET_FILE_GLOBS))
_NOT_SECRET_NAME = re.compile("|".join(fnmatch.translate(g) for g in NOT_SECRET_FILE_GLOBS))


def is_secret_file(path: str) -> bool:
    """Whether a path's file name alone says it holds secrets (`.env`, `id_rsa`, `*.pem`...)."""
    return is_secret_name(path.replace("\\", "/").rsplit("/", 1)[-1])


def skipped_as_secret(path: str, secret_files: str) -> bool:
    """Whether the scan leaves a file out for its name ([index] secret_files = "skip"): the one rule
    the indexer and the file readers (`ctx show`, get_file_context) share."""
    return secret_files == "skip" and is_secret_file(path)


def is_secret_name(name: str) -> bool:
    """is_secret_file for a bare file name (a scan has it already)."""
    name = name.lower()
    return _SECRET_NAME.match(name) is not None and _NOT_SECRET_NAME.match(name) is None


@dataclass
class MaskReport:
    """How many values one run masked, per kind."""

    masked: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, n: int = 1) -> None:
        self.masked += n
        self.by_kind[kind] = self.by_kind.get(kind, 0) + n

    def merge(self, other: MaskReport) -> None:
        for kind, n in other.by_kind.items():
            self.add(kind, n)


def _language(path: str | None) -> str | None:
    if not path:
        return None
    from ctxlake.tasks.chunk import language_for

    return language_for(path)


def find_secrets(text: str, path: str | None = None, strict: bool = False) -> list[Span]:
    """The secret spans of a text, overlaps merged, in order. `path` tells code from config (None:
    conversation text, read like config); `strict` masks every assigned value (a secret file)."""
    if not text:
        return []
    # Imported here: the detectors load detect-secrets (0.14 s), which the read path (scans for
    # freshness, `is_secret_file`) does not need.
    from ctxlake.tasks.secret_rules import find_spans

    return find_spans(text, _language(path) in CODE_LANGS, strict)


def apply_mask(text: str, spans: list[Span], report: MaskReport | None = None) -> str:
    """`text` with each span replaced by `[REDACTED:kind]`. The line breaks a span held are kept
    after the mark, so line numbers stay those of the file on disk."""
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for span in spans:
        out.append(text[pos:span.start])
        out.append(MARK.format(span.kind) + "\n" * text.count("\n", span.start, span.end))
        pos = span.end
        if report is not None:
            report.add(span.kind)
    out.append(text[pos:])
    return "".join(out)


def mask_text(text: str, path: str | None = None, report: MaskReport | None = None,
              strict: bool | None = None) -> str:
    """Every secret in `text` replaced by `[REDACTED:kind]`; the name before it stays searchable.
    A file that is a secret by its name is masked strictly (every assigned value)."""
    if strict is None:
        strict = path is not None and is_secret_file(path)
    return apply_mask(text, find_secrets(text, path, strict), report)


def mask_strings(values: Iterable[str], report: MaskReport | None = None) -> list[str]:
    return [mask_text(v, None, report) for v in values]



"""Domain errors: tasks raise these, the CLI maps each to one stderr line and an exit code."""

from __future__ import annotations


class CtxError(Exception):
    """Base of every error ctxlake reports to a user. `hint` says what to do next."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(CtxError):
    """Invalid or missing configuration; the message says where we looked."""

    exit_code = 3


class NotIndexedError(CtxError):
    """The project (or source) has no index yet."""

    exit_code = 4


class LockBusyError(CtxError):
    """Another process holds the lake's writer lock."""

    exit_code = 5


class ModelMismatchError(CtxError):
    """The index was built with another embedding model than the configuration names."""

    exit_code = 6


class EmbedderError(CtxError):
    """An embedding provider failed: missing key, HTTP error, model that cannot load offline."""

    exit_code = 7


class InputError(CtxError):
    """A path, query or argument a user gave cannot be used."""

    exit_code = 2


class UnknownFileError(InputError):
    """A file named by its path is not one the index holds (the CLI then tries the path another way)."""


class LakeError(CtxError):
    """The lake cannot be read or written (permissions, disk full, damaged table)."""

    exit_code = 8


class SourceError(CtxError):
    """A source could not be fetched or synced (git, HTTP, limits), or only partly (a web crawl)."""

    exit_code = 9


class AgentError(CtxError):
    """A subagent could not run: binary not on PATH, non-zero exit, timeout."""

    exit_code = 10


def error_document(message: str, hint: str | None, code: int) -> dict[str, object]:
    """What a `--json` command prints on stdout when it fails, the stderr lines' content as data."""
    return {"error": message, "hint": hint, "code": code}


def asks_json(argv: list[str]) -> bool:
    """True when the command was given `--json` (an option: before any `--`, after which every
    word is an argument, `ctx search -- --json` looks for the text)."""
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)

"""Identifier-aware terms for BM25: paths, symbols and camelCase split into words (CHUNKS.terms)."""

from __future__ import annotations

import functools
import re

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
# Boundaries inside an identifier: lower->Upper (getUser), ACRONYMWord (HTTPServer), letter<->digit.
_HUMP = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")


@functools.lru_cache(maxsize=65536)
def _split_cached(name: str) -> tuple[str, ...]:
    return tuple(split_identifier(name))


def split_identifier(name: str) -> list[str]:
    """`getUserById` -> [get, user, by, id]; `HTTPServer_v2` -> [http, server, v, 2]."""
    words: list[str] = []
    for part in _WORD_SPLIT.split(name):
        if part:
            words.extend(w.lower() for w in _HUMP.split(part) if w)
    return words


def path_words(path: str) -> list[str]:
    return [w for part in re.split(r"[/\\.]+", path) for w in split_identifier(part)]


def chunk_terms(path: str, symbol: str | None, text: str) -> str:
    """The `terms` field of a chunk: words the plain tokenizer would not produce from `text`.

    The FTS tokenizer already splits on punctuation and underscores, so `text` yields
    `register` and `blueprint` from `register_blueprint`; camelCase humps, the file's path and
    the symbol's qualified name are what it misses.
    """
    out = path_words(path)
    if symbol:
        out += split_identifier(symbol)
    # Each distinct identifier once (first-seen order); splits are cached across chunks.
    for ident in dict.fromkeys(_IDENT.findall(text)):
        if ident.islower() or ident.isupper():
            continue
        parts = _split_cached(ident)
        if len(parts) > 1:
            out += parts
    return " ".join(out)


def query_identifiers(query: str) -> list[str]:
    """Identifier-looking tokens of a query (camelCase, snake_case, dotted), longest first."""
    found = {m for m in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_]", query)
             if "_" in m or "." in m or _HUMP.search(m)}
    return sorted(found, key=len, reverse=True)

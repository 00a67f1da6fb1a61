"""Chunk stage: one file's text -> Chunk tuples (symbols, doc sections, line windows) for CHUNKS."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, cast

from tree_sitter import Node, Parser, Tree
from tree_sitter_language_pack import SupportedLanguage, get_parser

from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks.chunk_langs import (
    EXTENSIONS,
    FILENAMES,
    LANGS,
    LangSpec,
    describe,
    flat,
    members,
)


class Chunk(NamedTuple):
    kind: str  # function | method | class | interface | struct | enum | trait | impl | section ...
    symbol: str | None  # qualified with dots (Flask.register_blueprint); merged chunks: "a, b"
    start_line: int  # 1-based, inclusive
    end_line: int  # 1-based, inclusive
    text: str  # exactly those lines, joined with "\n" (a \r before a \n is dropped)


class ChunkOptions(NamedTuple):
    chunk_lines: int = 60  # line-window size when no grammar applies, and for split symbols
    chunk_overlap: int = 10
    max_chunk_lines: int = 150  # longer symbols are split
    min_chunk_lines: int = 4  # shorter adjacent symbols are merged

    @classmethod
    def from_settings(cls, index: IndexSettings) -> ChunkOptions:
        return cls(
            chunk_lines=index.chunk_lines,
            chunk_overlap=index.chunk_overlap,
            max_chunk_lines=index.max_chunk_lines,
            min_chunk_lines=index.min_chunk_lines,
        )


class ChunkResult(NamedTuple):
    chunks: list[Chunk]
    warning: str | None  # set when the file fell back to line windows
    tree: Tree | None = None  # the tree-sitter parse chunks came from: the graph stage reuses it


# (text, lang, opts) -> chunks. A chunker raises ValueError for text it cannot chunk;
# chunk_text then falls back to line windows and reports why.
ChunkerFn = Callable[[str, str, ChunkOptions], list[Chunk]]

DEFAULT_OPTIONS = ChunkOptions()

# More than this share of a file's bytes in top-level ERROR nodes means the grammar did not
# understand the file (wrong language, templating, garbage): its "symbols" would be noise.
MAX_ERROR_SHARE = 0.4
# Control characters and U+FFFD (undecodable bytes) in the first BINARY_SAMPLE characters.
MAX_BINARY_SHARE = 0.05
BINARY_SAMPLE = 8192
_BINARY = re.compile("[\x00-\x08\x0e-\x1f\x7f\ufffd]")

# An opened namespace's header glue up to this long joins its first member's chunk.
FOLDED_HEADER_LINES = 3
CONTAINER_KINDS = frozenset({"class", "struct", "interface", "trait", "impl", "enum", "object", "extension"})

# Lines that carry no meaning on their own: a blank gap, the closing brace of a split class
# (optionally with `// namespace x`) or an `#endif` joins the chunk before it.
_TRIVIAL = re.compile(r"\s*(?:[})\];,]+\s*(?:(?://|#).*)?|end;?|fi|done|esac|#\s*endif\b.*)?\s*")


class _Unparsable(ValueError):
    pass


class _Span(NamedTuple):
    """A symbol's rows (0-based, inclusive) before layout."""

    kind: str
    symbol: str | None
    start: int
    end: int
    container: Node | None  # the definition whose members may become chunks
    scope: str | None  # prefix for the members' names


@dataclass(slots=True)
class _Piece:
    kind: str
    symbol: str | None
    start: int
    end: int
    fixed: bool = False  # never merged with neighbours (windows, pieces of a split container)
    glue: bool = False  # code between symbols


class _Ctx(NamedTuple):
    lines: list[str]
    opts: ChunkOptions
    spec: LangSpec | None

    @property
    def window(self) -> int:
        return min(self.opts.chunk_lines, self.opts.max_chunk_lines)


# Parsers are not thread-safe; each thread gets its own, created once per language.
_local = threading.local()


def _parser(lang: str) -> Parser:
    cache: dict[str, Parser] | None = getattr(_local, "parsers", None)
    if cache is None:
        cache = _local.parsers = {}
    parser = cache.get(lang)
    if parser is None:
        parser = cache[lang] = get_parser(cast(SupportedLanguage, lang))
    return parser


def split_lines(text: str) -> list[str]:
    """Lines as tree-sitter counts rows: split on \\n only, a final newline ends the last line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    return lines


def _windows(start: int, end: int, size: int, overlap: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    first = start
    while True:
        last = min(first + size - 1, end)
        out.append((first, last))
        if last >= end:
            return out
        first = last + 1 - overlap


def _window_pieces(ctx: _Ctx, kind: str, symbol: str | None, start: int, end: int) -> list[_Piece]:
    return [
        _Piece(kind, symbol, s, e, fixed=True)
        for s, e in _windows(start, end, ctx.window, ctx.opts.chunk_overlap)
    ]


def _end_row(node: Node) -> int:
    # A node that swallows its trailing newline ends at column 0 of the next row.
    end = node.end_point
    return end.row if end.column > 0 or end.row == node.start_point.row else end.row - 1


def _attach(ctx: _Ctx, start: int, floor: int) -> int:
    """First row of the comments/attributes directly above `start` (no blank line between)."""
    prefixes = ctx.spec.comment_prefixes if ctx.spec is not None else ()
    row = start - 1
    while row >= floor:
        line = ctx.lines[row].lstrip()
        if not line.startswith(prefixes) or line.startswith("#!"):
            break
        row -= 1
    return row + 1


def _symbols(
    ctx: _Ctx, nodes: list[Node], floor: int, scope: str | None, methods: bool
) -> list[_Span]:
    """The definitions among sibling nodes, in order, disjoint, each with its doc comments."""
    assert ctx.spec is not None
    spec = ctx.spec
    last_row = len(ctx.lines) - 1
    out: list[_Span] = []
    for node in flat(nodes, spec):
        found = describe(node, spec)
        if found is None:
            continue
        # Two definitions on one line (`fun a() = 1; fun b() = 2`): the first one keeps it.
        start = max(node.start_point.row, floor)
        end = min(_end_row(node), last_row)
        if end < start:
            continue
        start = _attach(ctx, start, floor)
        kind = "method" if methods and found.kind == "function" else found.kind
        symbol = f"{scope}.{found.name}" if scope and found.name else found.name
        inner = found.node
        container = inner if inner.type in spec.containers else None
        out.append(_Span(kind, symbol, start, end, container, symbol or scope))
        floor = end + 1
    return out


def _expand(ctx: _Ctx, span: _Span) -> list[_Piece]:
    size = span.end - span.start + 1
    node = span.container
    if node is not None and ctx.spec is not None:
        opened = node.type in ctx.spec.namespaces
        inner = _symbols(
            ctx,
            members(node, ctx.spec),
            node.start_point.row + 1,
            span.scope,
            node.type in ctx.spec.method_parents,
        )
        # A class with several members is laid out member by member, so every method is a
        # symbol (`fuzzy_find`, precise line ranges); small pieces merge back below, so a short
        # class still reads as one chunk that lists its members' names.
        if inner and (opened or size > ctx.opts.max_chunk_lines or len(inner) >= 2):
            pieces = _layout(ctx, inner, span.start, span.end, span.kind, span.symbol, opened)
            for piece in pieces:
                piece.fixed = True
            return pieces
    if size > ctx.opts.max_chunk_lines:
        return _window_pieces(ctx, span.kind, span.symbol, span.start, span.end)
    return [_Piece(span.kind, span.symbol, span.start, span.end)]


def _glue(ctx: _Ctx, start: int, end: int, kind: str, symbol: str | None) -> list[_Piece]:
    if end - start + 1 > ctx.opts.max_chunk_lines:
        return _window_pieces(ctx, kind, symbol, start, end)
    return [_Piece(kind, symbol, start, end, glue=True)]


def _layout(
    ctx: _Ctx,
    spans: list[_Span],
    start: int,
    end: int,
    glue_kind: str,
    glue_symbol: str | None,
    fold_header: bool = False,
) -> list[_Piece]:
    """Pieces covering every row of [start, end]: symbols, and the glue code between them."""
    pieces: list[_Piece] = []
    cursor = start
    for span in spans:
        if span.start > cursor:
            pieces += _glue(ctx, cursor, span.start - 1, glue_kind, glue_symbol)
        pieces += _expand(ctx, span)
        cursor = span.end + 1
    if cursor <= end:
        pieces += _glue(ctx, cursor, end, glue_kind, glue_symbol)
    pieces = _absorb_trivial(ctx, pieces)
    head = pieces[0]
    short_head = head.glue and head.end - head.start < FOLDED_HEADER_LINES
    if fold_header and short_head and len(pieces) > 1:
        # `namespace geo {` alone says nothing; it reads better atop the first member.
        pieces[1].start = head.start
        del pieces[0]
    return _merge_small(pieces, ctx.opts)


def _trivial(lines: list[str], piece: _Piece) -> bool:
    return all(_TRIVIAL.fullmatch(line) for line in lines[piece.start : piece.end + 1])


def _absorb_trivial(ctx: _Ctx, pieces: list[_Piece]) -> list[_Piece]:
    """Glue of blank lines and closing braces joins the piece before it (else the one after)."""
    lines, limit = ctx.lines, ctx.opts.max_chunk_lines
    out: list[_Piece] = []
    pending: int | None = None
    for i, piece in enumerate(pieces):
        if piece.glue and _trivial(lines, piece):
            last = i == len(pieces) - 1
            if pending is None and out and (last or piece.end - out[-1].start < limit):
                out[-1].end = piece.end
            elif pending is None:
                pending = piece.start
            continue
        if pending is not None:
            piece.start, pending = pending, None
        elif piece.glue and out:
            # Blank lines after a symbol stay with it, so glue starts at its first statement.
            first = piece.start
            while first < piece.end and not lines[first].strip():
                first += 1
            if first - out[-1].start <= limit:
                out[-1].end, piece.start = first - 1, first
        out.append(piece)
    if pending is not None:
        if not out:  # nothing but trivial lines (and nothing changed): keep them as they were
            return pieces
        out[-1].end = pieces[-1].end
    return out


def _merge_small(pieces: list[_Piece], opts: ChunkOptions) -> list[_Piece]:
    """Runs of adjacent pieces each shorter than min_chunk_lines become one, up to chunk_lines."""
    out: list[_Piece] = []
    run: list[_Piece] = []
    for piece in pieces:
        small = not piece.fixed and piece.end - piece.start + 1 < opts.min_chunk_lines
        if small and run and piece.end - run[0].start + 1 <= opts.chunk_lines:
            run.append(piece)
            continue
        if run:
            out.append(_merged(run))
        run = [piece] if small else []
        if not small:
            out.append(piece)
    if run:
        out.append(_merged(run))
    return out


def _merged(run: list[_Piece]) -> _Piece:
    if len(run) == 1:
        return run[0]
    names = list(dict.fromkeys(p.symbol for p in run if p.symbol))
    kinds = {p.kind for p in run}
    # A class header merged with its short methods is still the class.
    kind = run[0].kind if len(kinds) == 1 or run[0].kind in CONTAINER_KINDS else "module"
    return _Piece(kind, ", ".join(names) or None, run[0].start, run[-1].end)


def _to_chunks(lines: list[str], pieces: list[_Piece]) -> list[Chunk]:
    return [
        Chunk(p.kind, p.symbol, p.start + 1, p.end + 1, "\n".join(lines[p.start : p.end + 1]))
        for p in pieces
    ]


def _check_parse(text: str, root: Node, lang: str) -> None:
    sample = text[:BINARY_SAMPLE]
    if len(_BINARY.findall(sample)) > MAX_BINARY_SHARE * len(sample):
        raise _Unparsable("text looks binary")
    if not root.has_error:
        return
    # Stray tokens directly under the root are as unparsed as ERROR nodes; errors nested in a
    # definition are not counted: one typo in a method must not cost the whole file its symbols.
    bad = sum(c.end_byte - c.start_byte for c in root.children if c.is_error or not c.is_named)
    if bad > MAX_ERROR_SHARE * max(root.end_byte, 1):
        raise _Unparsable(f"syntax errors cover {bad * 100 // max(root.end_byte, 1)}% of the file")


def parse(text: str, lang: str) -> Tree:
    # surrogatepass: text decoded with surrogateescape still parses (tree-sitter skips bad bytes).
    return _parser(lang).parse(text.encode("utf-8", "surrogatepass"))


def _tree_chunks(text: str, lang: str, opts: ChunkOptions, tree: Tree | None = None) -> list[Chunk]:
    """Code with a grammar: top-level symbols, opened into members only where needed."""
    lines = split_lines(text)
    root = (tree if tree is not None else parse(text, lang)).root_node
    _check_parse(text, root, lang)
    ctx = _Ctx(lines, opts, LANGS[lang])
    spans = _symbols(ctx, root.named_children, 0, None, False)
    return _to_chunks(lines, _layout(ctx, spans, 0, len(lines) - 1, "module", None))


def _line_chunks(text: str, lang: str, opts: ChunkOptions) -> list[Chunk]:
    lines = split_lines(text)
    if not lines:
        return []
    windows = _windows(0, len(lines) - 1, opts.chunk_lines, opts.chunk_overlap)
    return _to_chunks(lines, [_Piece("lines", None, s, e) for s, e in windows])


class _Heading(NamedTuple):
    row: int  # the title line
    last: int  # the underline, for setext/RST titles
    level: int
    title: str


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*")
_ATX_CLOSE = re.compile(r"(?:^|[ \t]+)#+$")
_SETEXT = re.compile(r" {0,3}(=+|-{2,})[ \t]*")
# Lines that cannot be a setext title: list items, quotes, indented code.
_NOT_TITLE = re.compile(r" {0,3}(?:[-*+]|\d+[.)])(?:\s|$)| {0,3}>| {4}|\t")


def _markdown_headings(lines: list[str]) -> list[_Heading]:
    heads: list[_Heading] = []
    first = 0
    if lines and lines[0].rstrip() == "---":  # YAML front matter is not a setext underline
        ends = (i + 1 for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "..."))
        first = next(ends, 0)
    fence: str | None = None
    title_above = False
    for row in range(first, len(lines)):
        line = lines[row]
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                fence = None
            title_above = False
            continue
        if (opened := _FENCE.match(line)) is not None:
            fence, title_above = opened.group(1), False
            continue
        if (atx := _ATX.fullmatch(line)) is not None:
            title = _ATX_CLOSE.sub("", atx.group(2) or "").strip()
            heads.append(_Heading(row, row, len(atx.group(1)), title))
            title_above = False
            continue
        if title_above and (under := _SETEXT.fullmatch(line)) is not None:
            level = 1 if under.group(1)[0] == "=" else 2
            heads.append(_Heading(row - 1, row, level, lines[row - 1].strip()))
            title_above = False
            continue
        title_above = bool(line.strip()) and _NOT_TITLE.match(line) is None
    return heads


_ADORNMENT = re.compile(r"([!-/:-@\[-`{-~])\1+[ \t]*")


def _rst_headings(lines: list[str]) -> list[_Heading]:
    """Titles underlined (and optionally overlined) with punctuation; levels in order of use."""
    styles: dict[tuple[str, bool], int] = {}
    heads: list[_Heading] = []
    row, count = 0, len(lines)
    while row < count:
        line = lines[row]
        above = row == 0 or not lines[row - 1].strip()
        if (
            _ADORNMENT.fullmatch(line)
            and row + 2 < count
            and lines[row + 1].strip()
            and lines[row + 2].rstrip() == line.rstrip()
        ):
            level = styles.setdefault((line[0], True), len(styles) + 1)
            heads.append(_Heading(row, row + 2, level, lines[row + 1].strip()))
            row += 3
            continue
        if (
            above
            and line.strip()
            and not line[0].isspace()
            and not _ADORNMENT.fullmatch(line)
            and row + 1 < count
            and _ADORNMENT.fullmatch(lines[row + 1])
        ):
            under = lines[row + 1].rstrip()
            if len(under) >= min(len(line.rstrip()), 4):
                level = styles.setdefault((under[0], False), len(styles) + 1)
                heads.append(_Heading(row, row + 1, level, line.strip()))
                row += 2
                continue
        row += 1
    return heads


def _section_spans(lines: list[str], heads: list[_Heading]) -> list[_Span]:
    """One span per heading up to the next; symbol = the heading path joined by " > "."""
    spans: list[_Span] = []
    path: list[tuple[int, str]] = []
    carry: int | None = None
    for i, head in enumerate(heads):
        while path and path[-1][0] >= head.level:
            path.pop()
        path.append((head.level, head.title))
        end = heads[i + 1].row - 1 if i + 1 < len(heads) else len(lines) - 1
        start = head.row if carry is None else carry
        # A heading with nothing under it but a deeper heading opens that section instead.
        empty = not any(lines[r].strip() for r in range(head.last + 1, end + 1))
        if empty and i + 1 < len(heads) and heads[i + 1].level > head.level:
            carry = start
            continue
        carry = None
        symbol = " > ".join(title for _, title in path if title) or None
        spans.append(_Span("section", symbol, start, end, None, None))
    return spans


def _doc_chunks(headings: Callable[[list[str]], list[_Heading]]) -> ChunkerFn:
    def chunk(text: str, lang: str, opts: ChunkOptions) -> list[Chunk]:
        lines = split_lines(text)
        ctx = _Ctx(lines, opts, None)
        spans = _section_spans(lines, headings(lines))
        return _to_chunks(lines, _layout(ctx, spans, 0, len(lines) - 1, "section", None))

    return chunk


CHUNKERS: dict[str, ChunkerFn] = {lang: _tree_chunks for lang in LANGS}
CHUNKERS["markdown"] = _doc_chunks(_markdown_headings)
CHUNKERS["rst"] = _doc_chunks(_rst_headings)
CHUNKERS["text"] = _line_chunks


def _sane(opts: ChunkOptions) -> ChunkOptions:
    """Hand-built options cannot loop forever: windows advance by at least half their size."""
    size = max(1, opts.chunk_lines)
    return ChunkOptions(
        chunk_lines=size,
        chunk_overlap=min(max(0, opts.chunk_overlap), size // 2),
        max_chunk_lines=max(1, opts.max_chunk_lines),
        min_chunk_lines=max(1, opts.min_chunk_lines),
    )


def chunk_text(text: str, lang: str | None, opts: ChunkOptions = DEFAULT_OPTIONS) -> ChunkResult:
    """One file's text (and language) -> its chunks; never raises, falls back to line windows.

    Empty or whitespace-only text has no chunks. Otherwise every line is in at least one chunk.
    """
    opts = _sane(opts)
    name = lang or "text"
    try:
        if not text.strip():
            return ChunkResult([], None)
        chunker = CHUNKERS.get(name, _line_chunks)
        if chunker is _tree_chunks:  # the parse is handed on with the chunks
            tree = parse(text, name)
            return ChunkResult(_tree_chunks(text, name, opts, tree), None, tree)
        return ChunkResult(chunker(text, name, opts), None)
    except Exception as exc:  # a grammar or chunker bug must not lose the file
        reason = str(exc) if isinstance(exc, _Unparsable) else f"{type(exc).__name__}: {exc}"
        warning = f"{name} parse failed ({reason}); fell back to line windows"
    try:
        return ChunkResult(_line_chunks(text, "text", opts), warning)
    except Exception as exc:
        return ChunkResult([], f"{warning}; line windows failed too ({exc})")


def language_for(path: str) -> str | None:
    """The language tag for a path, by well-known file name, then extension; None if unknown."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    if name in FILENAMES:
        return FILENAMES[name]
    if name.startswith("dockerfile."):
        return "dockerfile"
    stem, dot, ext = name.rpartition(".")
    return EXTENSIONS.get(ext) if dot and stem.strip(".") else None

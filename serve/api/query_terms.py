"""Query understanding: an issue text -> identifiers, dotted names, file paths and traceback frames."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ctxlake.tasks.terms import split_identifier

# `File "/x/y.py", line 12, in func` (CPython tracebacks).
_PY_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)(?:, in ([A-Za-z_<][\w<>.]*))?')
# `path/to/x.py:12: in func` / `x.py:12: Error` (pytest, compilers, linters).
_COLON_FRAME = re.compile(r"(?<![\w/.\\-])((?:[\w.-]+[/\\])*[\w.-]+\.[A-Za-z]{1,5}):(\d+)(?::\d+)?:(?: in ([A-Za-z_]\w*))?")
# A path-looking token with a source-file extension: a/b/c.py, c.py, ./x/y.js
_PATH = re.compile(r"(?<![\w.\\/-])((?:[\w.-]+[/\\])*[\w-]+\.(?:py|pyi|pyx|js|jsx|ts|tsx|go|rs|java|kt|rb|c|h|cc|cpp|hpp|cs|php|scala|swift|m|sh|toml|cfg|ini|yaml|yml|json|rst|md|txt))(?![\w/])")
# Dotted names: package.module.Class.method, self.attr.call
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w(]*\.\w)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_BACKTICKS = re.compile(r"`([^`\n]{1,200})`")
# A line of code, output or log rather than prose: a prompt, an indented block, a traceback (the
# mostly-punctuation lines are left out by query_prose itself).
_CODE_LINE = re.compile(r'^(?:\s{4,}|\t|>>>|\.\.\.|\$ |In \[\d+\]|Out\[\d+\]|File "|Traceback )')
# The lookbehind starts a match only at a word's first character and the possessive quantifiers
# never give characters back: without them a 200,000-character word took minutes (quadratic).
_CALL = re.compile(r"(?<!\w)([A-Za-z_]\w*+)\s*+\(")
_HUMP = re.compile(r"[a-z][A-Z]|[A-Z]{2}[a-z]")
# Words so common in issue prose and example code that matching them says nothing.
_STOP_WORDS = (
    "self cls args kwargs none true false print import from return def class lambda yield "
    "assert raise try except finally with as if elif else for while in is not and or pass "
    "break continue global nonlocal del async await object str int float bool list dict set "
    "tuple type len range open super isinstance getattr setattr hasattr np pd plt os sys re "
    "foo bar baz spam eggs x y z i j k n a b c d e f g t v df ax fig obj val value result res "
    "data test tests example code file line error warning the this that it py python"
)
STOP_IDENTIFIERS = frozenset(_STOP_WORDS.split())
MAX_LINE_REPEATS = 2
# Longest query searched as given; longer ones are cut (with a warning in the result), not
# refused, since agents paste logs. File ranking takes issue texts, which run longer.
MAX_QUERY_CHARS = 4_000
MAX_ISSUE_CHARS = 32_000


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str | None


@dataclass
class QueryAnalysis:
    """What an issue text names, each with how often it names it."""

    identifiers: Counter[str] = field(default_factory=Counter)  # code names, as written
    dotted: list[str] = field(default_factory=list)  # a.b.c names, in order of appearance
    paths: list[str] = field(default_factory=list)  # file paths, posix, in order of appearance
    frames: list[Frame] = field(default_factory=list)  # traceback frames, outermost first
    words: Counter[str] = field(default_factory=Counter)  # lower-cased words of the prose

    @property
    def code_like(self) -> bool:
        return bool(self.identifiers or self.paths or self.frames)


def is_code_identifier(token: str) -> bool:
    """snake_case, camelCase/PascalCase with an inner hump, or a dunder: clearly a name in code."""
    core = token.strip("_")
    if len(core) < 3:
        return False
    return "_" in core or bool(_HUMP.search(core)) or (token.startswith("__") and token.endswith("__"))


def squeeze_repeats(text: str, keep: int = MAX_LINE_REPEATS) -> str:
    """Drop lines that repeat an earlier line's shape (digits ignored) more than `keep` times.

    Pasted logs repeat one message hundreds of times; left in, they drown the few lines that
    say what the issue is about.
    """
    seen: Counter[str] = Counter()
    out = []
    for line in text.splitlines():
        shape = re.sub(r"\d+", "0", line.strip())
        seen[shape] += 1
        if not shape or seen[shape] <= keep:
            out.append(line)
    return "\n".join(out)


def bound_query(query: str, limit: int = MAX_QUERY_CHARS) -> tuple[str, str | None]:
    """(the query cut to at most `limit` characters, at a space when one is near; a warning when cut)."""
    if len(query) <= limit:
        return query, None
    cut = query[:limit]
    space = cut.rfind(" ", limit - 200)
    cut = cut[:space] if space > 0 else cut
    return cut, (f"the query is {len(query):,} characters: only its first {len(cut):,} were searched "
                 f"(the limit is {limit:,})")


def normalise_path(raw: str) -> str:
    path = raw.replace("\\", "/").strip().strip("'\"`")
    path = re.sub(r"^[A-Za-z]:/", "/", path)
    return path.lstrip("./") if not path.startswith("../") else path


def analyse(query: str) -> QueryAnalysis:
    """An issue text (or a short query) -> the names, paths and frames it mentions."""
    text = squeeze_repeats(query)
    out = QueryAnalysis()
    for m in _PY_FRAME.finditer(text):
        out.frames.append(Frame(normalise_path(m.group(1)), int(m.group(2)), m.group(3)))
    for m in _COLON_FRAME.finditer(text):
        out.frames.append(Frame(normalise_path(m.group(1)), int(m.group(2)), m.group(3)))
    for frame in out.frames:
        out.paths.append(frame.path)
    for m in _PATH.finditer(text):
        out.paths.append(normalise_path(m.group(1)))
    out.paths = list(dict.fromkeys(p for p in out.paths if p))

    # Inside code (fences, backticks) every name counts; in prose only names that look like code.
    code_spans = [m.group(0) for m in _CODE_FENCE.finditer(text)]
    code_spans += [m.group(1) for m in _BACKTICKS.finditer(_CODE_FENCE.sub(" ", text))]
    prose = _BACKTICKS.sub(" ", _CODE_FENCE.sub(" ", text))
    for m in _DOTTED.finditer(text):
        name = m.group(1)
        if all(len(part) < 3 for part in name.split(".")):
            continue  # e.g, i.e, a.b: abbreviations and throwaway names
        out.dotted.append(name)
    out.dotted = list(dict.fromkeys(out.dotted))

    for span in code_spans:
        for token in _WORD.findall(span):
            if len(token) >= 3 and token.lower() not in STOP_IDENTIFIERS:
                out.identifiers[token] += 1
    for token in _WORD.findall(prose):
        if is_code_identifier(token) and token.lower() not in STOP_IDENTIFIERS:
            out.identifiers[token] += 1
    for m in _CALL.finditer(prose):
        if len(m.group(1)) >= 3 and m.group(1).lower() not in STOP_IDENTIFIERS:
            out.identifiers[m.group(1)] += 1
    for name in out.dotted:
        for part in name.split("."):
            if len(part) >= 3 and part.lower() not in STOP_IDENTIFIERS:
                out.identifiers[part] += 1
    for frame in out.frames:
        if frame.function and not frame.function.startswith("<"):
            out.identifiers[frame.function] += 1
    for token in _WORD.findall(prose):
        for word in split_identifier(token):
            if len(word) >= 2:
                out.words[word] += 1
    return out


def query_title(query: str) -> str | None:
    """The first line of a multi-line query (an issue's title), when it has words of its own."""
    lines = [line.strip() for line in query.splitlines() if line.strip()]
    if len(lines) < 2 or len(lines[0].split()) < 2:
        return None
    return lines[0]


def query_prose(query: str) -> str | None:
    """The prose of an issue: its text without fenced code blocks and without lines that read as
    code, output or a log. None when that leaves no words beyond the title."""
    text = _CODE_FENCE.sub("\n", query)
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or _CODE_LINE.match(line):
            continue
        letters = sum(ch.isalpha() or ch.isspace() for ch in stripped)
        if letters < 0.7 * len(stripped):
            continue
        kept.append(stripped)
    if len(kept) < 2:
        return None
    return "\n".join(kept)


def dotted_to_paths(name: str) -> list[str]:
    """Module paths a dotted name may live in, longest first: a.b.C.m -> a/b/C/m.py, a/b/C.py, a/b.py ...

    Each prefix of two or more parts becomes `p.py` and `p/__init__.py`.
    """
    parts = name.split(".")
    out: list[str] = []
    for end in range(len(parts), 1, -1):
        stem = "/".join(parts[:end])
        out += [f"{stem}.py", f"{stem}/__init__.py"]
    return out

"""Ranking internals of the read side: query evidence (symbols, paths, frames) and chunk -> file scores over CHUNKS/FILES."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from ctxlake.serve.api.query_terms import QueryAnalysis, dotted_to_paths
from ctxlake.tasks.terms import split_identifier

# A path is a test file when a folder is named like a test folder or the file like a test module.
TEST_PATH = re.compile(
    r"(?:^|/)(?:tests?|testing|__tests__|spec|specs)/|(?:^|/)(?:test_[^/]*|[^/]*_tests?\.[A-Za-z]+|"
    r"conftest\.py|[^/]*\.(?:test|spec)\.[A-Za-z]+)$"
)
# Words that ask for tests: a query saying these keeps test files at full weight.
_TEST_WORDS = re.compile(r"\b(?:tests?|testing|unittest|pytest|fixtures?|conftest|spec)\b", re.I)


# A file of the lake: (source, path), since two sources may hold the same path.
FileKey: TypeAlias = tuple[str, str]


# `NAME = ...` or `NAME: type = ...` at the start of a line: a module-level definition.
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=\n]*)?=(?!=)", re.M)


def assigned_names(text: str) -> list[str]:
    """Names bound at module level in a chunk of code (`FILE_UPLOAD_PERMISSIONS = 0o644`)."""
    return list(dict.fromkeys(m.group(1) for m in _ASSIGNMENT.finditer(text) if len(m.group(1)) >= 3))


def is_test_path(path: str) -> bool:
    return bool(TEST_PATH.search(path))


@dataclass(frozen=True)
class RankOptions:
    """How a query becomes a ranking of files. Each switch is one retrieval technique: those on by
    default are in because the dev-set eval showed they help, the others were tried and showed no
    gain (ablation table: data/eval/swebench_lite_dev.md; `ctx eval --ablate` turns each one over
    in turn). Weights are round numbers, not fitted to the dev set."""

    title_list: bool = True  # BM25 of a multi-line query's first line (an issue's title) as its own list
    semantic_title: bool = True  # the semantic list embeds a multi-line query's title, not its whole text
    identifier_list: bool = True  # exact occurrences of the query's code names (phrase queries)
    symbol_evidence: bool = True  # bonus: files that define the names the query mentions
    path_evidence: bool = True  # bonus: files the query names (paths, traceback frames, dotted modules)
    stem_evidence: bool = True  # bonus: files named like a word of the query
    test_weight: float = 0.5  # score factor for test files when the query does not ask for tests
    import_neighbours: bool = False  # tried: files the top hits import (the symbol graph) gain
    cochange_neighbours: bool = False  # tried: files changed in the same commits as the top hits gain
    squeeze_logs: bool = False  # tried: drop repeated log lines from the keyword query
    file_sum_weight: float = 0.0  # tried: file score = best chunk + this share of its next chunks
    folder_share: float = 0.0  # tried: a folder named like a query word counts this much of a file name
    prose_list: bool = False  # tried: BM25 of the prose (code blocks and log lines dropped) as a list
    prose_weight: float = 1.0
    title_symbols: bool = False  # tried: files defining the names the title mentions gain once more
    title_stems: bool = False  # tried: modules named like a word of the title gain once more
    typo_stems: bool = False  # tried: a long query word one edit from a file's name counts as naming it
    title_calls: bool = False  # tried: files defining the first name the title calls (`ccode(sinc(x))`) gain
    score_fusion: bool = False  # tried: lists add their min-max scaled scores instead of 1 / (k + rank)
    file_sum_chunks: int = 3
    rrf_k: int = 60
    keyword_weight: float = 1.0
    title_weight: float = 1.0  # tried at 3 (+title_boost): helped the dev set, checked on held-out tasks
    identifier_weight: float = 1.0
    semantic_weight: float = 0.3
    # A bonus is weight * s / (s + scale) / (k + 1): `scale` is one typical strong piece of
    # evidence (a name defined in a handful of files ~ idf 5; one mention of a path), so weak
    # evidence adds little and strong evidence at most what a first place in a list adds.
    symbol_weight: float = 1.0
    symbol_scale: float = 5.0
    path_weight: float = 1.0
    path_scale: float = 1.0
    stem_weight: float = 0.5
    stem_scale: float = 5.0
    neighbour_hits: int = 5  # the top files whose imports gain
    neighbour_weight: float = 0.5
    neighbour_scale: float = 1.0
    cochange_weight: float = 0.5
    cochange_scale: float = 0.5
    pool: int = 300  # chunks each ranked list contributes before aggregation
    max_identifiers: int = 40

    def variant(self, name: str) -> RankOptions:
        """`-X`: these options with technique X switched off; `+X`: with tried technique X on."""
        changes: dict[str, dict[str, Any]] = {
            "-title_list": {"title_list": False},
            "-semantic_title": {"semantic_title": False},
            "-identifier_list": {"identifier_list": False},
            "-symbol_evidence": {"symbol_evidence": False},
            "-path_evidence": {"path_evidence": False},
            "-stem_evidence": {"stem_evidence": False},
            "-test_weight": {"test_weight": 1.0},
            "-semantic": {"semantic_weight": 0.0},
            "+squeeze_logs": {"squeeze_logs": True},
            "+file_sum": {"file_sum_weight": 0.2},
            "+folder_names": {"folder_share": 0.5},
            "+import_neighbours": {"import_neighbours": True},
            "+cochange": {"cochange_neighbours": True},
            "+title_boost": {"title_weight": 3.0},
            "+prose_list": {"prose_list": True},
            "+title_symbols": {"title_symbols": True},
            "+title_stems": {"title_stems": True},
            "+typo_stems": {"typo_stems": True},
            "+title_calls": {"title_calls": True},
            "+score_fusion": {"score_fusion": True},
        }
        if name not in changes:
            raise ValueError(f"unknown variant {name!r}; known: {', '.join(changes)}")
        return replace(self, **changes[name])

    def plain(self) -> RankOptions:
        """Plain BM25 collapsed to files (each file's best chunk): every technique off."""
        return replace(self, title_list=False, semantic_title=False, identifier_list=False, symbol_evidence=False,
                       path_evidence=False, stem_evidence=False, test_weight=1.0, squeeze_logs=False,
                       file_sum_weight=0.0, folder_share=0.0, import_neighbours=False,
                       cochange_neighbours=False, prose_list=False, title_symbols=False, title_stems=False,
                       typo_stems=False, title_calls=False, score_fusion=False)


TECHNIQUES = ("title_list", "semantic_title", "identifier_list", "symbol_evidence", "path_evidence", "stem_evidence",
              "test_weight", "semantic")
TRIED = ("squeeze_logs", "file_sum", "folder_names", "import_neighbours", "cochange", "title_boost", "prose_list",
         "title_symbols", "title_stems", "typo_stems", "title_calls", "score_fusion")
VARIANTS = tuple(f"-{t}" for t in TECHNIQUES) + tuple(f"+{t}" for t in TRIED)


# -- what the lake defines -------------------------------------------------------------------------


@dataclass
class LakeCatalog:
    """Every file path of a lake and the names each file defines, for exact-match evidence."""

    files: list[FileKey]
    defines: dict[str, set[FileKey]] = field(default_factory=dict)  # name -> files defining it
    by_stem: dict[str, set[FileKey]] = field(default_factory=dict)  # lower-case file stem -> files
    by_name: dict[str, set[FileKey]] = field(default_factory=dict)  # lower-case file name -> files
    by_folder: dict[str, set[FileKey]] = field(default_factory=dict)  # lower-case folder name -> files under it

    @classmethod
    def build(
        cls, symbols: Iterable[tuple[str, str, str | None]], assigned: Iterable[tuple[str, str, str]] = ()
    ) -> LakeCatalog:
        """(source, path, symbol) of every chunk, and (source, path, name) of module-level
        assignments (constants, settings, aliases) -> the catalog."""
        rows = list(symbols)
        catalog = cls(sorted({(source, path) for source, path, _ in rows}))
        defines: dict[str, set[FileKey]] = defaultdict(set)
        for source, path, name in assigned:
            defines[name].add((source, path))
        for source, path, symbol in rows:
            if not symbol:
                continue
            for qualified in symbol.split(","):
                qualified = qualified.strip()
                if not qualified:
                    continue
                defines[qualified].add((source, path))
                for part in qualified.split("."):
                    defines[part].add((source, path))
        by_stem: dict[str, set[FileKey]] = defaultdict(set)
        by_name: dict[str, set[FileKey]] = defaultdict(set)
        by_folder: dict[str, set[FileKey]] = defaultdict(set)
        for key in catalog.files:
            path = key[1]
            *folders, name = path.split("/")
            by_name[name.lower()].add(key)
            for folder in folders:
                by_folder[folder.lower()].add(key)
            stem = name.rsplit(".", 1)[0].lower()
            if stem == "__init__" and "/" in path:
                # A package's __init__ is named by its folder.
                stem = path.rsplit("/", 2)[-2].lower()
            by_stem[stem].add(key)
        catalog.defines, catalog.by_stem, catalog.by_name = dict(defines), dict(by_stem), dict(by_name)
        catalog.by_folder = dict(by_folder)
        return catalog

    def idf(self, df: int) -> float:
        return math.log(1.0 + len(self.files) / max(df, 1))


def symbol_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files defining the identifiers the query mentions, weighted by how rare each name is."""
    scores: dict[FileKey, float] = defaultdict(float)
    for name, count in analysis.identifiers.items():
        paths = catalog.defines.get(name)
        if not paths:
            continue
        weight = catalog.idf(len(paths)) * (1.0 + math.log(count))
        for path in paths:
            scores[path] += weight
    for dotted in analysis.dotted:
        # Class.method or module.function written out in full: a definition, named exactly.
        parts = dotted.split(".")
        for start in range(len(parts) - 1):
            paths = catalog.defines.get(".".join(parts[start:]))
            if paths:
                for path in paths:
                    scores[path] += catalog.idf(len(paths))
                break
    return dict(scores)


_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\(")


def called_name_scores(title: str, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files defining the first name a title calls (`ccode(sinc(x)) doesn't work` -> ccode), by
    how rare the name is: the subject of a one-line bug report."""
    for match in _CALL.finditer(title):
        name = match.group(1).rsplit(".", 1)[-1]
        paths = catalog.defines.get(name)
        if paths:
            return dict.fromkeys(paths, catalog.idf(len(paths)))
    return {}


def _suffix_matches(query_path: str, catalog: LakeCatalog) -> dict[FileKey, int]:
    """Lake files whose path ends with the query path's trailing parts -> parts matched."""
    parts = [p for p in query_path.split("/") if p and p not in (".", "..")]
    if not parts or "<" in query_path:
        return {}
    candidates = catalog.by_name.get(parts[-1].lower(), set())
    out: dict[FileKey, int] = {}
    for key in candidates:
        theirs = key[1].lower().split("/")
        matched = 0
        for a, b in zip(reversed(theirs), reversed([p.lower() for p in parts]), strict=False):
            if a != b:
                break
            matched += 1
        if matched:
            out[key] = matched
    return out


def path_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files the query names: by path (a traceback frame, a file name) or as a dotted module."""
    scores: dict[FileKey, float] = defaultdict(float)
    for query_path in analysis.paths:
        matches = _suffix_matches(query_path, catalog)
        if not matches:
            continue
        best = max(matches.values())
        winners = [p for p, m in matches.items() if m == best]
        # Each mention counts once, shared among the files it may mean: a bare name shared by
        # many files (base.py, __init__.py) says little about each.
        for path in winners:
            scores[path] += 1.0 / len(winners)
    for dotted in analysis.dotted:
        for candidate in dotted_to_paths(dotted):
            matches = {p: m for p, m in _suffix_matches(candidate, catalog).items()
                       if m == len(candidate.split("/"))}
            if matches:
                for path in matches:
                    scores[path] += 1.0 / len(matches)
                break
    return dict(scores)


def _mentioned_words(analysis: QueryAnalysis) -> dict[str, int]:
    """Lower-cased names and words of the query that could name a file or folder, with counts."""
    mentioned: dict[str, int] = defaultdict(int)
    for name, count in analysis.identifiers.items():
        mentioned[name.lower()] += count
        for part in split_identifier(name):
            if len(part) >= 4:
                mentioned[part] += count
    for word, count in analysis.words.items():
        if len(word) >= 4:
            mentioned[word] += count
    return mentioned


def _name_scores(mentioned: Mapping[str, int], index: Mapping[str, set[FileKey]], catalog: LakeCatalog) -> dict[FileKey, float]:
    scores: dict[FileKey, float] = defaultdict(float)
    for word, count in mentioned.items():
        paths = index.get(word)
        if not paths:
            continue
        weight = catalog.idf(len(paths)) * (1.0 + math.log(count))
        for path in paths:
            scores[path] += weight
    return dict(scores)


def stem_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files named like a word or identifier of the query (`latex` -> printing/latex.py)."""
    return _name_scores(_mentioned_words(analysis), catalog.by_stem, catalog)


def module_stem_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Modules (not packages' `__init__`) named like a word or identifier of the query."""
    return {key: s for key, s in stem_scores(analysis, catalog).items() if not key[1].endswith("__init__.py")}


def one_edit_apart(a: str, b: str) -> bool:
    """True when b is a with one letter added, dropped, changed, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) < len(b):
        return a[i:] == b[i + 1:]
    return a[i + 1:] == b[i + 1:] or (i + 1 < len(a) and a[i] == b[i + 1] and a[i + 1] == b[i] and a[i + 2:] == b[i + 2:])


TYPO_MIN_LETTERS = 7  # shorter words are one edit from too many names (`parse` / `parser`)


def typo_stem_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files named one edit away from a long query word that names no file itself (`matematica`
    -> mathematica.py)."""
    mentioned = {w: c for w, c in _mentioned_words(analysis).items()
                 if len(w) >= TYPO_MIN_LETTERS and w not in catalog.by_stem}
    if not mentioned:
        return {}
    near: dict[str, int] = defaultdict(int)
    for stem in catalog.by_stem:
        if len(stem) + 1 < TYPO_MIN_LETTERS:
            continue
        for word, count in mentioned.items():
            if one_edit_apart(word, stem):
                near[stem] += count
    return _name_scores(near, catalog.by_stem, catalog)


def folder_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files under a folder named like a word of the query (`autodoc_typehints` -> ext/autodoc/)."""
    return _name_scores(_mentioned_words(analysis), catalog.by_folder, catalog)


# -- chunks -> files --------------------------------------------------------------------------------


def file_scores(rows: Sequence[Mapping[str, Any]], sum_weight: float, sum_chunks: int) -> dict[FileKey, float]:
    """Ranked chunk rows -> one score per file: its best chunk plus a share of the next few."""
    by_file: dict[FileKey, list[float]] = defaultdict(list)
    for row in rows:
        by_file[(row["source"], row["path"])].append(float(row["_rank_score"]))
    out: dict[FileKey, float] = {}
    for path, scores in by_file.items():
        scores.sort(reverse=True)
        out[path] = scores[0] + sum_weight * sum(scores[1 : 1 + sum_chunks])
    return out


def rrf(lists: Sequence[tuple[Mapping[FileKey, float], float]], k: int) -> dict[FileKey, float]:
    """Weighted reciprocal-rank fusion of scored lists: each adds weight / (k + rank)."""
    fused: dict[FileKey, float] = defaultdict(float)
    for scores, weight in lists:
        if weight <= 0 or not scores:
            continue
        for rank, key in enumerate(sorted(scores, key=lambda p: (-scores[p], p)), start=1):
            fused[key] += weight / (k + rank)
    return dict(fused)


def scaled(lists: Sequence[tuple[Mapping[FileKey, float], float]], k: int) -> dict[FileKey, float]:
    """Score fusion: each list adds weight * (s - min) / (max - min) / (k + 1), so its first file
    counts what a first place counts in `rrf` and the rest by how close their scores come."""
    fused: dict[FileKey, float] = defaultdict(float)
    for scores, weight in lists:
        if weight <= 0 or not scores:
            continue
        low, high = min(scores.values()), max(scores.values())
        span = high - low
        for key, s in scores.items():
            fused[key] += weight * ((s - low) / span if span > 0 else 1.0) / (k + 1)
    return dict(fused)


def add_bonus(
    fused: dict[FileKey, float], evidence: Mapping[FileKey, float], weight: float, scale: float, k: int
) -> None:
    """Add saturating evidence: weight * s / (s + scale), in units of a first place in RRF."""
    if weight <= 0:
        return
    for key, s in evidence.items():
        if s > 0:
            fused[key] = fused.get(key, 0.0) + weight * (s / (s + scale)) / (k + 1)


def _top(fused: Mapping[FileKey, float], hits: int) -> list[FileKey]:
    return [key for key, _ in ordered(fused)[:hits]]


def _passed_down(top: Sequence[FileKey], links: Mapping[FileKey, Mapping[FileKey, float]]) -> dict[FileKey, float]:
    """Each file of `top` (best first) passes weight / rank to the files it links to, shared among
    them (divided by the square root of their count: a file linked to thirty says little about each)."""
    out: dict[FileKey, float] = defaultdict(float)
    for rank, key in enumerate(top, start=1):
        targets = links.get(key, {})
        for target, weight in targets.items():
            out[target] += weight / rank / math.sqrt(len(targets))
    return dict(out)


def neighbour_scores(fused: Mapping[FileKey, float], imports: Mapping[FileKey, set[FileKey]],
                     hits: int) -> dict[FileKey, float]:
    """Files imported by the best-ranked files, each import weighing 1 (a test that imports one
    module points at it)."""
    top = _top(fused, hits)
    return _passed_down(top, {key: dict.fromkeys(imports.get(key, ()), 1.0) for key in top})


def cochange_scores(fused: Mapping[FileKey, float], cochange: Mapping[FileKey, Mapping[FileKey, float]],
                    hits: int) -> dict[FileKey, float]:
    """Files changed together with the best-ranked files, each pair weighing its strength (0..1)."""
    return _passed_down(_top(fused, hits), cochange)


def wants_tests(query: str) -> bool:
    """True when the query asks about tests themselves (a short query naming them)."""
    return len(query.split()) <= 12 and bool(_TEST_WORDS.search(query))


def down_weight_tests(scores: Mapping[FileKey, float], factor: float) -> dict[FileKey, float]:
    return {key: s * factor if is_test_path(key[1]) else s for key, s in scores.items()}


def ordered(scores: Mapping[FileKey, float]) -> list[tuple[FileKey, float]]:
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))

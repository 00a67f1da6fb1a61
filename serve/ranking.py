"""Ranking internals of the read side: query evidence (symbols, paths, frames) and chunk -> file scores over CHUNKS/FILES."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from ctxlake.tasks.query_terms import QueryAnalysis, dotted_to_paths

# A path is a test file when a folder is named like a test folder or the file like a test module.
TEST_PATH = re.compile(
    r"(?:^|/)(?:tests?|testing|__tests__|spec|specs)/|(?:^|/)(?:test_[^/]*|[^/]*_tests?\.[A-Za-z]+|"
    r"conftest\.py|[^/]*\.(?:test|spec)\.[A-Za-z]+)$"
)
# Words that ask for tests: a query saying these keeps test files at full weight.
_TEST_WORDS = re.compile(r"\b(?:tests?|testing|unittest|pytest|fixtures?|conftest|spec)\b", re.I)


# A file of the lake: (source, path), since two sources may hold the same path.
FileKey: TypeAlias = tuple[str, str]


def is_test_path(path: str) -> bool:
    return bool(TEST_PATH.search(path))


@dataclass(frozen=True)
class RankOptions:
    """How a query is turned into a ranking. Each switch is one retrieval technique, kept only
    where the dev-set eval showed it helps (see data/eval/ablation.md); the ablation turns them
    off one at a time."""

    squeeze_logs: bool = True  # drop repeated log lines from the keyword query
    symbol_evidence: bool = True  # files that define the names the query mentions
    path_evidence: bool = True  # files the query names: paths, traceback frames, dotted modules
    stem_evidence: bool = True  # files whose name is a word or identifier of the query
    test_weight: float = 0.5  # score factor for test files when the query does not ask for tests
    file_sum_weight: float = 0.2  # file score = best chunk + this share of the next chunks
    file_sum_chunks: int = 3  # how many further chunks of a file add to its score
    rrf_k: int = 60
    keyword_weight: float = 1.0
    semantic_weight: float = 0.3
    symbol_weight: float = 1.0
    path_weight: float = 1.0
    stem_weight: float = 0.5
    pool: int = 300  # chunks each ranked list contributes before aggregation

    def without(self, technique: str) -> RankOptions:
        """These options with one technique switched off (for ablations)."""
        off: dict[str, Any] = {
            "squeeze_logs": {"squeeze_logs": False},
            "symbol_evidence": {"symbol_evidence": False},
            "path_evidence": {"path_evidence": False},
            "stem_evidence": {"stem_evidence": False},
            "test_weight": {"test_weight": 1.0},
            "file_sum": {"file_sum_weight": 0.0},
        }
        if technique not in off:
            raise ValueError(f"unknown technique {technique!r}; known: {', '.join(off)}")
        return replace(self, **off[technique])


TECHNIQUES = ("squeeze_logs", "symbol_evidence", "path_evidence", "stem_evidence", "test_weight", "file_sum")


# -- what the lake defines -------------------------------------------------------------------------


@dataclass
class LakeCatalog:
    """Every file path of a lake and the names each file defines, for exact-match evidence."""

    files: list[FileKey]
    defines: dict[str, set[FileKey]] = field(default_factory=dict)  # name -> files defining it
    by_stem: dict[str, set[FileKey]] = field(default_factory=dict)  # lower-case file stem -> files
    by_name: dict[str, set[FileKey]] = field(default_factory=dict)  # lower-case file name -> files

    @classmethod
    def build(cls, symbols: Iterable[tuple[str, str, str | None]]) -> LakeCatalog:
        """(source, path, symbol) of every chunk -> the catalog."""
        rows = list(symbols)
        catalog = cls(sorted({(source, path) for source, path, _ in rows}))
        defines: dict[str, set[FileKey]] = defaultdict(set)
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
        for key in catalog.files:
            path = key[1]
            name = path.rsplit("/", 1)[-1]
            by_name[name.lower()].add(key)
            stem = name.rsplit(".", 1)[0].lower()
            if stem == "__init__" and "/" in path:
                # A package's __init__ is named by its folder.
                stem = path.rsplit("/", 2)[-2].lower()
            by_stem[stem].add(key)
        catalog.defines, catalog.by_stem, catalog.by_name = dict(defines), dict(by_stem), dict(by_name)
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
        # A bare file name shared by many files (base.py, __init__.py) says little about each.
        for path in winners:
            scores[path] += best / len(winners)
    for dotted in analysis.dotted:
        for candidate in dotted_to_paths(dotted):
            matches = {p: m for p, m in _suffix_matches(candidate, catalog).items()
                       if m == len(candidate.split("/"))}
            if matches:
                for path in matches:
                    scores[path] += len(candidate.split("/")) / len(matches)
                break
    return dict(scores)


def stem_scores(analysis: QueryAnalysis, catalog: LakeCatalog) -> dict[FileKey, float]:
    """Files named like a word or identifier of the query (`latex` -> printing/latex.py)."""
    scores: dict[FileKey, float] = defaultdict(float)
    mentioned: dict[str, int] = defaultdict(int)
    for name, count in analysis.identifiers.items():
        mentioned[name.lower()] += count
    for word, count in analysis.words.items():
        if len(word) >= 4:
            mentioned[word] += count
    for stem, count in mentioned.items():
        paths = catalog.by_stem.get(stem)
        if not paths:
            continue
        weight = catalog.idf(len(paths)) * (1.0 + math.log(count))
        for path in paths:
            scores[path] += weight
    return dict(scores)


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


def wants_tests(query: str) -> bool:
    """True when the query asks about tests themselves (a short query naming them)."""
    return len(query.split()) <= 12 and bool(_TEST_WORDS.search(query))


def down_weight_tests(scores: Mapping[FileKey, float], factor: float) -> dict[FileKey, float]:
    return {key: s * factor if is_test_path(key[1]) else s for key, s in scores.items()}


def ordered(scores: Mapping[FileKey, float]) -> list[tuple[FileKey, float]]:
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))

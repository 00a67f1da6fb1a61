"""Retrieval metrics for file localisation: ranked files + gold files -> Acc@k, Recall@k, MRR, bootstrap CIs."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ACC_KS = (1, 3, 5, 10)
RECALL_K = 20
METRICS = (*(f"acc@{k}" for k in ACC_KS), f"recall@{RECALL_K}", "mrr")
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20261122
CONFIDENCE = 0.95


def first_gold_rank(ranked: Sequence[str], gold: Iterable[str]) -> int | None:
    """1-based rank of the first gold file in `ranked`, or None when none is listed."""
    wanted = set(gold)
    for rank, path in enumerate(ranked, start=1):
        if path in wanted:
            return rank
    return None


def score_ranking(
    ranked: Sequence[str], gold: Sequence[str], ks: Sequence[int] = ACC_KS, recall_k: int = RECALL_K
) -> dict[str, float]:
    """One task's ranked files and gold files -> its metric values (each in [0, 1]).

    Acc@k counts a task as solved only when *every* gold file is in the top k (the strict reading
    used for SWE-bench localisation; with one gold file it is plain hit@k). Recall@k is the share
    of gold files in the top k. MRR uses the first gold file found; 0 when none is ranked.
    Duplicate paths in `ranked` count once, at their best rank.
    """
    if not gold:
        raise ValueError("a task needs at least one gold file")
    ranked = list(dict.fromkeys(ranked))
    wanted = set(gold)
    position = {path: i for i, path in enumerate(ranked, start=1) if path in wanted}
    out: dict[str, float] = {}
    for k in ks:
        out[f"acc@{k}"] = float(len(position) == len(wanted) and max(position.values()) <= k)
    out[f"recall@{recall_k}"] = sum(1 for r in position.values() if r <= recall_k) / len(wanted)
    first = min(position.values(), default=None)
    out["mrr"] = 1.0 / first if first is not None else 0.0
    return out


@dataclass(frozen=True)
class Estimate:
    """A mean with its bootstrap confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_ci(
    values: Sequence[float],
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> Estimate:
    """Mean of `values` with a percentile bootstrap interval (tasks resampled with replacement).

    Seeded, so a report is reproducible; with one value (or all equal) the interval is a point.
    """
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = sum(values) / n
    if n == 1 or min(values) == max(values):
        return Estimate(mean, mean, mean, n)
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    tail = (1.0 - confidence) / 2.0
    return Estimate(mean, _quantile(means, tail), _quantile(means, 1.0 - tail), n)


def summarise(
    per_task: Sequence[Mapping[str, float]], metrics: Sequence[str] = METRICS, samples: int = BOOTSTRAP_SAMPLES
) -> dict[str, Estimate]:
    """Per-task metric values -> each metric's mean and bootstrap CI over the tasks."""
    return {m: bootstrap_ci([row[m] for row in per_task], samples=samples) for m in metrics}


def paired_difference(
    a: Sequence[float], b: Sequence[float], samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
) -> Estimate:
    """Mean of a - b over the same tasks, with a paired bootstrap CI (for ablations)."""
    if len(a) != len(b):
        raise ValueError("paired values need the same tasks on both sides")
    return bootstrap_ci([x - y for x, y in zip(a, b, strict=True)], samples=samples, seed=seed)

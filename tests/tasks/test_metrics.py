"""Retrieval metrics against hand-computed cases: Acc@k, Recall@20, MRR, bootstrap intervals."""

from __future__ import annotations

import math

import pytest

from ctxlake.tasks.metrics import (
    METRICS,
    bootstrap_ci,
    first_gold_rank,
    paired_difference,
    score_ranking,
    summarise,
)


def test_single_gold_file_at_rank_three() -> None:
    ranked = ["a.py", "b.py", "gold.py", "c.py"]
    assert score_ranking(ranked, ["gold.py"]) == {
        "acc@1": 0.0, "acc@3": 1.0, "acc@5": 1.0, "acc@10": 1.0, "recall@20": 1.0, "mrr": pytest.approx(1 / 3),
    }
    assert first_gold_rank(ranked, ["gold.py"]) == 3


def test_gold_file_missing_scores_zero_everywhere() -> None:
    scores = score_ranking(["a.py", "b.py"], ["gold.py"])
    assert scores == dict.fromkeys(METRICS, 0.0)
    assert first_gold_rank(["a.py"], ["gold.py"]) is None


def test_two_gold_files_need_both_for_accuracy() -> None:
    # Gold at ranks 2 and 7: Acc@k needs every gold file within k; MRR takes the first.
    ranked = [f"f{i}.py" for i in range(1, 25)]
    ranked[1], ranked[6] = "g1.py", "g2.py"
    scores = score_ranking(ranked, ["g1.py", "g2.py"])
    assert scores["acc@1"] == 0.0 and scores["acc@3"] == 0.0 and scores["acc@5"] == 0.0
    assert scores["acc@10"] == 1.0
    assert scores["recall@20"] == 1.0
    assert scores["mrr"] == pytest.approx(0.5)
    # One gold file beyond 20: recall is half, Acc@10 fails.
    ranked[6], ranked[21] = "f7.py", "g2.py"
    scores = score_ranking(ranked, ["g1.py", "g2.py"])
    assert scores["recall@20"] == 0.5 and scores["acc@10"] == 0.0 and scores["mrr"] == pytest.approx(0.5)


def test_duplicates_in_a_ranking_count_once_at_their_best_rank() -> None:
    # a.py twice must not push the gold file from rank 2 to rank 3.
    assert score_ranking(["a.py", "a.py", "gold.py"], ["gold.py"])["mrr"] == pytest.approx(0.5)


def test_no_gold_is_an_error() -> None:
    with pytest.raises(ValueError):
        score_ranking(["a.py"], [])


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible() -> None:
    values = [1.0] * 6 + [0.0] * 4  # mean 0.6
    est = bootstrap_ci(values, samples=4000)
    assert est.mean == pytest.approx(0.6) and est.n == 10
    # For a proportion of 0.6 over 10 tasks the percentile interval is about 0.3..0.9.
    assert 0.2 <= est.low <= 0.4 and 0.8 <= est.high <= 1.0
    assert est.low < est.mean < est.high
    assert bootstrap_ci(values, samples=4000) == est  # seeded


def test_bootstrap_degenerate_cases() -> None:
    assert bootstrap_ci([0.5, 0.5, 0.5]).low == 0.5 == bootstrap_ci([0.5, 0.5, 0.5]).high
    empty = bootstrap_ci([])
    assert empty.n == 0 and math.isnan(empty.mean)


def test_summarise_means_by_hand() -> None:
    per_task = [
        score_ranking(["g.py"], ["g.py"]),  # rank 1
        score_ranking(["a", "b", "c", "d", "g.py"], ["g.py"]),  # rank 5
        score_ranking(["a"], ["g.py"]),  # missing
    ]
    summary = summarise(per_task, samples=200)
    assert summary["acc@1"].mean == pytest.approx(1 / 3)
    assert summary["acc@5"].mean == pytest.approx(2 / 3)
    assert summary["mrr"].mean == pytest.approx((1 + 0.2 + 0) / 3)


def test_paired_difference() -> None:
    diff = paired_difference([1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0])
    assert diff.mean == pytest.approx(0.5)
    assert diff.low >= 0.0  # never worse on any task, so the interval cannot go below zero
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 0.0])

"""SQuAD-style answer scoring against values worked out by hand."""

from __future__ import annotations

import pytest
from agentgym_env_search.metrics import best_scores, exact_match, normalize_answer, token_f1


def test_normalize_lowercases_strips_punctuation_articles_and_spaces():
    # lower -> "the  eiffel-tower!"; punctuation -> "the  eiffeltower"; article -> "eiffeltower"
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("  A Tale of Two Cities ") == "tale of two cities"
    assert normalize_answer("Theatre") == "theatre"  # "the" only as a whole word


def test_exact_match_compares_normalized_strings():
    assert exact_match("the Beatles.", "Beatles") == 1.0
    assert exact_match("1889", "1889") == 1.0
    assert exact_match("1889 AD", "1889") == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "f1"),
    [
        # pred {stanley, kubrick}, gold {kubrick}: P = 1/2, R = 1 -> 2 * 1/2 / (3/2) = 2/3
        ("Stanley Kubrick", "Kubrick", 2 / 3),
        # pred {new, york, city}, gold {york, new}: P = 2/3, R = 1 -> (4/3) / (5/3) = 0.8
        ("new york city", "York New", 0.8),
        # multiset overlap: pred {paris: 2}, gold {paris: 1}: common 1, P = 1/2, R = 1 -> 2/3
        ("Paris Paris", "Paris", 2 / 3),
        # pred {the, year, 1889} -> {year, 1889}; gold {1889}: P = 1/2, R = 1 -> 2/3
        ("the year 1889", "1889", 2 / 3),
        # no common token
        ("Lyon", "Paris", 0.0),
        # a prediction that normalizes to nothing scores 0 against a real answer
        ("The", "Paris", 0.0),
        ("Victor Hugo", "victor hugo", 1.0),
    ],
)
def test_token_f1_hand_worked(prediction, gold, f1):
    assert token_f1(prediction, gold) == pytest.approx(f1)


def test_best_scores_take_the_best_gold_answer_for_each_metric():
    # EM 1 against "Kubrick"; F1 1 against "Kubrick" (2/3 against the full name)
    assert best_scores("Kubrick", ["Stanley Kubrick", "Kubrick"]) == (1.0, 1.0)
    # EM 0 against both; F1 best is "Mary Shelley" -> P = 1, R = 1/2 -> 2/3 (vs 0 for "Percy")
    em, f1 = best_scores("Shelley", ["Mary Shelley", "Percy"])
    assert em == 0.0 and f1 == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="at least one gold answer"):
        best_scores("x", [])

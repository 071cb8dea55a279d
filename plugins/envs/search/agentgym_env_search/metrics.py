"""Answer scoring as in SQuAD's official evaluation script: exact match and token F1.

Both compare normalized strings: lowercased, punctuation removed, the
articles "a", "an", "the" removed, whitespace collapsed. Against several gold
answers the best score counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of precision and recall of normalized tokens (a multiset overlap)."""
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision = common / len(predicted)
    recall = common / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_scores(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of `prediction`, each the best over the gold answers."""
    if not golds:
        raise ValueError("at least one gold answer is needed")
    em = max(exact_match(prediction, gold) for gold in golds)
    f1 = max(token_f1(prediction, gold) for gold in golds)
    return em, f1

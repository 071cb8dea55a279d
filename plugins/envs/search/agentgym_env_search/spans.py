"""The `spans` action space: every action the agent may take, built from what it has read.

A from-scratch tiny model cannot spell a name it never saw in training, so
free-text search fails on held-out questions. Listing the actions lets
constrained decoding turn writing into pointing: a query or answer is a span
of the question or of a passage, and a program is the difference of two
numbers read. Like a copy mechanism, it generalises to unseen names because
what is learnt is where to point, not what to spell.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_WORD = re.compile(r"[A-Z][a-z]?\.(?=\s)|\w+(?:['’.\-]\w+)*")
_NUMBER = re.compile(r"\d+")


def words(text: str) -> list[str]:
    """Words of `text`, with inner hyphens, apostrophes, dots (Al-Shafi'i) and initials (J.)."""
    return _WORD.findall(text)


def spans(texts: Iterable[str], max_words: int) -> list[str]:
    """Every run of 1..`max_words` consecutive words within one text, first occurrence first.

    Spans never cross texts, so a query cannot join the question's last word to
    a passage's first.
    """
    found: dict[str, None] = {}
    for text in texts:
        seq = words(text)
        for start in range(len(seq)):
            for length in range(1, min(max_words, len(seq) - start) + 1):
                found[" ".join(seq[start : start + length])] = None
    return list(found)


def differences(texts: Iterable[str]) -> list[str]:
    """`print(a - b)` for every pair of distinct whole numbers read, the larger first."""
    numbers: dict[int, None] = {}
    for text in texts:
        for word in words(text):
            if _NUMBER.fullmatch(word):
                numbers[int(word)] = None
    values = sorted(numbers, reverse=True)
    return [f"print({a} - {b})" for i, a in enumerate(values) for b in values[i + 1 :]]


def span_actions(texts: Iterable[str], max_words: int, *, python: bool) -> list[str]:
    """The `spans` action list: search[s] and answer[s] per span s, then python[...]."""
    texts = list(texts)
    listed = spans(texts, max_words)
    actions = [f"search[{s}]" for s in listed] + [f"answer[{s}]" for s in listed]
    if python:
        actions += [f"python[{code}]" for code in differences(texts)]
    return actions

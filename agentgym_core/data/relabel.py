"""Relabelled copies of demonstrations: the env's interchangeable words permuted.

An env whose dynamics do not depend on some names (BabyAI's six colours: a yellow
key opens a yellow door, and would open a blue one just the same were both blue)
declares them as classes of interchangeable words. A demonstration with one
permutation applied within each class, to every turn alike (observations and
actions), is another valid demonstration of a relabelled world. The instruction
and its priming reply, the same for every task, are kept as the agent sees them.

Why: a small student cloning a few thousand episodes may learn which names tend
to come together instead of reading the goal (told to go to the red ball, it goes
to the grey key). Copies with the names shuffled break those pairings, so only
copying the goal's words into the action fits them all. Measured once, on the
BabyAI moonshot at one seed: no gain, and the student read its goal no better
(benchmarks/results/notes/babyai-moonshot.md).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from agentgym_core.rollout.chat import PRIMING_REPLY
from agentgym_core.types import AgentTrajItem, Message


@runtime_checkable
class RelabelableEnvironment(Protocol):
    """An env that names words it treats alike (`interchangeable_words`)."""

    def interchangeable_words(self) -> Sequence[Sequence[str]]:
        """Classes of whole words whose consistent permutation keeps an episode valid."""
        ...


def check_word_classes(classes: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """The classes as tuples; a word in two classes, or a class of one, is an error."""
    seen: set[str] = set()
    out = []
    for words in classes:
        words = tuple(words)
        if len(words) < 2 or len(set(words)) != len(words):
            raise ValueError(f"a class of interchangeable words needs 2+ distinct words: {words}")
        if seen & set(words):
            raise ValueError(f"words in more than one class: {sorted(seen & set(words))}")
        if not all(re.fullmatch(r"\w+", w) for w in words):
            raise ValueError(f"interchangeable words must be single words: {words}")
        seen.update(words)
        out.append(words)
    return out


def permutation(classes: Sequence[Sequence[str]], rng: random.Random) -> dict[str, str]:
    """One random permutation within each class, as word -> replacement."""
    mapping = {}
    for words in classes:
        shuffled = list(words)
        rng.shuffle(shuffled)
        mapping.update(zip(words, shuffled, strict=True))
    return mapping


def apply_permutation(text: str, mapping: dict[str, str]) -> str:
    """`text` with each whole word of `mapping` replaced at once (a swap stays a swap)."""
    if not mapping:
        return text
    pattern = r"\b(" + "|".join(map(re.escape, mapping)) + r")\b"
    return re.sub(pattern, lambda match: mapping[match.group(1)], text)


def relabelled_items(
    items: Sequence[AgentTrajItem],
    classes: Sequence[Sequence[str]],
    copies: int,
    seed: int,
) -> list[AgentTrajItem]:
    """`copies` relabelled copies of each item, each with its own seeded permutation.

    The permutation of copy `c` of item `i` is a function of (seed, i, c) only, so a
    resumed stage trains on the same copies. Each copy records its `relabelled` mapping
    (words that moved) among the item's extra fields.
    """
    classes = check_word_classes(classes)
    out = []
    for number, item in enumerate(items):
        for copy in range(copies):
            mapping = permutation(classes, random.Random(f"{seed}:{number}:{copy}"))
            moved = {word: new for word, new in mapping.items() if word != new}
            kept = _instruction_turns(item.conversations)
            turns = [
                turn if index < kept else replace(turn, value=apply_permutation(turn.value, moved))
                for index, turn in enumerate(item.conversations)
            ]
            out.append(AgentTrajItem(item.item_id, turns, {**item.extra, "relabelled": moved}))
    return out


def _instruction_turns(turns: Sequence[Message]) -> int:
    """2 where the conversation opens with the instruction and its priming reply, else 0."""
    opens = len(turns) > 2 and turns[1].role == "gpt" and turns[1].value == PRIMING_REPLY
    return 2 if opens else 0

"""Task ids for environments whose tasks are (kind, seed) pairs.

Many environments generate a task from a kind (a level, a site, a page) and a
seed. `seeded_task_ids` lays those pairs out as integers, seed-major, so the
first ids of a split cover every kind before any kind repeats, and a split's
ids never change when more seeds are asked for. `seeded_task` decodes an id.
Test seeds start far above any train seed, so the two splits never share a task.

This module imports nothing heavy: environment plugins use it through the API.
"""

from __future__ import annotations

from typing import NamedTuple

TEST_SEED_OFFSET = 1_000_000
"""The first test seed; train seeds run from 0."""


class SeededTask(NamedTuple):
    """What a `seeded_task_ids` id stands for."""

    kind: int
    """Index into the environment's list of kinds (levels, sites)."""
    seed: int
    split: str
    """`train` or `test`."""


def seeded_task_ids(split: str, *, kinds: int, train_seeds: int, test_seeds: int) -> list[int]:
    """Ids `seed * kinds + kind` for every seed of `split`, seed-major.

    `train` has seeds 0 .. train_seeds - 1, `test` seeds TEST_SEED_OFFSET onwards.
    """
    if split == "train":
        seeds = range(train_seeds)
    elif split == "test":
        seeds = range(TEST_SEED_OFFSET, TEST_SEED_OFFSET + test_seeds)
    else:
        raise ValueError(f"unknown split {split!r}; splits: train, test")
    return [seed * kinds + kind for seed in seeds for kind in range(kinds)]


def seeded_task(task_id: int, *, kinds: int) -> SeededTask:
    """The kind, seed and split of an id from `seeded_task_ids` with the same `kinds`."""
    seed, kind = divmod(task_id, kinds)
    return SeededTask(kind, seed, "test" if seed >= TEST_SEED_OFFSET else "train")

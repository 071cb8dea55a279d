"""Tasks: one goal item each, sorted by crafting depth; splits and the crafting commands shown.

Task ids index the catalogue of every craftable item sorted by (depth, name),
so an id names the same goal whatever depths a config selects. Within each
depth, every `test_every`-th item by name is held out: test goals are items
never seen in training, at every depth.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentgym_env_textcraft.recipes import Recipe, RecipeBook

MAX_USES_PER_INGREDIENT = 10
"""Distractor candidates drawn per ingredient of the goal's tree, as the package draws them."""


@dataclass(frozen=True)
class Goal:
    """The item a task asks for and its crafting depth."""

    item: str
    depth: int


def catalogue(book: RecipeBook) -> list[Goal]:
    """Every craftable item as a goal, sorted by depth then name: index = task id."""
    goals = [Goal(item, book.depth(item)) for item in book.by_item]
    return sorted(goals, key=lambda g: (g.depth, g.item))


def split_tasks(goals: list[Goal], depths: list[int], test_every: int) -> dict[str, list[int]]:
    """Train and test task ids, interleaved across depths so any prefix covers every depth."""
    by_depth: dict[int, list[int]] = {d: [] for d in depths}
    for task, goal in enumerate(goals):
        if goal.depth in by_depth:
            by_depth[goal.depth].append(task)
    splits: dict[str, list[list[int]]] = {"train": [], "test": []}
    for depth in depths:
        ids = sorted(by_depth[depth], key=lambda t: goals[t].item)
        splits["test"].append([t for i, t in enumerate(ids) if i % test_every == test_every - 1])
        splits["train"].append([t for i, t in enumerate(ids) if i % test_every != test_every - 1])
    return {name: _round_robin(lists) for name, lists in splits.items()}


def _round_robin(lists: list[list[int]]) -> list[int]:
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def recipe_tree(book: RecipeBook, goal: str) -> list[Recipe]:
    """Every recipe that can take part in making `goal` (all alternatives), depth first, once."""
    seen: dict[str, Recipe] = {}

    def visit(name: str, path: frozenset[str]) -> None:
        if name in path:
            return
        for recipe in book.recipes_for(name):
            seen.setdefault(recipe.text, recipe)
            for ingredient in recipe.inputs:
                visit(ingredient.name, path | {name})

    visit(goal, frozenset())
    return list(seen.values())


def crafting_commands(
    book: RecipeBook, goal: str, rng: random.Random, distractors: int
) -> list[Recipe]:
    """The goal's recipe tree plus up to `distractors` recipes that use the same ingredients.

    Deterministic for a given `rng` state: every choice is made from a sorted list.
    """
    tree = recipe_tree(book, goal)
    shown = {r.text for r in tree}
    pool: dict[str, Recipe] = {}
    for recipe in tree:
        for ingredient in recipe.inputs:
            uses = {u.text: u for u in book.uses(ingredient.name) if u.text not in shown}
            names = sorted(uses)
            for text in rng.sample(names, min(len(names), MAX_USES_PER_INGREDIENT)):
                pool[text] = uses[text]
    picked = rng.sample(sorted(pool), min(len(pool), distractors))
    commands = tree + [pool[text] for text in picked]
    rng.shuffle(commands)
    return commands

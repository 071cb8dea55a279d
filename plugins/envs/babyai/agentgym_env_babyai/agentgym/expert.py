"""An expert for AgentGym's BabyAI: minigrid's BabyAIBot, told in AgentGym's macro actions.

The bot plans primitive steps; the dialect's actions are macros (`go to red
ball 1` is a path). One primitive per turn would waste the turn budget, and
the server's paths are not the bot's, so actions are matched by effect: the
bot's next steps are played out on a copy of the game, each available action
is played out on another copy, and the expert takes the action whose end state
(pose, carried object, grid) is the furthest state along the bot's course.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from agentgym_env_babyai.agentgym.view import CHECK, View
from agentgym_env_babyai.bot import new_bot

LOOKAHEAD = 40
"""Primitive steps of the bot's course to compare with (longer than any macro)."""


def state_key(game: Any) -> tuple:
    """What an action changes: the agent's pose, what it carries, the grid."""
    inner = game.unwrapped
    carrying = inner.carrying
    held = None if carrying is None else (carrying.type, carrying.color)
    grid = hashlib.md5(inner.grid.encode().tobytes()).digest()
    return (tuple(int(v) for v in inner.agent_pos), int(inner.agent_dir), held, grid)


class Expert:
    """BabyAIBot following one episode; `sync` after every primitive step the env runs."""

    def __init__(self, game: Any) -> None:
        self.game = game
        self.bot: Any = None
        self.next = 0

    def _restart(self) -> None:
        """A new bot from the current state (the bot asserts when it loses its way)."""
        self.bot = new_bot(self.game)
        self.next = self.bot.replan()

    def sync(self, primitive: int) -> None:
        """Tell the bot which primitive step was run (its own or another one)."""
        if self.bot is None:
            return
        try:
            self.next = self.bot.replan(primitive)
        except AssertionError:
            self.bot = None

    def course(self) -> list[tuple]:
        """End states after each of the bot's next primitive steps (on a copy of the game)."""
        game, bot = copy.deepcopy((self.game, self.bot))
        primitive, states = self.next, []
        for _ in range(LOOKAHEAD):
            _, _, terminated, truncated, _ = game.step(primitive)
            states.append(state_key(game))
            if terminated or truncated:
                break
            try:
                primitive = bot.replan(primitive)
            except AssertionError:
                break
        return states

    def choose(self, view: View, image: Any) -> str:
        """The available action that gets furthest along the bot's course."""
        if self.bot is None:
            try:
                self._restart()
            except AssertionError:
                return CHECK
        course = {state: index for index, state in enumerate(self.course())}
        best, best_index = None, -1
        for action, plan in view.actions.items():
            if action == CHECK or not plan:
                continue
            index = course.get(_after(self.game, plan, image), -1)
            if index > best_index:
                best, best_index = action, index
        return best or CHECK


def _after(game: Any, plan: list[int], image: Any) -> tuple:
    """The state after running `plan` as the server runs it (stopping at a refused step)."""
    game = copy.deepcopy(game)
    for primitive in plan:
        obs, _, _, _, _ = game.step(primitive)
        if not (obs["image"] != image).any():
            break
        image = obs["image"]
    return state_key(game)

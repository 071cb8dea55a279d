"""An expert for AgentGym's BabyAI: minigrid's BabyAIBot, told in AgentGym's macro actions.

The bot plans primitive steps; the dialect's actions are macros (`go to red
ball 1` is a path). One primitive per turn would waste the turn budget, and
the server's paths are not the bot's, so actions are matched by effect: the
bot's next steps are played out on a copy of the game, each available action
is played out on another copy, and the expert takes the action whose end state
(pose, carried object, grid) is the furthest state along the bot's course.

Told this way the bot solves 0.79 of AgentGym's test tasks. Where no available
action follows its course (its next step can be one no macro offers, such as
toggling an open door it faces) it asks for the action list, and where a
macro's path leaves its course it can go back and forth. With a search depth,
the expert first looks that many macros ahead for a sequence that wins, and
one further when no action follows the bot.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from agentgym_env_babyai.agentgym.view import CHECK, View, observe
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

    def __init__(self, game: Any, search_depth: int = 0) -> None:
        self.game = game
        self.bot: Any = None
        self.next = 0
        self.search_depth = search_depth

    def _restart(self) -> None:
        """A new bot from the current state (the bot asserts when it loses its way).

        Kept only once its first plan returned: a bot whose first plan failed lacks the
        state its later plans read (minigrid's `prev_carrying`).
        """
        bot = new_bot(self.game)
        self.next = bot.replan()
        self.bot = bot

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
        game, bot = copy.deepcopy((self.game, self.bot), shared_parts(self.game))
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
        """A short win's first action (with a search depth), else the bot's way.

        Else means: the available action that gets furthest along the bot's course.
        """
        if self.search_depth:
            win = first_of_win(self.game, view, image, self.search_depth)
            if win is not None:
                return win
        action = self._follow(view, image)
        if action == CHECK and self.search_depth:  # the bot is lost, or no macro follows it
            return first_of_win(self.game, view, image, self.search_depth + 1) or CHECK
        return action

    def _follow(self, view: View, image: Any) -> str:
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


def first_of_win(game: Any, view: View, image: Any, depth: int) -> str | None:
    """The first action of a shortest sequence of at most `depth` macros that wins.

    Breadth-first over copies of the game, each state expanded once; None when none wins.
    States at the last depth are only checked for a win (no view: they are not expanded).
    """
    frontier = [(game, image, view, None)]
    seen = {state_key(game)}
    for level in range(depth):
        deeper = []
        for state, state_image, state_view, first in frontier:
            for action, plan in state_view.actions.items():
                if action == CHECK or not plan:
                    continue
                after, after_image, obs, reward, terminated = _run(state, plan, state_image)
                if (terminated and reward > 0.5) or reward == 1:  # as the env ends an episode
                    return first or action
                if level == depth - 1 or (key := state_key(after)) in seen:
                    continue
                seen.add(key)
                after_view = observe(after.unwrapped, obs["image"], obs["direction"])
                deeper.append((after, after_image, after_view, first or action))
        frontier = deeper
    return None


def _run(game: Any, plan: list[int], image: Any) -> tuple[Any, Any, dict, float, bool]:
    """A copy of `game` after `plan` as the server runs it (stopping at a refused step).

    Returns the copy, its image, the last observation, the reward and the termination.
    """
    game = copy_game(game)
    for primitive in plan:
        obs, reward, terminated, _, _ = game.step(primitive)
        if not (obs["image"] != image).any():
            break
        image = obs["image"]
    return game, image, obs, float(reward), bool(terminated)


def shared_parts(game: Any) -> dict[int, Any]:
    """A deepcopy memo of what no step changes: the walls and the spaces.

    Walls are most of a level's grid objects; copies that share them cost a fraction.
    """
    inner = game.unwrapped
    shared = [cell for cell in inner.grid.grid if cell is not None and cell.type == "wall"]
    shared += [inner.observation_space, inner.action_space]
    return {id(part): part for part in shared}


def copy_game(game: Any) -> Any:
    """A copy of `game` to play ahead on, sharing the parts no step changes."""
    return copy.deepcopy(game, shared_parts(game))


def _after(game: Any, plan: list[int], image: Any) -> tuple:
    """The state after running `plan` as the server runs it (stopping at a refused step)."""
    return state_key(_run(game, plan, image)[0])

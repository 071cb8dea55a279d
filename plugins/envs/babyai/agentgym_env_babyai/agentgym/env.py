"""`babyai` with `levels: agentgym`: the environment AgentGym's BabyAI server serves.

Task ids are AgentGym's `data_idx` (level `data_idx % 40 + 1`, seed
`data_idx // 40`); observations, actions, rewards and the end of an episode
follow that server, so a checkpoint scores the same here as against it:

- reset: `Your goal: <mission>` (`then` and `after you` read `and`), the
  description, `Available actions: [...]`; every step reply ends with that list too;
- an action runs its minigrid steps until one leaves the egocentric image
  unchanged (a refused step), and the reward is that of the last step run:
  `1 - 0.9 * steps / max_steps` when it completed the mission, else 0;
- the episode ends when the reward is above 0.5 (a later success is reported,
  "The task is completed.", but does not end it, as on the server);
- an unavailable action changes nothing and answers why.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentgym_core.api import StepResult
from agentgym_env_babyai.agentgym import levels
from agentgym_env_babyai.agentgym.expert import Expert
from agentgym_env_babyai.agentgym.view import View, observe
from agentgym_env_babyai.config import BabyAIConfig
from agentgym_env_babyai.world import COLOURS

NOT_RECOGNIZED = "The action is not recognized. Please check valid actions."
COMPLETED = "\n The task is completed."
INSTRUCTION = """You are in a grid world with a goal. Each turn, answer with one action:
- turn left, turn right, move forward
- go to <obj> <id>: walk up to the object, facing it
- pickup <obj> <id>: go to the object and pick it up
- go through <door> <id>: walk onto an open door
- toggle and go through <door> <id>: open a closed door, or a locked one with the key of its colour
- toggle: open the door right in front of you
- drop: put down what you carry
- check available actions"""

CLIENT_INSTRUCTION = (
    "You are an exploration master that wants to finish every goal you are given. Every round "
    "I will give you an observation, and you have to respond an action and your thought based "
    "on the observation to finish the given task. You are placed in a room and you need to "
    "accomplish the given goal with actions.\n\nYou can use the following actions: \n\n"
    "- turn right \n\n- turn left \n\n- move forward \n\n- go to <obj> <id> \n\n"
    "- pick up <obj> <id> \n\n- go through <door> <id>: <door> must be an open door. \n\n"
    "- toggle and go through <door> <id>: <door> can be a closed door or a locked door. If you "
    "want to open a locked door, you need to carry a key that is of the same color as the "
    "locked door. \n\n- toggle: there is a closed or locked door right in front of you and you "
    "can toggle it.\nYour response should use the following format:\nThought:\n<Your Thought>"
    "\n\nAction:\n<Your Action>"
)
"""What AgentGym's BabyAI client (`agentenv.envs.babyai`) opens each conversation with."""


def client_action(text: str) -> str:
    """The action in a reply, as AgentGym's BabyAI client reads it.

    The first line after the last `Action:` (the client refuses a reply with two), with
    only letters, digits, commas and spaces kept and runs of spaces joined. A reply with
    no `Action:` is taken whole (the client would send an empty action): a model
    trained on bare actions, as cloning the expert makes one, answers that way.
    """
    found = re.findall(r"Action:\s*(.*?)(?=\n|$)", text, re.DOTALL)
    action = found[-1] if found else text
    return " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", action).split())


def action_list(actions: list[str]) -> str:
    """The server's suffix: a new line, then `Available actions: ["a", "b"]`."""
    return "\nAvailable actions: [" + ", ".join(f'"{a}"' for a in actions) + "]"


class AgentGymBabyAIEnv:
    """AgentGym's BabyAI, in-process: its 40 levels, indexing, text, actions and reward."""

    def __init__(self, config: BabyAIConfig) -> None:
        levels.quiet_level_generator()
        self.config = config
        self._games: dict[str, Any] = {}
        self.game: Any = None
        self.view = View("", {})
        self.image: np.ndarray | None = None
        self.reward = 0.0
        self.done = True
        self.goal = ""
        self._expert: Expert | None = None

    # -- tasks -------------------------------------------------------------------

    def tasks(self, split: str) -> list[int]:
        """`test`: AgentGym's 90 test ids; `train`: the other ids of seeds below `train_seeds`.

        Both keep only the configured `agentgym_levels`. `heldout`: `test_seeds`
        more ids per level, from seed 1,000,000 (never in train), for a wider eval.
        """
        chosen = self.config.level_numbers()
        if split == "test":
            return [i for i in levels.TEST_IDS if levels.level_number(i) in chosen]
        n = len(levels.LEVELS)
        if split == "train":
            test = set(levels.TEST_IDS)
            ids = (
                seed * n + number - 1
                for seed in range(self.config.train_seeds)
                for number in chosen
            )
            return [i for i in ids if i not in test]
        if split == "heldout":
            seeds = range(levels.HELDOUT_SEED, levels.HELDOUT_SEED + self.config.test_seeds)
            return [seed * n + number - 1 for seed in seeds for number in chosen]
        raise ValueError(f"unknown split {split!r}; splits: train, test, heldout")

    def task_group(self, task_id: int) -> str:
        """The level, numbered as AgentGym numbers it (`01-GoToRedBallGrey`)."""
        return f"{levels.level_number(task_id):02d}-{levels.level_name(task_id)}"

    def instruction(self) -> str:
        """The action syntax, shown once at the start of each conversation."""
        default = CLIENT_INSTRUCTION if self.config.agentgym_prompt else INSTRUCTION
        return self.config.instruction or default

    # -- episode -----------------------------------------------------------------

    @property
    def unwrapped(self) -> Any:
        """The minigrid environment."""
        return self.game.unwrapped

    def reset(self, task_id: int) -> str:
        """Draw the task's layout as AgentGym's server does; goal, description and actions."""
        name = levels.level_name(task_id)
        if name not in self._games:
            self._games[name] = levels.make_level(name)
        self.game = self._games[name]
        obs = levels.reset_level(self.game, levels.level_seed(task_id))
        self.goal = self.unwrapped.mission
        if "then" in self.goal:
            self.goal = self.goal.replace("then", "and")
        if "after you" in self.goal:
            self.goal = self.goal.replace("after you", "and")
        self.image, self.reward, self.done = obs["image"], 0.0, False
        self._expert = None
        self.view = observe(self.unwrapped, obs["image"], obs["direction"])
        return f"Your goal: {self.goal}\n{self.view.description}{action_list(self.valid_actions())}"

    def valid_actions(self) -> list[str] | None:
        """The server's available actions now (its list, in its order)."""
        return None if self.done else list(self.view.actions)

    def step(self, action: str) -> StepResult:
        """One action, answered as the server answers it."""
        if self.done:
            return StepResult("The episode is over.", 0.0, True, info={"success": True})
        if self.config.agentgym_prompt:
            action = client_action(action)
        action = action.lower().strip()
        text = self._act(action)
        suffix = action_list(list(self.view.actions)) if self.config.list_actions else ""
        return StepResult(
            text + suffix, self.reward, self.done, info={"success": self.done, "score": self.reward}
        )

    def _act(self, action: str) -> str:
        """The state text after `action`; minigrid runs only for an available action."""
        if "check" in action:
            return "You can take the following actions: " + ", ".join(self.view.actions)
        if action == "":
            return "No change in state."
        if action not in self.view.actions:
            return self.view.errors.get(action, NOT_RECOGNIZED)
        plan = self.view.actions[action]
        if not plan:
            return "No change in state."
        for primitive in plan:
            obs, reward, terminated, _, _ = self.game.step(primitive)
            if self._expert is not None:
                self._expert.sync(primitive)
            if not (obs["image"] != self.image).any():
                break  # minigrid refused this step: the rest of the plan is not run
            self.image = obs["image"]
        self.view = observe(self.unwrapped, obs["image"], obs["direction"])
        text = self.view.description + (COMPLETED if terminated else "")
        self.reward = float(reward)
        self.done = bool(terminated) and self.reward > 0.5
        if self.reward == 1 and not self.done:
            self.done, text = True, text + COMPLETED
        return text

    def expert_action(self) -> str:
        """The available action that gets furthest along minigrid's BabyAIBot's course."""
        if self._expert is None:
            self._expert = Expert(self.game, search_depth=self.config.expert_search)
        return self._expert.choose(self.view, self.image)

    def interchangeable_words(self) -> list[list[str]]:
        """The six colours: relabelled copies of expert episodes (`sft.relabel_copies`)."""
        return [list(COLOURS)]

    def render(self) -> Any:
        """Minigrid's top-down RGB frame (the agent's view highlighted), for `agentgym view`."""
        if self.game is None:
            return None
        return self.unwrapped.get_frame(highlight=True, tile_size=16)

    def close(self) -> None:
        """Close every level's minigrid environment."""
        for game in self._games.values():
            game.close()
        self._games.clear()

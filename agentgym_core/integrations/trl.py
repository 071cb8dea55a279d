"""Any installed agentgym environment as the class TRL's `environment_factory` plays.

TRL 1.16's `GRPOTrainer(environment_factory=...)` makes one instance per
rollout, calls `reset(**dataset_row)` and appends what it returns to the
prompt's last message, offers the instance's public methods to the model as
tools (rendered by the chat template), puts each tool's return in the
conversation as the tool's message, and scores the rollout with
`get_reward()`. Here `reset` starts the task the row names (`task_id`), or one
drawn from the env's train tasks; the one tool, `act(action)`, takes a step
and returns the next observation; `get_reward` is the episode's return.

    from datasets import Dataset
    from agentgym_core.integrations.trl import environment_factory, task_rows

    BabyAI = environment_factory("babyai", {"levels": ["GoToObj"]})
    dataset = Dataset.from_list(task_rows(BabyAI, "train"))
    trainer = GRPOTrainer(model=..., train_dataset=dataset, environment_factory=BabyAI, ...)

The model must write tool calls in its template's format: a tool-calling
instruct model, or one taught to by SFT first. For any model, and for
constrained decoding, `examples/trl_openenv.py`'s `rollout_func` is the other
route (docs/trl.md).
"""

from __future__ import annotations

import contextlib
import random
import threading
import weakref
from typing import Any

from pydantic import BaseModel

from agentgym_core.env_options import plugin_host, validate_env_options

__all__ = ["AgentGymToolEnv", "environment_factory", "task_rows"]

TOOL_INSTRUCTION = (
    "Act by calling the `act` tool with one action at a time; each call returns what you "
    "observe next. Stop calling it when the episode is over."
)
"""Added to the env's instruction in `task_rows`: how the episode is played here."""


class AgentGymToolEnv:
    """One rollout's environment, played through the `act` tool.

    Subclassed per environment by `environment_factory` (TRL logs the reward
    under the subclass's name). TRL offers every public method but `reset` and
    `get_reward` as a tool, so this class has no other public method: the
    environment is closed when the instance is collected.
    """

    env_name: str = ""
    registration: Any = None
    config: BaseModel | None = None
    max_steps: int | None = None
    draws: random.Random = random.Random()
    """Draws the task of a row that names none: one sequence for every instance of the class
    (seeded by `environment_factory(seed=)`), so each rollout gets the next draw."""
    draws_lock = threading.Lock()

    def __init__(self) -> None:
        self.env: Any = None
        self.task_id: int | None = None
        self.actions: list[str] = []
        self.rewards: list[float] = []
        self.done = False
        self.success: bool | None = None

    def reset(self, task_id: int | None = None, **row: Any) -> str:
        """Start the task the dataset row names (`task_id`), else a train task drawn at random.

        Returns the first observation, which TRL appends to the prompt.
        """
        env = self._environment()
        if task_id is None:
            with self.draws_lock:
                task_id = self.draws.choice(list(env.tasks("train")))
        self.task_id = int(task_id)
        self.actions, self.rewards = [], []
        self.done, self.success = False, None
        return env.reset(self.task_id)

    def act(self, action: str) -> str:
        """Take one action in the environment and see what happens.

        Args:
            action: The action to take, written as the environment's actions are (for example
                one of the actions listed in the last observation).
        """
        if self.task_id is None:
            raise RuntimeError("act before reset: TRL resets each rollout's environment first")
        if self.done:
            return "The episode is over: no action is taken. Do not call act again."
        result = self.env.step(action)
        self.actions.append(action)
        self.rewards.append(float(result.reward))
        out_of_steps = self.max_steps is not None and len(self.actions) >= self.max_steps
        self.done = bool(result.done or result.truncated or out_of_steps)
        if not self.done:
            return result.observation
        self.success = bool(result.info.get("success", result.reward > 0))
        ending = "succeeded" if self.success else "is over"
        return f"{result.observation}\n\nThe episode {ending}."

    def get_reward(self) -> float:
        """The episode's return: the sum of its rewards (TRL's reward for this rollout)."""
        return float(sum(self.rewards))

    def _environment(self) -> Any:
        """The env, built on first use and closed when this instance is collected."""
        if self.env is None:
            self.env = self.registration.factory(self.config)
            weakref.finalize(self, _close, self.env)
        return self.env


def _close(env: Any) -> None:
    with contextlib.suppress(Exception):  # nothing to tell at collection time
        env.close()


def environment_factory(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    max_steps: int | None = None,
    seed: int | None = None,
    host: Any = None,
) -> type[AgentGymToolEnv]:
    """The class TRL's `environment_factory` takes, for the installed env `name`.

    `options` is the env's config block (checked as `env:` is: a mistake is a
    ConfigError naming the key); `max_steps` ends an episode after that many
    actions (the env's own limit applies too); `seed` seeds the draw of a task
    when a row names none. Calling the class makes one rollout's environment.
    """
    registry = (host or plugin_host()).registry
    registration, config = validate_env_options(registry, name, dict(options or {}))
    class_name = "".join(part.capitalize() for part in name.replace("-", "_").split("_")) + "Env"
    return type(
        class_name,
        (AgentGymToolEnv,),
        {
            "__doc__": f"agentgym's {name!r} environment, played through the `act` tool.",
            "env_name": name,
            "registration": registration,
            "config": config,
            "max_steps": max_steps,
            "draws": random.Random(seed),
            "draws_lock": threading.Lock(),
        },
    )


def task_rows(
    env_class: type[AgentGymToolEnv],
    split: str = "train",
    *,
    instruction: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Dataset rows for GRPOTrainer, one per task of `split`: a prompt and the `task_id`.

    The prompt is a system message (the env's instruction and `TOOL_INSTRUCTION`,
    or `instruction`) and an empty user message, to which TRL appends the
    first observation `reset` returns.
    """
    env = env_class.registration.factory(env_class.config)
    try:
        ids = [int(t) for t in env.tasks(split)]
        system = instruction or f"{env.instruction()}\n\n{TOOL_INSTRUCTION}"
    finally:
        env.close()
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    return [{"prompt": prompt, "task_id": task} for task in ids[:limit]]

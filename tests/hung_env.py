"""A plugin whose environment's `step` can block forever: the run must still end.

Loaded by `agentgym` subprocesses through a `.dist-info` folder that a test
writes beside this module (see `tests/test_hung_env.py`), like any installed
plugin's entry point.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agentgym_core.api import hookimpl
from agentgym_core.types import StepResult

COLOURS = ["red", "green", "blue", "purple"]


class HungConfig(BaseModel):
    """Which steps never return."""

    model_config = ConfigDict(extra="forbid")

    hang_task: int = -1
    """The task whose steps hang (-1: any task)."""
    hang_times: int = 1
    """How many steps hang in this process (-1: every step of `hang_task`)."""
    marker: str = ""
    """A file written when a step starts hanging (tests wait for it)."""


class HungEnv:
    """Name the goal colour; the chosen steps block forever, as a wedged simulator would."""

    hangs = 0
    """Steps of this process that hung so far, over all instances."""

    def __init__(self, config: HungConfig | None = None) -> None:
        self.config = config or HungConfig()
        self.task, self.goal, self.options = 0, "red", COLOURS[:3]

    def tasks(self, split: str) -> list[int]:
        return list(range(8)) if split == "train" else list(range(100, 104))

    def instruction(self) -> str:
        return "Go to the ball of the colour named in the goal."

    def reset(self, task_id: int) -> str:
        rng = random.Random(task_id)
        self.task, self.goal = task_id, rng.choice(COLOURS)
        self.options = rng.sample(COLOURS, 3)
        if self.goal not in self.options:
            self.options[0] = self.goal
        return f"Your goal: go to the {self.goal} ball. You see: {', '.join(self.options)}."

    def step(self, action: str) -> StepResult:
        config = self.config
        if config.hang_task in (-1, self.task) and (
            config.hang_times < 0 or HungEnv.hangs < config.hang_times
        ):
            HungEnv.hangs += 1
            if config.marker:
                Path(config.marker).write_text(f"task {self.task}\n")
            threading.Event().wait()  # never set: this call never returns
        ok = action == f"go to {self.goal} ball"
        return StepResult(f"You did {action}.", float(ok), ok, info={"success": ok})

    def valid_actions(self) -> list[str]:
        return [f"go to {c} ball" for c in self.options]

    def expert_action(self) -> str:
        return f"go to {self.goal} ball"

    def task_group(self, task_id: int) -> str:
        return "even" if task_id % 2 == 0 else "odd"

    def close(self) -> None:
        pass


@hookimpl
def agentgym_register_environments(register):
    """Register `hung`."""
    register("hung", HungEnv, config=HungConfig)

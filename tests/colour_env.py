"""A small deterministic environment for unit tests of the rollout engine."""

from __future__ import annotations

import random

from agentgym_core.types import StepResult

COLORS = ["red", "green", "blue", "purple", "yellow", "grey"]


class ColourEnv:
    """A small deterministic env for unit tests of the engine: name the goal colour.

    Options: `slow_tasks` sleep before stepping, `fail_on` raises in step,
    `never_done` keeps episodes going until the horizon.
    """

    def __init__(self, slow_tasks=(), delay=0.0, fail_on=(), never_done=False, log=None):
        self.slow_tasks, self.delay = set(slow_tasks), delay
        self.fail_on, self.never_done = set(fail_on), never_done
        self.log = log if log is not None else []
        self.task = None

    def tasks(self, split):
        return list(range(50)) if split == "train" else list(range(50, 60))

    def instruction(self):
        return "Go to the ball of the colour named in the goal."

    def reset(self, task_id):
        rng = random.Random(task_id)
        self.task, self.goal = task_id, rng.choice(COLORS)
        self.options = rng.sample(COLORS, 3)
        if self.goal not in self.options:
            self.options[0] = self.goal
        return f"Your goal: go to the {self.goal} ball. You see: {', '.join(self.options)}."

    def step(self, action):
        import time

        if self.task in self.fail_on:
            raise RuntimeError(f"env crashed on task {self.task}")
        if self.task in self.slow_tasks:
            time.sleep(self.delay)
        self.log.append((self.task, time.perf_counter()))
        ok = action == f"go to {self.goal} ball"
        done = ok and not self.never_done
        return StepResult(f"You did {action}.", float(ok), done, info={"success": ok})

    def valid_actions(self):
        return [f"go to {c} ball" for c in self.options]

    def task_group(self, task_id):
        return "even" if task_id % 2 == 0 else "odd"

    def close(self):
        pass

"""`check_environment`: conformance checks for an `Environment` plugin (like Gymnasium's check_env)."""

from __future__ import annotations

import random
from typing import Any

from agentgym_core.types import StepResult


class EnvironmentCheckError(AssertionError):
    """An environment broke one rule of the protocol; the message names the rule."""


def _fail(env: Any, rule: str) -> EnvironmentCheckError:
    return EnvironmentCheckError(f"{type(env).__name__}: {rule}")


def _play(env: Any, task: int, max_steps: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    first = env.reset(task)
    if not isinstance(first, str) or not first:
        raise _fail(env, f"reset({task}) must return a non-empty str, got {first!r}")
    transcript = [first]
    for _ in range(max_steps):
        actions = env.valid_actions()
        if actions is not None and (not actions or not all(isinstance(a, str) for a in actions)):
            raise _fail(env, f"valid_actions() must be None or a non-empty list of str: {actions!r}")
        action = rng.choice(actions) if actions else "look"
        result = env.step(action)
        if not isinstance(result, StepResult):
            raise _fail(env, f"step() must return StepResult, got {type(result).__name__}")
        if not isinstance(result.observation, str):
            raise _fail(env, "StepResult.observation must be a str")
        if not isinstance(result.reward, int | float) or not isinstance(result.done, bool):
            raise _fail(env, "StepResult.reward must be a number and done a bool")
        transcript.append(f"{action}|{result.observation}|{result.reward}|{result.done}")
        if result.done:
            break
    return transcript


def check_environment(
    env: Any, *, split: str = "train", other_split: str = "test", num_tasks: int = 3,
    max_steps: int = 20, seed: int = 0,
) -> None:
    """Raise `EnvironmentCheckError` unless `env` follows the Environment protocol.

    Checks: deterministic, disjoint splits; a non-empty instruction; reset and
    step types; valid actions accepted; garbage actions answered, not raised;
    determinism of (task, actions) -> observations; reset after done; close
    idempotent.
    """
    tasks = list(env.tasks(split))
    if not tasks or tasks != list(env.tasks(split)):
        raise _fail(env, f"tasks({split!r}) must be non-empty and the same on every call")
    if set(tasks) & set(env.tasks(other_split)):
        raise _fail(env, f"splits {split!r} and {other_split!r} share task ids")
    instruction = env.instruction()
    if not isinstance(instruction, str) or not instruction.strip():
        raise _fail(env, "instruction() must be a non-empty str")
    for task in tasks[:num_tasks]:
        if not isinstance(env.task_group(task), str):
            raise _fail(env, "task_group() must return a str")
        first = _play(env, task, max_steps, seed)
        if _play(env, task, max_steps, seed) != first:
            raise _fail(env, f"task {task} is not deterministic: same actions, other observations")
        env.reset(task)
        try:
            result = env.step("xyzzy plugh 12345")
        except Exception as error:  # noqa: BLE001 - the check reports it
            raise _fail(env, f"an invalid action raised {type(error).__name__}: {error}") from error
        if not isinstance(result, StepResult) or not result.observation:
            raise _fail(env, "an invalid action must get an explanatory observation")
    env.close()
    env.close()
